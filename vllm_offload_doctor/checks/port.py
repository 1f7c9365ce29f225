"""The port vLLM will bind (`--host`, `--port`): free, or which process holds it."""

from __future__ import annotations

from vllm_offload_doctor.checks.context import Context
from vllm_offload_doctor.checks.model import CheckResult, Result
from vllm_offload_doctor.checks.registry import register


@register("port", "Port")
def check_port(ctx: Context, r: Result) -> CheckResult:
    opts = ctx.options
    try:
        state = ctx.probe.port(opts.host, opts.port)
    except OSError as exc:
        return r.skip(f"cannot test {opts.host}:{opts.port}: {exc.strerror or exc}")
    if state.free:
        return r.ok(state.describe())
    hint = " (a vLLM server may already be running)" if "vllm" in (state.process or "") else ""
    return r.fail(
        state.describe() + hint,
        remedy="Stop that process, or give vllm serve (and check) another --port.",
    )
