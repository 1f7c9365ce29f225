"""The NVIDIA driver and every GPU.

`nvml`: the driver answers through NVML, finds at least one GPU, and `CUDA_VISIBLE_DEVICES` leaves
as many visible as `--tensor-parallel-size` asks for.

`gpu[N]`: one result per GPU. Fails below compute capability 7.5 (no kernels in current vLLM), warns
on 7.x (no bfloat16), on MIG, and on an unknown capability. On the GPUs vLLM will use, free memory
must cover `--gpu-memory-utilization` x total at start-up (the holders are named). The PCIe link is
what offloaded weights cross on every forward pass: its bandwidth, a narrowed link, and with
`--offload-gb` the least time per step it costs.
"""

from __future__ import annotations

import math

from vllm_offload_doctor.checks.context import Context, gib, visible_indices
from vllm_offload_doctor.checks.model import CheckResult, Result, Status, worst
from vllm_offload_doctor.checks.registry import register
from vllm_offload_doctor.links import DOCS_GPU
from vllm_offload_doctor.machine.pcie import PRACTICAL_FRACTION, link_bandwidth_gbs, step_cost_ms
from vllm_offload_doctor.machine.probes import GpuInfo

Problem = tuple[Status, str, str]  # status, problem, remedy


@register("nvml", "NVIDIA driver (NVML)")
def check_nvml(ctx: Context, r: Result) -> CheckResult:
    info = ctx.nvml
    if info.error:
        remedy = (
            "pip install nvidia-ml-py"
            if "pynvml" in info.error
            else "Install the NVIDIA driver until `nvidia-smi` works; in a container, start it "
            "with `--gpus all` (NVIDIA Container Toolkit)."
        )
        return r.fail(f"no usable NVIDIA driver: {info.error}", remedy=remedy, links=(DOCS_GPU,))
    details = [
        f"driver {info.driver_version}",
        f"CUDA driver API {info.cuda_driver_version or 'unknown'}",
    ]
    driver = f"driver {info.driver_version}, CUDA {info.cuda_driver_version or 'unknown'}"
    if not info.gpus:
        return r.fail(
            f"{driver} loaded, but NVML finds no NVIDIA GPU",
            details,
            remedy="Check that the GPU is passed through (VM/container).",
        )
    cvd = ctx.environ.get("CUDA_VISIBLE_DEVICES")
    order = visible_indices(cvd, len(info.gpus))
    visible = len(order) if order is not None else len((cvd or "").split(","))
    if cvd is not None:
        details.append(f"CUDA_VISIBLE_DEVICES={cvd}: {visible} of {len(info.gpus)} GPUs visible")
    tp = ctx.options.tensor_parallel_size
    if visible < max(tp, 1):
        return r.fail(
            f"{driver}; --tensor-parallel-size {tp} needs {tp} GPU(s), {visible} visible",
            details,
            remedy="Lower --tensor-parallel-size or fix CUDA_VISIBLE_DEVICES.",
        )
    used = f", using {tp}" if tp > 1 or visible > 1 else ""
    return r.ok(f"{driver}, {len(info.gpus)} GPU(s){used}", details)


@register("gpu", "GPUs")
def check_gpus(ctx: Context, r: Result) -> list[CheckResult]:
    """One result per GPU NVML reports; nothing when NVML itself failed (`nvml` says why)."""
    if ctx.nvml.error:
        return []
    used = {g.index for g in ctx.used_gpus()}
    return [check_gpu(ctx, gpu, gpu.index in used) for gpu in ctx.nvml.gpus]


