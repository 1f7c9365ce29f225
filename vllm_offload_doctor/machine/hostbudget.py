"""Host RAM and start-up time that `--cpu-offload-gb X` costs, calibrated on an H200.

Measured (vLLM 0.25.1, one H200, 128 GiB host, `free -m` every 2 s; the sidecar of the corpus
log H-015): 30 GiB offloaded -> 39 G in use, 40 -> 51 G, 100 -> 122.9 G at peak, 112 -> killed
by the OOM killer (shmem-rss 126 G). Read as GiB that is 1.2 x X + 3; read as GB (1e9) it is
1.12 x X + 2.7 GiB. So the budget per GPU is 1.1-1.25 x X + 3 GiB: the pinned copy of the
offloaded weights, what loading holds while it moves them, and the process itself.
Where the driver stages pinned memory twice (WSL2, some drivers) the rate can double.

Loading with X GiB offloaded took 174 s instead of ~25 s at X = 100: pinning runs at about
0.6 GiB/s, so start-up grows by about X / 0.6 seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 1 << 30
RATE_LOW, RATE_HIGH = 1.1, 1.25  # host GiB per offloaded GiB (H200, vLLM 0.25.1)
CONSTANT_GIB = 3.0  # per GPU process, beyond the offload
DOUBLED_RATE = 2.5  # where pinned memory is staged twice
PIN_GIBS = 0.6  # GiB/s the H200 host pinned the offloaded weights at
SOURCE = "measured on an H200 with vLLM 0.25.1: 30 GiB -> 39, 40 -> 51, 100 -> 122.9 at peak"
DOUBLING = "pinned memory can take twice as much where the driver stages it (WSL2, some drivers)"


@dataclass(frozen=True, slots=True)
class HostBudget:
    """Host RAM for `offload_gib` per GPU on `gpus` GPUs, as a range in GiB."""

    offload_gib: float
    gpus: int
    low_gib: float
    high_gib: float
    doubled: bool  # the platform may double pinned memory (the high end allows for it)

    @property
    def text(self) -> str:
        n = self.gpus
        rate = f"{RATE_LOW:g}-{DOUBLED_RATE if self.doubled else RATE_HIGH:g}"
        each = f"{rate} × {self.offload_gib:g} GiB + {CONSTANT_GIB:g} GiB"
        each = f"({each}) × {n} GPUs" if n > 1 else each
        return f"{need_range(self.low_gib, self.high_gib)} ({each})"

    def to_dict(self) -> dict[str, object]:
        return {
            "offload_gib": self.offload_gib,
            "gpus": self.gpus,
            "low_gib": round(self.low_gib, 1),
            "high_gib": round(self.high_gib, 1),
            "rate_per_gib": [RATE_LOW, DOUBLED_RATE if self.doubled else RATE_HIGH],
            "constant_gib": CONSTANT_GIB,
            "pinned_may_double": self.doubled,
            "source": SOURCE,
        }


def host_budget(offload_gib: float, gpus: int = 1, *, doubled: bool = False) -> HostBudget:
    """What `vllm serve --cpu-offload-gb offload_gib` on `gpus` GPUs takes from the host."""
    high_rate = DOUBLED_RATE if doubled else RATE_HIGH
    n = max(1, gpus)
    return HostBudget(
        offload_gib,
        n,
        (RATE_LOW * offload_gib + CONSTANT_GIB) * n,
        (high_rate * offload_gib + CONSTANT_GIB) * n,
        doubled,
    )


def largest_offload(usable_gib: float, gpus: int = 1, *, doubled: bool = False) -> int:
    """The largest whole --cpu-offload-gb whose high estimate stays within `usable_gib`."""
    rate = DOUBLED_RATE if doubled else RATE_HIGH
    return max(0, math.floor((usable_gib / max(1, gpus) - CONSTANT_GIB) / rate))


def extra_load_s(offload_gib: float) -> float:
    """Seconds start-up grows by with this much offloaded per GPU (ranks pin in parallel)."""
    return max(0.0, offload_gib) / PIN_GIBS


def need_range(low_gib: float, high_gib: float) -> str:
    """`~3.5-3.6 GiB`, `~3.6 GiB`, `~39-44 GiB`: never `~4-4 GiB` for a small offload."""
    digits = 1 if high_gib < 10 else 0
    low, high = f"{low_gib:.{digits}f}", f"{high_gib:.{digits}f}"
    return f"~{low if low == high else f'{low}-{high}'} GiB"
