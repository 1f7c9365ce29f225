"""Text, JSON and Markdown for `inspect` results."""

from __future__ import annotations

import json
import shlex
from typing import Protocol

from vllm_offload_doctor.inspect.model import Inspection, Verdict
from vllm_offload_doctor.output.formats import SCHEMA_VERSION, OutputFormat
from vllm_offload_doctor.redact import scrub_argv

HEADLINE = {
    Verdict.EFFECTIVE: "offload is IN EFFECT",
    Verdict.IGNORED: "offload was requested but is IGNORED",
    Verdict.NOT_REQUESTED: "offload is not requested",
    Verdict.CANNOT_TELL: "cannot tell whether offload is in effect",
}


def _lines(ins: Inspection) -> list[tuple[str, str]]:
    s = ins.server
    rows: list[tuple[str, str]] = []
    if s.pid is not None:
        rows.append(("server", f"pid {s.pid}" + (f", model {s.model}" if s.model else "")))
    if s.cmdline:
        rows.append(("command", shlex.join(scrub_argv(s.cmdline))))
    if s.offload_gb is not None:
        rows.append(("requested", f"--cpu-offload-gb {s.offload_gb:g} per rank, TP {s.tp}"))
    if s.vllm_version:
        rows.append(("vLLM", f"{s.vllm_version} (from {s.version_source})"))
    env = ", ".join(f"{k}={v}" for k, v in s.runner_env.items()) or "none set"
    rows.append(("runner env", env if not s.environ_error else f"unreadable: {s.environ_error}"))
    for r in ins.ranks:
        shm = f"{r.shmem_gib:.2f} GiB shared" if r.shmem_gib is not None else "unreadable"
        gpu = f", GPU {r.gpu_gib:.1f} GiB" if r.gpu_gib is not None else ""
        rows.append((f"rank {r.process}", f"pid {r.pid}: {shm}{gpu} -> {r.verdict.value}"))
    if ins.host_held_gib is not None and ins.verdict is Verdict.EFFECTIVE:
        rows.append(("host memory", f"offload holds {ins.host_held_gib:.2f} GiB"))
    if ins.host_available_gib is not None:
        rows.append(("host left", f"{ins.host_available_gib:.2f} GiB available"))
    if ins.per_token_ms is not None:
        rows.append(("cost", f">= {ins.per_token_ms:.2f} ms per forward pass ({ins.link})"))
    if s.http:
        h = s.http
        got = []
        if h.models:
            got.append("models " + ", ".join(h.models))
        if h.version:
            got.append(f"version {h.version}")
        if h.kv_cache_tokens is not None:
            got.append(f"KV cache {h.kv_cache_tokens:,} tokens")
        got.extend(h.errors)
        rows.append(("http", f"{h.base_url}: " + ("; ".join(got) or "no answer")))
    return rows


def render_text(results: list[Inspection]) -> str:
    out = []
    for ins in results:
        out.append(f"{ins.verdict.value.upper()}: {HEADLINE[ins.verdict]}")
        out.append(f"  why: {ins.reason}")
        if ins.fix:
            out.append(f"  fix: {ins.fix}")
        out.extend(f"  {k}: {v}" for k, v in _lines(ins))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def render_json(results: list[Inspection]) -> str:
    items = []
    for ins in results:
        d = ins.to_dict()
        d["server"]["cmdline"] = scrub_argv(ins.server.cmdline)
        items.append(d)
    return json.dumps({"schema_version": SCHEMA_VERSION, "servers": items}, indent=2) + "\n"


def render_markdown(results: list[Inspection]) -> str:
    out = []
    for ins in results:
        out.append(f"## `{ins.verdict.value}`: {HEADLINE[ins.verdict]}\n")
        out.append(f"{ins.reason}\n")
        if ins.fix:
            out.append(f"**Fix:** {ins.fix}\n")
        out.append("| | |\n|---|---|")
        out.extend(f"| {k} | {v.replace('|', '/')} |" for k, v in _lines(ins))
        out.append("")
    return "\n".join(out)


class InspectRenderer(Protocol):
    """An `inspect` format: one section per server inspected."""

    def __call__(self, results: list[Inspection]) -> str: ...


# One per format of output.formats.FORMATS["inspect"] (tests/cli/test_formats.py).
RENDERERS: dict[OutputFormat, InspectRenderer] = {
    OutputFormat.TEXT: render_text,
    OutputFormat.JSON: render_json,
    OutputFormat.MARKDOWN: render_markdown,
}
