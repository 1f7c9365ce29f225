"""Host memory for the offloaded weights, and the start-up time offloading adds.

With `--offload-gb X` and `-tp N`, vLLM takes about (1.1-1.25 x X + 3) x N GiB of host RAM (the
pinned copy, what loading holds while it moves the weights, the process), and loading takes about
X / 0.6 s longer; both measured on an H200 (`vllm_offload_doctor.machine.hostbudget`). Fails when
even the low estimate exceeds RAM or the cgroup limit, warns when the high one does or when it
exceeds what is available now. On WSL2 pinned memory can take twice as much: the high end allows
for it. Pinned memory cannot swap. RLIMIT_MEMLOCK is reported but never fails: CUDA pins through
cudaHostAlloc, which the driver does not count against it.
"""

from __future__ import annotations

from vllm_offload_doctor.checks.context import GIB, Context, gib
from vllm_offload_doctor.checks.model import CheckResult, Result
from vllm_offload_doctor.checks.registry import register
from vllm_offload_doctor.links import DOCS_MEMORY, ISSUE_HOST_RAM
from vllm_offload_doctor.machine.hostbudget import (
    DOUBLING,
    SOURCE,
    extra_load_s,
    host_budget,
    largest_offload,
)
from vllm_offload_doctor.machine.probes import HostMemory


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
    doubled = _may_double(ctx)
    budget = host_budget(opts.offload_gb, n, doubled=doubled)
    fits = largest_offload(usable / GIB, n, doubled=doubled)
    load_s = extra_load_s(opts.offload_gb)
    details += [
        f"host budget: {budget.text}; {SOURCE}",
        DOUBLING + (" (this looks like WSL: the high end allows for it)" if doubled else ""),
        f"largest --cpu-offload-gb this host holds by the high estimate: {fits}",
        f"start-up: about {load_s:.0f} s longer than without offload (pinning at ~0.6 GiB/s "
        "on the H200)",
    ]
    data = {
        "host_need_gib": [round(budget.low_gib, 1), round(budget.high_gib, 1)],
        "usable_gib": round(usable / GIB, 1),
        "available_gib": round(available / GIB, 1),
        "largest_offload_gib": fits,
        "extra_load_s": round(load_s),
        "budget": budget.to_dict(),
    }
    need = f"{budget.text} needed"
    links = (ISSUE_HOST_RAM, DOCS_MEMORY)
    if budget.low_gib * GIB > usable:
        return r.fail(
            f"{need}, but only {gib(usable)} usable{cgroup}",
            details,
            remedy=f"Offload at most {fits} GiB per GPU here, add RAM, or raise the memory limit.",
            links=links,
            data=data,
        )
    if budget.high_gib * GIB > usable:
        return r.warn(
            f"{need}, {gib(usable)} usable{cgroup}: it may not fit",
            details,
            remedy=f"Offload at most {fits} GiB per GPU to be safe, or add RAM.",
            links=links,
            data=data,
        )
    if budget.high_gib * GIB > available:
        return r.warn(
            f"{need}, only {gib(available)} available now",
            details,
            remedy="Stop other memory users before starting vLLM.",
            links=links,
            data=data,
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
    return r.ok(
        f"{need}, {gib(available)} available; start-up about {load_s:.0f} s longer",
        details,
        links=links,
        data=data,
    )


def _may_double(ctx: Context) -> bool:
    try:
        p = ctx.platform
    except Exception:  # the platform check reports its own probe failure
        return False
    return p.vllm_sees_wsl or bool(p.wsl_markers)


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
