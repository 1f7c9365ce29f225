"""Operating system and WSL.

`os`: vLLM runs on Linux only. Native Windows and macOS fail: use WSL2 or a Linux machine.

`wsl`: under WSL2, vLLM keeps pinned memory off unless `VLLM_WSL2_ENABLE_PIN_MEMORY=1` (vLLM 0.24+),
so offloaded weights are copied to the GPU on every forward pass with no log line saying so. Before
0.17 offload stops outright without pinned memory; WSL1 has no GPU at all; kernels below 4.19.121
turn pinned memory off. With pinning on, Windows caps pinned memory near half of physical RAM, so
offloading more than half of what WSL sees is named as a risk.
"""

from __future__ import annotations

from packaging.version import Version

from vllm_offload_doctor.checks.context import GIB, Context, gib
from vllm_offload_doctor.checks.model import CheckResult, Result
from vllm_offload_doctor.checks.registry import register
from vllm_offload_doctor.links import DOCS_GPU, DOCS_MEMORY, DOCS_WSL

_UPGRADE = "Upgrade vLLM to 0.28 or later and set VLLM_WSL2_ENABLE_PIN_MEMORY=1."


@register("os", "Operating system")
def check_os(ctx: Context, r: Result) -> CheckResult:
    p = ctx.platform
    if p.system == "Linux":
        return r.ok(f"Linux {p.release} ({p.machine})")
    if p.system == "Windows":
        return r.fail(
            "native Windows: vLLM does not run on Windows",
            remedy="Run vLLM inside WSL2 (Ubuntu) with the NVIDIA driver for WSL.",
            links=(DOCS_WSL,),
        )
    if p.system == "Darwin":
        return r.fail(
            "macOS: no CUDA, so no GPU weight offloading",
            remedy="Use a Linux machine with an NVIDIA GPU.",
            links=(DOCS_GPU,),
        )
    return r.fail(
        f"{p.system or 'unknown system'}: vLLM needs Linux", remedy="Use Linux with an NVIDIA GPU."
    )


def kernel_tuple(release: str) -> tuple[int, ...]:
    nums: list[int] = []
    for part in release.split("-")[0].split("."):
        if not part.isdigit():
            break
        nums.append(int(part))
    return tuple(nums)


@register("wsl", "WSL")
def check_wsl(ctx: Context, r: Result) -> CheckResult:
    p = ctx.platform
    if p.system != "Linux":
        return r.skip("not Linux")
    if not p.vllm_sees_wsl:
        if p.wsl_markers:
            return r.warn(
                "WSL markers found but the kernel name lacks 'microsoft': vLLM will treat "
                "this as native Linux and may try pinned memory where WSL limits it",
                (f"markers: {', '.join(p.wsl_markers)}", f"kernel: {p.release}"),
            )
        return r.ok("native Linux, not WSL: pinned memory available")

    kernel = kernel_tuple(p.release)
    details = (f"kernel: {p.release}", *(f"marker: {m}" for m in p.wsl_markers))
    if "wsl2" not in p.release.lower() and kernel < (4, 19):
        return r.fail(
            "WSL1: no GPU access",
            details,
            remedy="Convert the distribution to WSL2: `wsl --set-version <distro> 2`.",
            links=(DOCS_WSL,),
        )
    version = ctx.vllm_version
    links = (DOCS_MEMORY,)
    if version is not None and version < Version("0.17"):
        return r.fail(
            f"WSL2 with vLLM {version}: pinned memory is off under WSL, and before 0.17 CPU "
            "offload then stops with 'V1 CPU offloading requires uva (pin memory) support'",
            details,
            remedy=_UPGRADE,
            links=links,
        )
    if version is not None and version < Version("0.24"):
        return r.warn(
            f"WSL2 with vLLM {version}: pinned memory is always off under WSL, so offloaded "
            "weights are copied to the GPU on every forward pass (slow, and no log line says so)",
            details,
            remedy=_UPGRADE,
            links=links,
        )
    if kernel < (4, 19, 121):
        return r.warn(
            f"WSL2 kernel {p.release} is below 4.19.121: vLLM turns pinned memory off, so "
            "offloaded weights take the slow copy path on every forward pass",
            details,
            remedy="Run `wsl --update` in Windows, then `wsl --shutdown`.",
            links=links,
        )
    if ctx.environ.get("VLLM_WSL2_ENABLE_PIN_MEMORY") != "1":
        return r.warn(
            "WSL2: pinned memory is off by default (vLLM >= 0.24) unless "
            "VLLM_WSL2_ENABLE_PIN_MEMORY=1, so offloaded weights are copied on every forward "
            "pass with no log line",
            details,
            remedy="export VLLM_WSL2_ENABLE_PIN_MEMORY=1",
            links=links,
        )
    return _wsl_pinned_cap(ctx, r, details)


def _wsl_pinned_cap(ctx: Context, r: Result, details: tuple[str, ...]) -> CheckResult:
    """Windows (WDDM) caps pinned memory system-wide at about half of *physical* RAM.

    WSL only sees its VM's memory, by default itself half of physical RAM, so the cap is at
    least half of what WSL sees and, with default settings, about all of it: above half is
    a risk to name, not a certain failure.
    """
    opts = ctx.options
    total = ctx.host_memory.total
    pinned = opts.offload_gb * opts.tensor_parallel_size * GIB
    details = (
        *details,
        f"Windows caps pinned memory near half of physical RAM; WSL sees {gib(total)}, "
        "and by default WSL gets half of physical RAM",
    )
    if pinned > total / 2:
        return r.warn(
            f"WSL2: {gib(pinned)} to pin may exceed Windows' pinned-memory cap "
            "(about half of physical RAM)",
            details,
            remedy="If loading fails or stalls, offload less, or add RAM to the Windows host.",
            links=(DOCS_MEMORY,),
        )
    return r.ok(
        "WSL2 with VLLM_WSL2_ENABLE_PIN_MEMORY=1: pinned memory on "
        "(Windows caps it near half of physical RAM)",
        details,
        links=(DOCS_MEMORY,),
    )
