"""Before any server starts: can the host hold each offload mode, how long will loading take,
and how much offload does the model need (check's host budget and fit model, from machine/)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from vllm_offload_doctor.compare.config import CompareConfig, fmt_gb
from vllm_offload_doctor.compare.hostmem import HostMemory as HostMemory_
from vllm_offload_doctor.compare.records import Json
from vllm_offload_doctor.machine.fit import GIB, plan
from vllm_offload_doctor.machine.hostbudget import (
    DOUBLING,
    SOURCE,
    extra_load_s,
    host_budget,
    largest_offload,
    need_range,
)
from vllm_offload_doctor.machine.modelsize import ModelSize
from vllm_offload_doctor.machine.probes import HostMemory, NvmlInfo, PlatformInfo
from vllm_offload_doctor.runner import default_gpu_memory_utilization


class MachineProbe(Protocol):
    """The part of check's probe the preflight reads."""

    def host_memory(self) -> HostMemory: ...

    def platform(self) -> PlatformInfo: ...

    def nvml(self) -> NvmlInfo: ...


@dataclass(frozen=True, slots=True)
class ModePlan:
    offload_gb: float
    low_gib: float
    high_gib: float
    extra_load_s: float
    timeout_s: float
    verdict: str  # "fits", "may not fit", "does not fit"

    def to_dict(self) -> Json:
        return {
            "offload_gb": self.offload_gb,
            "host_need_gib": [round(self.low_gib, 1), round(self.high_gib, 1)],
            "extra_load_s": round(self.extra_load_s),
            "timeout_s": round(self.timeout_s),
            "host": self.verdict,
        }


@dataclass(frozen=True, slots=True)
class Preflight:
    total_gib: float
    usable_gib: float
    available_gib: float
    doubled: bool
    largest_offload_gib: int
    modes: tuple[ModePlan, ...]
    min_offload_gib: int | None = None  # check's fit model, when the model and GPU are known
    fit_note: str = ""

    @property
    def blocked(self) -> list[float]:
        """Offload modes the host cannot hold even by the low estimate."""
        return [m.offload_gb for m in self.modes if m.verdict == "does not fit"]

    def lines(self) -> list[str]:
        out = [
            f"host: {self.total_gib:.1f} GiB RAM, {self.usable_gib:.1f} usable, "
            f"{self.available_gib:.1f} available now; budget 1.1-1.25 GiB per offloaded GiB "
            f"+ 3 GiB per GPU ({SOURCE}); largest offload this host holds: "
            f"--cpu-offload-gb {self.largest_offload_gib}"
        ]
        if self.doubled:
            out.append(f"this looks like WSL: {DOUBLING}")
        out += [
            f"offload {fmt_gb(m.offload_gb)} GiB: host needs {need_range(m.low_gib, m.high_gib)}, "
            f"{m.verdict}; loading takes about "
            f"{m.extra_load_s:.0f} s longer (pinning ~0.6 GiB/s), timeout {m.timeout_s:.0f} s"
            for m in self.modes
        ]
        if self.fit_note:
            out.append(self.fit_note)
        return out

    def to_dict(self) -> Json:
        return {
            "host": {
                "total_gib": round(self.total_gib, 2),
                "usable_gib": round(self.usable_gib, 2),
                "available_gib": round(self.available_gib, 2),
                "pinned_may_double": self.doubled,
                "largest_offload_gib": self.largest_offload_gib,
                "source": SOURCE,
            },
            "modes": [m.to_dict() for m in self.modes],
            "min_offload_gib": self.min_offload_gib,
            "lines": self.lines(),
        }