def check_gpu(ctx: Context, gpu: GpuInfo, used: bool) -> CheckResult:
    cc = gpu.compute_capability
    cc_text = f"{cc[0]}.{cc[1]}" if cc else "unknown"
    details = [f"{gpu.name}, compute capability {cc_text}"]
    problems = _capability(cc, cc_text)
    total, free = gpu.memory_total, gpu.memory_free
    if total is not None and free is not None:
        details.append(f"memory: {gib(total)} total, {gib(free)} free, {gib(total - free)} used")
    details.extend(
        f"process pid {p.pid} ({p.name or 'unknown'}): "
        f"{'unknown' if p.used_bytes is None else f'{p.used_bytes / 2**20:.0f} MiB'}"
        for p in gpu.processes
    )
    if used and total is not None and free is not None:
        problems.extend(_free_memory(gpu, total, free, ctx.gpu_memory_utilization))
    if gpu.mig_enabled:
        problems.append(
            (
                Status.WARN,
                "MIG mode is on: vLLM gets one MIG slice, not the memory shown here",
                "Check the MIG instance size (`nvidia-smi -L`) or disable MIG.",
            )
        )
    problems.extend(_pcie(gpu, ctx.options.offload_gb, details))
    if not used:
        details.append("not used with this --tensor-parallel-size / CUDA_VISIBLE_DEVICES")
    summary = f"{gpu.name}, compute {cc_text}, {gib(total)} ({gib(free)} free)"
    status = worst(*(s for s, _, _ in problems))
    message = f"{gpu.name}: " + "; ".join(p for _, p, _ in problems) if problems else summary
    return Result(f"gpu[{gpu.index}]", f"GPU {gpu.index}").make(
        status,
        message,
        details,
        remedy=" ".join(fix for _, _, fix in problems if fix),
        links=(DOCS_GPU,) if status is Status.FAIL and cc and cc < (7, 5) else (),
    )


def _capability(cc: tuple[int, int] | None, cc_text: str) -> list[Problem]:
    if cc is None:
        return [(Status.WARN, "compute capability unknown", "")]
    if cc < (7, 5):
        return [
            (
                Status.FAIL,
                f"compute capability {cc_text} is below 7.5: current vLLM ships no kernels for it",
                "Use a Turing (7.5) or newer GPU.",
            )
        ]
    if cc < (8, 0):
        return [
            (
                Status.WARN,
                f"compute capability {cc_text}: no bfloat16 and no FlashAttention 2",
                "Serve with --dtype half.",
            )
        ]
    return []


def _free_memory(gpu: GpuInfo, total: int, free: int, utilization: float) -> list[Problem]:
    need = total * utilization
    if free >= need:
        return []
    holders = ", ".join(f"pid {p.pid} ({p.name or '?'})" for p in gpu.processes)
    return [
        (
            Status.FAIL,
            f"only {gib(free)} free, but --gpu-memory-utilization {utilization:g} asks for "
            f"{gib(need)} at startup" + (f" (held by {holders})" if holders else ""),
            "Stop the other processes or lower --gpu-memory-utilization to "
            f"{math.floor(free / total * 100) / 100:g} or less.",
        )
    ]


def _pcie(gpu: GpuInfo, offload_gb: float, details: list[str]) -> list[Problem]:
    """The link offloaded weights cross on every forward pass."""
    now = link_bandwidth_gbs(gpu.pcie_gen, gpu.pcie_width)
    best = link_bandwidth_gbs(gpu.pcie_gen_max, gpu.pcie_width_max)
    if now is None or best is None:
        details.append("PCIe link: unknown")
        return []
    details.append(
        f"PCIe link: Gen{gpu.pcie_gen} x{gpu.pcie_width} now ({now:.1f} GB/s), "
        f"max Gen{gpu.pcie_gen_max} x{gpu.pcie_width_max} ({best:.1f} GB/s, "
        f"about {best * PRACTICAL_FRACTION:.0f} GB/s in practice)"
    )
    problems: list[Problem] = []
    if (gpu.pcie_width or 0) < (gpu.pcie_width_max or 0):
        problems.append(
            (
                Status.WARN,
                f"PCIe link runs at x{gpu.pcie_width} of x{gpu.pcie_width_max}",
                "Reseat the card, or check the slot, riser and BIOS PCIe settings.",
            )
        )
    elif (gpu.pcie_gen or 0) < (gpu.pcie_gen_max or 0):
        details.append(
            "the link generation is below its maximum: idle GPUs drop it to save power and "
            "raise it under load (check with `nvidia-smi -q -d PCIE` during a run)"
        )
    if offload_gb > 0:
        step = step_cost_ms(offload_gb, best * PRACTICAL_FRACTION)
        details.append(
            f"--offload-gb {offload_gb:g}: each forward pass reads that much over the link, "
            f"at least {step:.0f} ms per step"
        )
        if best < 15:
            problems.append(
                (
                    Status.WARN,
                    f"slow link for offload: Gen{gpu.pcie_gen_max} x{gpu.pcie_width_max} "
                    f"is {best:.1f} GB/s at best",
                    "Use a Gen4/Gen5 x16 slot for offloading.",
                )
            )
    return problems
