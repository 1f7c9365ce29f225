"""Render a `CompareReport` as text (stdout), markdown (report.md) or JSON (report.json).

`RENDERERS` is compare's registry, one `CompareRenderer` per format of
`output.formats.FORMATS["compare"]` (tests/cli/test_formats.py keeps the two equal);
`report_files` is what a run saves. Only text is coloured, through `color.paint`, as check and
analyze do.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Protocol

from vllm_offload_doctor.analyze.model import Facts
from vllm_offload_doctor.compare.model import CompareReport, CompareStatus, ModeResult, Role
from vllm_offload_doctor.compare.records import GpuDevice
from vllm_offload_doctor.output.color import paint
from vllm_offload_doctor.output.formats import OutputFormat

ICON = {
    CompareStatus.EFFECTIVE: "OK",
    CompareStatus.IGNORED: "IGNORED",
    CompareStatus.FAILED: "FAILED",
    CompareStatus.INCONCLUSIVE: "INCONCLUSIVE",
}
STYLE = {
    CompareStatus.EFFECTIVE: ("green", "bold"),
    CompareStatus.IGNORED: ("red", "bold"),
    CompareStatus.FAILED: ("red", "bold"),
    CompareStatus.INCONCLUSIVE: ("yellow", "bold"),
}


def _v(x: float | int | str | None, unit: str = "", nd: int = 2) -> str:
    if x is None or x == "":
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}{unit}"
    return f"{x}{unit}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.0f} ms"


def _facts(m: ModeResult) -> Facts:
    return m.log_facts or Facts()


def column(m: ModeResult) -> str:
    head = f"offload {m.label.removesuffix('-fix')} GiB"
    if m.role == Role.VERIFY_FIX and m.env:
        head += " + " + " ".join(f"{k}={v}" for k, v in m.env.items())
    return head


Cell = Callable[[ModeResult], str]


def _rows() -> list[tuple[str, Cell]]:
    def lat(m: ModeResult) -> dict[str, float | None]:
        la = m.latency
        if la is None:
            return {}
        return {"median": la.median_s, "p95": la.p95_s, "min": la.min_s}

    return [
        ("status", lambda m: str(m.status)),
        (
            "vLLM version",
            lambda m: _v((m.served and m.served.server_version) or _facts(m).vllm_version),
        ),
        ("model runner", lambda m: _v(_facts(m).model_runner)),
        ("startup", lambda m: _v(m.startup_s, " s", 1)),
        ("offloader", lambda m: _v(_facts(m).offloader)),
        ("CPU offloaded (log)", lambda m: _v(_facts(m).offloaded_gib, " GiB")),
        ("Model loading took", lambda m: _v(_facts(m).model_loading_gib, " GiB")),
        ("KV cache", lambda m: _v(_facts(m).kv_cache_gib, " GiB")),
        ("KV cache tokens", _tokens),
        ("GPU used (device)", _gpu_device),
        ("GPU (process tree)", _gpu_tree),
        (
            "host RSS (tree)",
            lambda m: _v(m.served.host_rss.total_mib if m.served else None, " MiB", 0),
        ),
        ("latency median", lambda m: _ms(lat(m).get("median"))),
        ("latency p95", lambda m: _ms(lat(m).get("p95"))),
        ("latency min", lambda m: _ms(lat(m).get("min"))),
        ("tokens/s", lambda m: _v(m.latency.tokens_per_s if m.latency else None, "", 1)),
    ]


def rows(report: CompareReport) -> tuple[list[str], list[list[str]]]:
    """The side-by-side table: a header (one column per mode) and rows."""
    modes = report.modes
    header = ["", *[column(m) for m in modes]]
    table = [[name, *[fn(m) for m in modes]] for name, fn in _rows()]
    if any(m.host_memory for m in modes):  # sampled every second from launch to stop
        at = next(i for i, r in enumerate(table) if r[0] == "host RSS (tree)") + 1
        hosts = [m.host_memory for m in modes]
        table[at:at] = [
            ["host RSS peak", *[_v(h.peak_rss_gib, " GiB") if h else "-" for h in hosts]],
            [
                "host available min",
                *[f"{h.min_available_gib:.2f}/{h.total_gib:g} GiB" if h else "-" for h in hosts],
            ],
            [
                "host RSS / offloaded GiB",
                *[_v(h.rss_per_offloaded_gib) if h else "-" for h in hosts],
            ],
        ]
    if any(m.latency and m.latency.ttft_median_s for m in modes):
        table.append(
            ["TTFT median", *[_ms(m.latency.ttft_median_s if m.latency else None) for m in modes]]
        )
        table.append(
            [
                "ITL median",
                *[_v(m.latency.itl_median_ms if m.latency else None, " ms", 1) for m in modes],
            ]
        )
    table.append(["requests ok", *[_reqs(m) for m in modes]])
    table.append(["answers", *[_answers(m) for m in modes]])
    ranks = sorted({r for m in modes for r in _facts(m).ranks})
    if len(ranks) > 1:
        for r in ranks:

            def rank(m: ModeResult, r: str = r) -> tuple[float | None, float | None]:
                rf = _facts(m).ranks.get(r)
                return (rf.offloaded_gib, rf.model_loading_gib) if rf else (None, None)

            table.append([f"{r} offloaded", *[_v(rank(m)[0], " GiB") for m in modes]])
            table.append([f"{r} loading", *[_v(rank(m)[1], " GiB") for m in modes]])
    return header, table


def _tokens(m: ModeResult) -> str:
    t = _facts(m).kv_cache_tokens
    if t is None and m.served and m.served.metrics:
        t = m.served.metrics.kv_cache_tokens
    return "-" if t is None else f"{t:,}"


def _devices(m: ModeResult) -> tuple[GpuDevice, ...] | None:
    g = m.gpu
    return None if g is None or not g.available else g.devices


def _gpu_device(m: ModeResult) -> str:
    g = m.gpu
    if g is None:
        return "-"
    if not g.available:
        return "n/a (no NVML)"
    return ", ".join(f"GPU{d.index} {d.used_mib}/{d.total_mib} MiB" for d in g.server_devices())


def _gpu_tree(m: ModeResult) -> str:
    devs = _devices(m)
    if devs is None:
        return "-"
    parts = [f"GPU{d.index} {d.tree_used_mib} MiB" for d in devs if d.tree_processes]
    return ", ".join(parts) or "not visible"


def _reqs(m: ModeResult) -> str:
    la = m.latency
    return "-" if la is None else f"{la.ok}/{la.n}"


def _answers(m: ModeResult) -> str:
    if m.served is None or not m.served.answers:
        return "-"
    top = m.served.answers[0].answer.strip().replace("\n", " ")
    top = top if len(top) <= 24 else top[:21] + "..."
    am = m.served.answers_matched
    match = f" ({am.matched}/{am.checked} match)" if am.checked else ""
    return f"{top!r}{match}"


def _table_text(header: list[str], table: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    return "\n".join(lines)


def render_text(report: CompareReport, out_dir: str | None = None, *, color: bool = False) -> str:
    v = report.verdict.finding
    header, table = rows(report)
    lines = [_table_text(header, table), ""]
    verdict = f"Verdict: {ICON[v.status]} {v.title or v.status}"
    lines.append(paint(verdict, *STYLE[v.status], color=color))
    lines += [f"  {s}" for s in v.summary.splitlines()]
    if v.remedy:
        lines.append(f"  Fix: {v.remedy}")
    lines += [f"  See: {link}" for link in v.links]
    lines += [f"  Note: {n}" for n in v.notes]
    lines += [f"  Preflight: {ln}" for ln in (report.preflight or {}).get("lines", [])]
    if report.config.exposed:
        lines.append(f"  Warning: {report.config.exposed}")
    if out_dir:
        lines.append(f"Artifacts: {out_dir}")
    return "\n".join(lines) + "\n"


def render_markdown(
    report: CompareReport, out_dir: str | None = None, *, color: bool = False
) -> str:
    v = report.verdict.finding
    cfg = report.config
    header, table = rows(report)
    out = ["# offload-doctor compare", ""]
    if report.interrupted:
        out += ["> **Interrupted**: partial report.", ""]
    elif not report.complete:
        out += ["> Run not finished: partial report.", ""]
    out += [f"**Verdict: `{v.status}`** - {v.title}", ""]
    out += [
        line + "  " if i < len(v.summary.splitlines()) - 1 else line
        for i, line in enumerate(v.summary.splitlines() or [""])
    ]
    out.append("")
    if v.remedy:
        out += [f"**Fix:** {v.remedy}", ""]
    out += [f"- {link}" for link in v.links]
    if v.links:
        out.append("")
    for n in v.notes:
        out += [f"> {n}", ""]
    pre = (report.preflight or {}).get("lines", [])
    if pre:
        out += ["## Preflight", ""] + [f"- {ln}" for ln in pre] + [""]
    out += ["## Side by side", ""]
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "---|" * len(header))
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in table]
    out += ["", "## Setup", ""]
    out.append(
        f"- model: `{cfg.model}` served as `{cfg.served_model_name}`"
        + (f", revision `{cfg.revision}`" if cfg.revision else "")
    )
    out.append(f"- requests: {cfg.warmup} warm-up + {cfg.repeats} measured, stream={cfg.stream}")
    if cfg.exposed:
        out.append(f"- **exposed:** {cfg.exposed}")
    if (cfg.tensor_parallel_size or 1) > 1:
        out.append(
            f"- tensor parallel size {cfg.tensor_parallel_size}: "
            "--cpu-offload-gb is a budget per GPU"
        )
    if report.environment:
        out.append(
            "- environment: " + ", ".join(f"`{k}={val}`" for k, val in report.environment.items())
        )
    out += ["", "## Commands", ""]
    for m in report.modes:
        env = "".join(f"{k}={val} " for k, val in (m.env or {}).items())
        out.append(f"- {column(m)} (log `{m.log}`):")
        out.append(f"  `{env}{' '.join(m.command)}`")
    return "\n".join(out) + "\n"


def render_json(report: CompareReport, out_dir: str | None = None, *, color: bool = False) -> str:
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n"


class CompareRenderer(Protocol):
    """A `compare` format: the report for stdout; `out_dir` is named under the text verdict."""

    def __call__(
        self, report: CompareReport, out_dir: str | None = None, *, color: bool = False
    ) -> str: ...


# One per format of output.formats.FORMATS["compare"] (tests/cli/test_formats.py).
RENDERERS: dict[OutputFormat, CompareRenderer] = {
    OutputFormat.TEXT: render_text,
    OutputFormat.JSON: render_json,
    OutputFormat.MARKDOWN: render_markdown,
}


def report_files(report: CompareReport) -> dict[str, str]:
    """The report as the run folder keeps it, rewritten after every step of a run."""
    from vllm_offload_doctor.compare.html import render_compare_html

    return {
        "report.json": render_json(report).removesuffix("\n"),  # saved without the last newline
        "report.md": render_markdown(report),
        "report.html": render_compare_html(report),
    }
