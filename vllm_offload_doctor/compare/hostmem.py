"""Host memory of a mode, sampled every second from launch to stop, and what a death by it looks like.

Offloaded weights live in pinned host memory, which the kernel counts as shared (RssShmem);
the RSS of the server's process tree includes it. When the host runs out, the kernel's OOM
killer takes the engine with no exception in the log (H-015.log): only these figures can tell.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from vllm_offload_doctor.analyze.model import Category, Facts
from vllm_offload_doctor.compare.records import Json, pack
from vllm_offload_doctor.machine.procstatus import read_status

GIB = 2**30
SAMPLE_EVERY_S = 1.0
# "Near zero": the kernel's OOM killer acts with a little memory still counted available.
NEAR_ZERO_FRACTION = 0.05
NEAR_LIMIT_FRACTION = 0.9


@dataclass(frozen=True, slots=True)
class HostSample:
    available: int  # bytes the host could still give (MemAvailable)
    total: int  # bytes of RAM
    tree_rss: int | None  # the server tree's resident bytes, shared/pinned included
    tree_shmem: int | None  # of which shared (pinned offload buffers)
    limit: int | None = None  # the cgroup's memory.max, when there is one


class HostProbe(Protocol):
    def sample(self, pid: int | None) -> HostSample | None: ...


class RealHostProbe:
    """psutil for the host and the tree; /proc/PID/status for RssShmem; cgroup v2 memory.max."""

    def __init__(self) -> None:
        self._limit = _cgroup_limit()

    def sample(self, pid: int | None) -> HostSample | None:
        import psutil

        try:
            vm = psutil.virtual_memory()
        except (OSError, RuntimeError):
            return None
        rss = shm = None
        if pid is not None:
            with contextlib.suppress(psutil.Error, OSError):
                root = psutil.Process(pid)
                rss = shm = 0
                for p in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error, OSError):
                        rss += p.memory_info().rss
                        shm += _rss_shmem(p.pid)
        return HostSample(int(vm.available), int(vm.total), rss, shm, self._limit)


def _rss_shmem(pid: int) -> int:
    try:
        return read_status(pid).get("RssShmem", 0) * 1024
    except OSError:
        return 0


def _cgroup_limit() -> int | None:
    """memory.max of this process's cgroup (the server inherits it); None without a limit."""
    try:
        rel = Path("/proc/self/cgroup").read_text().splitlines()[0].split(":", 2)[2]
        raw = (Path("/sys/fs/cgroup") / rel.lstrip("/") / "memory.max").read_text().strip()
    except (OSError, IndexError):
        return None
    return int(raw) if raw.isdigit() else None


@dataclass(frozen=True, slots=True)
class HostMemory:
    """What a mode took from the host, in GiB."""

    total_gib: float
    min_available_gib: float
    peak_rss_gib: float | None
    peak_shmem_gib: float | None
    limit_gib: float | None
    samples: int
    rss_per_offloaded_gib: float | None = None  # peak RSS over the offload (offload modes)

    def to_dict(self) -> Json:
        return pack(self, ("peak_rss_gib", "peak_shmem_gib", "limit_gib", "rss_per_offloaded_gib"))

    @classmethod
    def from_dict(cls, d: Json) -> HostMemory:
        return cls(
            d.get("total_gib", 0.0),
            d.get("min_available_gib", 0.0),
            d.get("peak_rss_gib"),
            d.get("peak_shmem_gib"),
            d.get("limit_gib"),
            d.get("samples", 0),
            d.get("rss_per_offloaded_gib"),
        )

    @property
    def exhausted(self) -> bool:
        """Available fell near zero, or the tree came near the host's total or its cgroup limit."""
        if self.min_available_gib <= max(NEAR_ZERO_FRACTION * self.total_gib, 0.5):
            return True
        cap = min(x for x in (self.total_gib, self.limit_gib) if x)
        return self.peak_rss_gib is not None and self.peak_rss_gib >= NEAR_LIMIT_FRACTION * cap

    @property
    def capacity_gib(self) -> float:
        return min(x for x in (self.total_gib, self.limit_gib) if x)


