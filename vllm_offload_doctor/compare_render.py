"""Render a `compare` report (the report.json dict) as text for stdout and as report.md."""

from __future__ import annotations

from typing import Any

ICON = {"effective": "OK", "ignored": "IGNORED", "failed": "FAILED", "inconclusive": "INCONCLUSIVE"}


def _v(x: Any, unit: str = "", nd: int = 2) -> str:
    if x is None or x == "":
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}{unit}"
    return f"{x}{unit}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.0f} ms"


def rows(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The side-by-side table: a header (one column per mode) and rows."""
    modes = report.get("modes", [])
    header = ["", *[f"offload {m['label']} GiB" for m in modes]]
    table: list[list[str]] = []

    def row(name: str, fn: Any) -> None:
        table.append([name, *[fn(m) for m in modes]])

    def facts(m: dict[str, Any]) -> dict[str, Any]:
        return m.get("log_facts") or {}

    row("status", lambda m: m.get("status", "-"))
    row("vLLM version", lambda m: _v(m.get("server_version") or facts(m).get("vllm_version")))
    row("model runner", lambda m: _v(facts(m).get("model_runner")))
    row("startup", lambda m: _v(m.get("startup_s"), " s", 1))
    row("offloader", lambda m: _v(facts(m).get("offloader")))
    row("CPU offloaded (log)", lambda m: _v(facts(m).get("offloaded_gib"), " GiB"))
    row("Model loading took", lambda m: _v(facts(m).get("model_loading_gib"), " GiB"))
    row("KV cache", lambda m: _v(facts(m).get("kv_cache_gib"), " GiB"))
    row("KV cache tokens", lambda m: _tokens(m))
    row("GPU used (device)", _gpu_device)
    row("GPU (process tree)", _gpu_tree)
    row("host RSS (tree)", lambda m: _v((m.get("host_rss") or {}).get("total_mib"), " MiB", 0))
    row("latency median", lambda m: _ms((m.get("latency") or {}).get("median_s")))
    row("latency p95", lambda m: _ms((m.get("latency") or {}).get("p95_s")))
    row("latency min", lambda m: _ms((m.get("latency") or {}).get("min_s")))
    row("tokens/s", lambda m: _v((m.get("latency") or {}).get("tokens_per_s"), "", 1))
    if any((m.get("latency") or {}).get("ttft_median_s") for m in modes):
        row("TTFT median", lambda m: _ms((m.get("latency") or {}).get("ttft_median_s")))
        row("ITL median", lambda m: _v((m.get("latency") or {}).get("itl_median_ms"), " ms", 1))
    row("requests ok", lambda m: _reqs(m))
    row("answers", _answers)
    ranks = sorted({r for m in modes for r in (facts(m).get("ranks") or {})})
    if len(ranks) > 1:
        for r in ranks:
            row(
                f"{r} offloaded",
                lambda m, r=r: _v(
                    ((facts(m).get("ranks") or {}).get(r) or {}).get("offloaded_gib"), " GiB"
                ),
            )
            row(
                f"{r} loading",
                lambda m, r=r: _v(
                    ((facts(m).get("ranks") or {}).get(r) or {}).get("model_loading_gib"), " GiB"
                ),
            )
    return header, table


def _tokens(m: dict[str, Any]) -> str:
    t = (m.get("log_facts") or {}).get("kv_cache_tokens") or (m.get("metrics") or {}).get(
        "kv_cache_tokens"
    )
    return "-" if t is None else f"{t:,}"


def _gpu_device(m: dict[str, Any]) -> str:
    g = m.get("gpu") or {}
    if not g:
        return "-"
    if not g.get("available"):
        return "n/a (no NVML)"
    devs = [d for d in g.get("devices", []) if d.get("tree_processes")] or g.get("devices", [])
    return ", ".join(f"GPU{d['index']} {d.get('used_mib')}/{d.get('total_mib')} MiB" for d in devs)


def _gpu_tree(m: dict[str, Any]) -> str:
    g = m.get("gpu") or {}
    if not g or not g.get("available"):
        return "-"
    parts = [
        f"GPU{d['index']} {d.get('tree_used_mib')} MiB"
        for d in g.get("devices", [])
        if d.get("tree_processes")
    ]
    return ", ".join(parts) or "not visible"


def _reqs(m: dict[str, Any]) -> str:
    lat = m.get("latency") or {}
    return "-" if not lat else f"{lat.get('ok')}/{lat.get('n')}"


def _answers(m: dict[str, Any]) -> str:
    ans = m.get("answers") or []
    if not ans:
        return "-"
    top = ans[0]["answer"].strip().replace("\n", " ")
    top = top if len(top) <= 24 else top[:21] + "..."
    am = m.get("answers_matched") or {}
    match = f" ({am.get('matched')}/{am.get('checked')} match)" if am.get("checked") else ""
    return f"{top!r}{match}"


def _table_text(header: list[str], table: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    return "\n".join(lines)


def render_text(report: dict[str, Any], out_dir: str | None = None) -> str:
    v = report.get("verdict") or {}
    header, table = rows(report)
    lines = [_table_text(header, table), ""]
    lines.append(
        f"Verdict: {ICON.get(v.get('status', ''), '?')} {v.get('title') or v.get('status')}"
    )
    if v.get("summary"):
        lines.append(f"  {v['summary']}")
    if v.get("remedy"):
        lines.append(f"  Fix: {v['remedy']}")
    lines += [f"  See: {link}" for link in v.get("links") or []]
    lines += [f"  Note: {n}" for n in v.get("notes") or []]
    if out_dir:
        lines.append(f"Artifacts: {out_dir}")
    return "\n".join(lines) + "\n"


def render_markdown(report: dict[str, Any]) -> str:
    v = report.get("verdict") or {}
    cfg = report.get("config") or {}
    header, table = rows(report)
    out = ["# offload-doctor compare", ""]
    status = v.get("status", "?")
    if report.get("interrupted"):
        out += ["> **Interrupted**: partial report.", ""]
    elif not report.get("complete"):
        out += ["> Run not finished: partial report.", ""]
    out += [f"**Verdict: `{status}`** - {v.get('title') or ''}", "", v.get("summary") or "", ""]
    if v.get("remedy"):
        out += [f"**Fix:** {v['remedy']}", ""]
    out += [f"- {link}" for link in v.get("links") or []]
    if v.get("links"):
        out.append("")
    for n in v.get("notes") or []:
        out.append(f"> {n}")
        out.append("")
    out += ["## Side by side", ""]
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "---|" * len(header))
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in table]
    out += ["", "## Setup", ""]
    out.append(
        f"- model: `{cfg.get('model')}` served as `{cfg.get('served_model_name')}`"
        + (f", revision `{cfg['revision']}`" if cfg.get("revision") else "")
    )
    out.append(
        f"- requests: {cfg.get('warmup')} warm-up + {cfg.get('repeats')} measured, "
        f"stream={cfg.get('stream')}"
    )
    if cfg.get("tensor_parallel_size", 1) > 1:
        out.append(
            f"- tensor parallel size {cfg['tensor_parallel_size']}: "
            "--cpu-offload-gb is a budget per GPU"
        )
    env = report.get("environment") or {}
    if env:
        out.append("- environment: " + ", ".join(f"`{k}={val}`" for k, val in env.items()))
    out += ["", "## Commands", ""]
    for m in report.get("modes", []):
        out.append(f"- offload {m['label']} GiB (log `{m.get('log')}`):")
        out.append(f"  `{' '.join(m.get('command', []))}`")
    return "\n".join(out) + "\n"
