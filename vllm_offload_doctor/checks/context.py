"""The `Context` a check reads the machine through: each probe answer read once, shared by all."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from functools import cached_property
from typing import Any

from packaging.version import InvalidVersion, Version

from vllm_offload_doctor.checks.model import Options
from vllm_offload_doctor.errors import ProbeError
from vllm_offload_doctor.machine.probes import (
    GpuInfo,
    HostMemory,
    InterpreterInfo,
    NvmlInfo,
    PlatformInfo,
    Probe,
)
from vllm_offload_doctor.runner import default_gpu_memory_utilization

GIB = 1 << 30

# The probes that wait on the machine, longest first: NVML's driver calls and the subprocesses
# (vLLM's Python, `uname -p` behind platform.uname()) release the GIL while they wait.
SLOW_PROBES = ("nvml", "interpreter", "platform", "host_memory")


class Context:
    """Probe answers, each read once and shared by the checks that need them."""

    def __init__(self, probe: Probe, options: Options) -> None:
        self.probe = probe
        self.options = options

    @cached_property
    def platform(self) -> PlatformInfo:
        return self.probe.platform()

    @cached_property
    def interpreter(self) -> InterpreterInfo:
        return self.probe.interpreter(self.options.python)

    @cached_property
    def nvml(self) -> NvmlInfo:
        return self.probe.nvml()

    @cached_property
    def host_memory(self) -> HostMemory:
        return self.probe.host_memory()

    @cached_property
    def environ(self) -> Mapping[str, str]:
        return self.probe.environ()

    @cached_property
    def vllm_version(self) -> Version | None:
        """The installed vLLM's release number (dev/local suffixes dropped), if known."""
        try:
            raw = self.interpreter.vllm_version
            return Version(Version(raw).base_version) if raw else None
        except (InvalidVersion, ProbeError, OSError):
            return None

    @cached_property
    def gpu_memory_utilization(self) -> float:
        """The fraction vLLM will claim: the option, else the installed vLLM's default."""
        given = self.options.gpu_memory_utilization
        return given if given is not None else default_gpu_memory_utilization(self.vllm_version)

    @contextlib.contextmanager
    def prefetching(self) -> Iterator[None]:
        """Read the slow probes in threads while the body runs, and wait for them at its end.

        The body (importing the check modules) runs while the probes wait on the machine. A probe
        that raises here is simply read again by its check, which reports it.
        """
        threads = [
            threading.Thread(target=self._prefetch, args=(name,), daemon=True)
            for name in SLOW_PROBES
        ]
        for thread in threads:
            thread.start()
        try:
            yield
        finally:
            for thread in threads:
                thread.join()

    def _prefetch(self, name: str) -> None:
        with contextlib.suppress(Exception):
            getattr(self, name)

    def used_gpus(self) -> list[GpuInfo]:
        """The GPUs vLLM will use: the first N visible, mapped through CUDA_VISIBLE_DEVICES."""
        gpus = self.nvml.gpus
        order = visible_indices(self.environ.get("CUDA_VISIBLE_DEVICES"), len(gpus))
        visible = [gpus[i] for i in order] if order is not None else list(gpus)
        return visible[: self.options.tensor_parallel_size]

    def facts(self) -> dict[str, Any]:
        """Whatever the checks already read (nothing is probed again here)."""
        cache = self.__dict__
        out: dict[str, Any] = {"options": asdict(self.options)}
        for name in ("platform", "interpreter", "nvml", "host_memory"):
            if name in cache:
                out[name] = asdict(cache[name])
        return out


def visible_indices(value: str | None, count: int) -> list[int] | None:
    """NVML indices CUDA will expose, in order; None when entries are UUIDs (order unknown).

    CUDA stops at the first invalid entry, so "0,7,1" on a 2-GPU machine exposes only GPU 0.
    """
    if value is None:
        return list(range(count))
    order: list[int] = []
    for token in value.split(","):
        token = token.strip()
        if not token:
            break
        if not token.lstrip("-").isdigit():
            return None
        index = int(token)
        if index < 0 or index >= count or index in order:
            break
        order.append(index)
    return order


def gib(value: float | None) -> str:
    return "unknown" if value is None else f"{value / GIB:.1f} GiB"