class HostSampler:
    """A daemon thread sampling `probe` every `every_s` for the pid `pid_of()` returns."""

    def __init__(
        self, probe: HostProbe, pid_of: Callable[[], int | None], every_s: float = SAMPLE_EVERY_S
    ) -> None:
        self.probe = probe
        self.pid_of = pid_of
        self.every_s = every_s
        self.samples: list[HostSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="host-memory", daemon=True)

    def start(self) -> HostSampler:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            self.take()
            if self._stop.wait(self.every_s):
                return

    def take(self) -> None:
        with contextlib.suppress(Exception):  # a probe failure must not end the run
            s = self.probe.sample(self.pid_of())
            if s is not None:
                self.samples.append(s)

    def stop(self, offload_gb: float) -> HostMemory | None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        return summarize(self.samples, offload_gb)


def summarize(samples: list[HostSample], offload_gb: float) -> HostMemory | None:
    if not samples:
        return None
    rss = [s.tree_rss for s in samples if s.tree_rss is not None]
    shm = [s.tree_shmem for s in samples if s.tree_shmem is not None]
    peak = max(rss) / GIB if rss else None
    limit = samples[-1].limit
    return HostMemory(
        total_gib=round(samples[-1].total / GIB, 2),
        min_available_gib=round(min(s.available for s in samples) / GIB, 2),
        peak_rss_gib=round(peak, 2) if peak is not None else None,
        peak_shmem_gib=round(max(shm) / GIB, 2) if shm else None,
        limit_gib=round(limit / GIB, 2) if limit else None,
        samples=len(samples),
        rss_per_offloaded_gib=round(peak / offload_gb, 2) if peak and offload_gb > 0 else None,
    )


# The API server's wrapper when its engine vanished without a word (H-015.log).


# Verdicts that name no cause of their own, or guess the OOM killer from the offload size alone.
_SILENT = (None, Category.UNKNOWN, Category.HEALTHY, Category.CRASH_OTHER, Category.OOM_HOST)


def engine_gone_silently(facts: Facts | None, category: Category | None) -> bool:
    """The engine died with no exception: only the wrapper, no root cause the log names.

    analyze calls such a death under a large offload `oom_host` from the log alone; the host
    figures measured here confirm or contradict that guess, so it is looked at again.
    """
    return category in _SILENT and facts is not None and facts.engine_core_failed


def host_death_summary(host: HostMemory, offload_gb: float) -> tuple[str, str, str]:
    """(title, summary, remedy) of a mode the kernel's OOM killer most likely took."""
    cap = host.capacity_gib
    where = f"the host's {cap:g} GiB" + (" (cgroup limit)" if host.limit_gib == cap else "")
    rate = host.rss_per_offloaded_gib
    parts = [
        "The engine died with no exception while host memory ran out: killed, most likely by "
        "the kernel's OOM killer.",
        f"Minimum available {host.min_available_gib:g} GiB of {host.total_gib:g} GiB",
    ]
    if host.peak_rss_gib is not None:
        parts[-1] += f"; the server's RSS peaked at {host.peak_rss_gib:g} GiB"
    parts[-1] += "."
    remedy = ""
    if rate:
        fits = largest_fitting(cap, rate)
        parts.append(
            f"The offload took {rate:g} GiB of host memory per offloaded GiB "
            f"(--cpu-offload-gb {offload_gb:g}); by that rate {where} hold at most "
            f"--cpu-offload-gb {fits:g}."
        )
        remedy = (
            f"Offload at most {fits:g} GiB per GPU on this host, or add host RAM; free what "
            "else holds memory."
        )
    parts.append(
        "Confirm with `sudo dmesg | grep -i 'out of memory'` or `journalctl -k | grep -i oom` "
        "(the kernel names the killed VLLM::EngineCore and its shmem-rss)."
    )
    return "killed by the host's OOM killer (host memory ran out)", " ".join(parts), remedy


def largest_fitting(capacity_gib: float, rate: float) -> float:
    """Whole GiB of offload whose measured host cost stays under 90% of the capacity."""
    return float(max(0, int(NEAR_LIMIT_FRACTION * capacity_gib / rate)))


SPARED = "The engine died with no exception, but host memory did not run out"


def host_spared(host: HostMemory) -> str:
    """A silent engine death with host memory to spare: the OOM killer is not the likely cause."""
    rss = f", the server's RSS peaked at {host.peak_rss_gib:g} GiB" if host.peak_rss_gib else ""
    return (
        f"{SPARED} (at least "
        f"{host.min_available_gib:g} of {host.total_gib:g} GiB stayed available{rss}), so the "
        "kernel's OOM killer is unlikely unless a memory limit applied that the doctor cannot "
        "see; `journalctl -k | grep -i oom` would show it."
    )
