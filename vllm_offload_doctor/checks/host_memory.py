"""Host memory for the offloaded weights.

With `--offload-gb X` and `-tp N`, vLLM needs about 1.9 x X x N GiB of host RAM (the pinned copy plus
what loading holds while it moves the weights; vLLM issue #56410). Fails when that exceeds RAM or the
cgroup limit, warns when it exceeds what is available now. Pinned memory cannot swap. RLIMIT_MEMLOCK
is reported but never fails: CUDA pins through cudaHostAlloc, which the driver does not count against it.
"""

from __future__ import annotations

from vllm_offload_doctor.checks.context import GIB, Context, gib
from vllm_offload_doctor.checks.model import CheckResult, Result
from vllm_offload_doctor.checks.registry import register
from vllm_offload_doctor.links import DOCS_MEMORY, ISSUE_HOST_RAM
from vllm_offload_doctor.machine.probes import HostMemory

HOST_FACTOR = 1.9  # host RAM per offloaded GiB per GPU (vLLM issue #56410)


@register("host_memory", "Host memory")
def check_host_memory(ctx: Context, r: Result) -> CheckResult:
    mem, opts = ctx.host_memory, ctx.options
    usable = min(mem.total, mem.cgroup_limit or mem.total)
    available = mem.available
    if mem.cgroup_limit is not None:
        available = min(available, mem.cgroup_limit - (mem.cgroup_usage or 0))
    details = _details(mem)
    cgroup = f", cgroup limit {gib(mem.cgroup_limit)}" if mem.cgroup_limit is not None else ""
    if opts.offload_gb <= 0:
        details.append("pass --offload-gb X to budget host memory for offloading")
        return r.ok(f"{gib(mem.total)} RAM, {gib(available)} available{cgroup}", details)
    n = opts.tensor_parallel_size
    required = HOST_FACTOR * opts.offload_gb * n * GIB
    need = (
        f"~{required / GIB:.1f} GiB needed ({HOST_FACTOR} × {opts.offload_gb:g} GiB × {n} GPU"
        f"{'s' if n > 1 else ''})"
    )
    links = (ISSUE_HOST_RAM, DOCS_MEMORY)
    if required > usable:
        return r.fail(
            f"{need}, but only {gib(usable)} usable{cgroup}",
            details,
            remedy="Offload less per GPU, add RAM, or raise the memory limit.",
            links=links,
        )
    if required > available:
        return r.warn(
            f"{need}, only {gib(available)} available now",
            details,
            remedy="Stop other memory users before starting vLLM.",
            links=links,
        )
    pinned = opts.offload_gb * n * GIB
    if mem.memlock_soft is not None and mem.memlock_soft < pinned:
        # Not a warning: torch pins through cudaHostAlloc, which the driver does not count
        # against RLIMIT_MEMLOCK; a warning here would fire on nearly every default machine.
        details.append(
            f"RLIMIT_MEMLOCK ({_limit(mem.memlock_soft)}) is below the {gib(pinned)} to pin; "
            "CUDA pinned allocations are usually not bound by it. If pinning fails, raise it "
            "(`ulimit -l unlimited`, `docker run --ulimit memlock=-1`)"
        )
    return r.ok(f"{need}, {gib(available)} available", details, links=links)


def _details(mem: HostMemory) -> list[str]:
    cgroup = (
        f"{gib(mem.cgroup_limit)} ({gib(mem.cgroup_usage)} in use)"
        if mem.cgroup_limit is not None
        else "none"
    )
    return [
        f"RAM: {gib(mem.total)} total, {gib(mem.available)} available",
        f"cgroup limit: {cgroup}",
        f"swap: {gib(mem.swap_total)} total, {gib(mem.swap_free)} free (pinned memory cannot swap)",
        f"locked-memory limit (RLIMIT_MEMLOCK): soft {_limit(mem.memlock_soft)}, "
        f"hard {_limit(mem.memlock_hard)}",
    ]


def _limit(value: int | None) -> str:
    if value is None:
        return "unlimited"
    return f"{value // 1024} KiB" if value < GIB else gib(value)
