"""Host-to-GPU link bandwidth: what every offloaded byte crosses on each forward pass."""

from __future__ import annotations

# Per-lane payload rate in GB/s (decimal) after line encoding, per PCIe generation.
_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

# Pinned host-to-device copies reach about 85 % of the raw link rate in practice.
PRACTICAL_FRACTION = 0.85


def pcie_bandwidth_gbs(generation: int, width: int) -> float | None:
    """Theoretical one-direction bandwidth of a PCIe link, GB/s; None when unknown."""
    lane = _LANE_GBS.get(generation)
    if lane is None or width <= 0:
        return None
    return lane * width


def link_bandwidth_gbs(generation: int | None, width: int | None) -> float | None:
    """`pcie_bandwidth_gbs` for values NVML may not know."""
    if generation is None or width is None:
        return None
    return pcie_bandwidth_gbs(generation, width)


def step_cost_ms(offloaded_gib: float, bandwidth_gbs: float) -> float:
    """Lower bound on the time one forward pass spends reading offloaded weights."""
    return offloaded_gib * 2**30 / (bandwidth_gbs * 1e9) * 1e3
