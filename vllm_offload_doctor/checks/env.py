"""The environment variables that change offloading.

`VLLM_USE_V2_MODEL_RUNNER` (1 selects the runner that ignores offload before 0.28.0, 0 is the
workaround), `VLLM_WEIGHT_OFFLOADING_DISABLE_UVA` and `..._DISABLE_PIN_MEMORY` (slower copies),
`VLLM_WSL2_ENABLE_PIN_MEMORY`, `CUDA_VISIBLE_DEVICES` (empty or -1 hides every GPU) and
`PYTORCH_CUDA_ALLOC_CONF`. vLLM fails to parse a flag that is not 0 or 1. Every other `VLLM_*`
variable is listed in the details; values of secret-looking names are never shown.
"""

from __future__ import annotations

from vllm_offload_doctor.checks.context import Context
from vllm_offload_doctor.checks.model import CheckResult, Result, Status, worst
from vllm_offload_doctor.checks.registry import register
from vllm_offload_doctor.redact import is_secret_name, redact

ENV_VARS = (
    "VLLM_USE_V2_MODEL_RUNNER",
    "VLLM_WEIGHT_OFFLOADING_DISABLE_UVA",
    "VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY",
    "VLLM_WSL2_ENABLE_PIN_MEMORY",
    "CUDA_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF",
)
_FLAGS = ENV_VARS[:4]


def env_effect(name: str, value: str, wsl: bool) -> tuple[Status, str]:
    """What one environment variable does to offloading."""
    flag = value.strip()
    if name in _FLAGS and flag not in ("0", "1"):
        return Status.FAIL, f"must be 0 or 1; vLLM fails to parse {value!r}"
    on = flag == "1"
    if name == "VLLM_USE_V2_MODEL_RUNNER":
        return Status.OK, (
            "forces Model Runner V2 (ignores offload before 0.28.0)"
            if on
            else "forces Model Runner V1 (the workaround for 0.12-0.27.1)"
        )
    if name == "VLLM_WEIGHT_OFFLOADING_DISABLE_UVA":
        if on:
            return Status.WARN, "UVA off: offloaded weights are copied to the GPU every pass (slow)"
        return Status.OK, "UVA allowed (default)"
    if name == "VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY":
        if on:
            return (
                Status.WARN,
                "pinned memory off: offloaded weights sit in pageable memory (slower)",
            )
        return Status.OK, "pinned memory allowed (default)"
    if name == "VLLM_WSL2_ENABLE_PIN_MEMORY":
        effect = (
            "pinned memory on under WSL2 (vLLM >= 0.24)" if on else "pinned memory off under WSL2"
        )
        return Status.OK, effect if wsl else f"{effect}; no effect outside WSL"
    if name == "CUDA_VISIBLE_DEVICES":
        if flag in ("", "-1"):
            return Status.FAIL, "hides every GPU"
        return Status.OK, "vLLM sees only these GPUs, in this order"
    return Status.OK, "CUDA caching allocator settings"


@register("env", "Environment")
def check_env(ctx: Context, r: Result) -> CheckResult:
    env = ctx.environ
    wsl = ctx.platform.vllm_sees_wsl
    results = [
        (name, env[name], *env_effect(name, env[name], wsl)) for name in ENV_VARS if name in env
    ]
    details = [f"{n}={_shown(n, v)}: {effect}" for n, v, _, effect in results]
    others = sorted(k for k in env if k.startswith("VLLM_") and k not in ENV_VARS)
    details.extend(f"{k}={_shown(k, env[k])}" for k in others)
    flagged = [f"{n}: {effect}" for n, _, s, effect in results if s is not Status.OK]
    if flagged:
        message = "; ".join(flagged)
    elif results:
        message = "set: " + ", ".join(f"{n}={_shown(n, v)}" for n, v, _, _ in results)
    else:
        message = "none of the variables that change offloading is set"
    return r.make(
        worst(*(s for _, _, s, _ in results)),
        message,
        details,
        remedy="Unset or correct the variables named above." if flagged else "",
    )


def _shown(name: str, value: str) -> str:
    return "***" if is_secret_name(name) else redact(value)