def run_preflight(
    cfg: CompareConfig,
    probe: MachineProbe,
    model_size: Callable[[str], ModelSize] | None = None,
) -> Preflight:
    mem = probe.host_memory()
    usable = min(mem.total, mem.cgroup_limit or mem.total)
    available = mem.available
    if mem.cgroup_limit is not None:
        available = min(available, mem.cgroup_limit - (mem.cgroup_usage or 0))
    try:
        p = probe.platform()
        doubled = p.vllm_sees_wsl or bool(p.wsl_markers)
    except Exception:  # no platform answer: plan as on plain Linux
        doubled = False
    n = cfg.tensor_parallel_size()
    modes = []
    for gb in cfg.offload_gb:
        b = host_budget(gb, n, doubled=doubled)
        if b.low_gib * GIB > usable:
            verdict = "does not fit"
        elif b.high_gib * GIB > min(usable, available):
            verdict = "may not fit"
        else:
            verdict = "fits"
        modes.append(
            ModePlan(gb, b.low_gib, b.high_gib, extra_load_s(gb), cfg.timeout_for(gb), verdict)
        )
    minimum, note = _fit(cfg, probe, model_size)
    return Preflight(
        mem.total / GIB,
        usable / GIB,
        available / GIB,
        doubled,
        largest_offload(usable / GIB, n, doubled=doubled),
        tuple(modes),
        minimum,
        note,
    )


def _fit(
    cfg: CompareConfig, probe: MachineProbe, model_size: Callable[[str], ModelSize] | None
) -> tuple[int | None, str]:
    """check's fit model for a local model on the GPUs here (nothing when either is unknown)."""
    from vllm_offload_doctor.errors import DoctorError

    if model_size is None:
        from vllm_offload_doctor.machine.modelsize import inspect_model

        def model_size(m: str) -> ModelSize:
            return inspect_model(m, os.environ, Path.home())

    try:
        size = model_size(cfg.model)
        nvml = probe.nvml()
    except (DoctorError, OSError, ValueError):
        return None, ""
    totals = [g.memory_usable for g in nvml.gpus if g.memory_usable]
    if nvml.error or not totals:
        return None, ""
    util = cfg.gpu_memory_utilization() or default_gpu_memory_utilization(None)
    p = plan(
        size.total_bytes,
        size.shape,
        tp=cfg.tensor_parallel_size(),
        gpu_total=min(totals),
        utilization=util,
        max_model_len=cfg.max_model_len,
    )
    minimum = p.min_offload_gib
    need = f"fit: {p.need / GIB:.1f} GiB needed per GPU against {util:g} x {min(totals) / GIB:.1f}"
    if minimum is None:
        return None, f"{need} GiB: fits without offload; offloading only costs speed"
    short = [fmt_gb(gb) for gb in cfg.offload_gb if gb < minimum]
    tail = f"; offload {', '.join(short)} GiB is too little" if short else ""
    return minimum, f"{need} GiB: offload at least {minimum} GiB per GPU{tail}"


def host_figures(offload_gb: float, measured: HostMemory_ | None, pre: Json | None) -> str | None:
    """One line of what the host was told to expect and what it measured, for the verdict."""
    planned = next(
        (m for m in (pre or {}).get("modes", []) if m.get("offload_gb") == offload_gb), None
    )
    if measured is None and planned is None:
        return None
    parts = []
    if planned is not None:
        low, high = planned["host_need_gib"]
        parts.append(f"budget {need_range(low, high)}")
    if measured is not None:
        if measured.peak_rss_gib is not None:
            peak = f"measured peak RSS {measured.peak_rss_gib:g} GiB"
            if measured.rss_per_offloaded_gib:
                peak += f" ({measured.rss_per_offloaded_gib:g} GiB per offloaded GiB)"
            parts.append(peak)
        parts.append(
            f"minimum available {measured.min_available_gib:g} of {measured.total_gib:g} GiB"
        )
        if measured.rss_per_offloaded_gib:
            from vllm_offload_doctor.compare.hostmem import largest_fitting

            fits = largest_fitting(measured.capacity_gib, measured.rss_per_offloaded_gib)
            parts.append(f"by the measured rate this host holds --cpu-offload-gb {fits:g}")
    if planned is None and (pre or {}).get("host"):
        parts.append(f"largest by the budget: {pre['host']['largest_offload_gib']}")  # type: ignore[index]
    elif (pre or {}).get("host"):
        parts.append(
            f"by the budget --cpu-offload-gb {pre['host']['largest_offload_gib']}"  # type: ignore[index]
        )
    return f"host memory, offload {fmt_gb(offload_gb)} GiB: " + "; ".join(parts) + "."
