"""What offloading costs per output token, set against what the host link can carry.

The extra time per token is charged to the *extra* bytes offloaded between the two modes (both
may offload). A measured rate above the link's raw bandwidth is physically impossible: it is
reported as inconsistent (prefill share, noise, too few requests), never as a bandwidth.
"""

from __future__ import annotations

from vllm_offload_doctor.compare.model import Link, ModeResult, Performance
from vllm_offload_doctor.machine.pcie import PRACTICAL_FRACTION, step_cost_ms

MIN_TRUSTED_REQUESTS = 3


def link_of(mode: ModeResult) -> tuple[float | None, Link]:
    """The slowest host link among the GPUs the server used (its raw bandwidth, GB/s)."""
    gpu = mode.gpu
    if gpu is None or not gpu.available:
        return None, Link(reason=(gpu.reason if gpu else None) or "no NVML reading")
    bws = [
        (d.pcie.bandwidth_gbs, d)
        for d in gpu.server_devices()
        if d.pcie is not None and d.pcie.bandwidth_gbs
    ]
    if not bws:
        return None, Link(reason="NVML reports no PCIe link")
    bw, d = min(bws, key=lambda x: x[0] or 0.0)
    assert d.pcie is not None and bw is not None
    p = d.pcie
    return bw, Link(
        desc=f"PCIe gen{p.max_gen} x{p.max_width}",
        bandwidth_gbs=bw,
        device=d.index,
        current_gen=p.current_gen,
        current_width=p.current_width,
    )


def _few_requests(*modes: ModeResult) -> str | None:
    counts = [m.latency.ok for m in modes if m.latency is not None]
    if counts and min(counts) < MIN_TRUSTED_REQUESTS:
        return (
            f"{min(counts)} measured request(s) per mode is too few to trust a latency figure; "
            f"use --repeats {MIN_TRUSTED_REQUESTS * 2 - 1} or more."
        )
    return None


def _link_text(gib: float, bw: float, link: Link, what: str) -> tuple[float, float, str]:
    usable = bw * PRACTICAL_FRACTION
    bound, floor = step_cost_ms(gib, usable), step_cost_ms(gib, bw)
    text = (
        f" Every decode step reads {what} ({gib:g} GiB per GPU) over the host link "
        f"({link.desc}): about {bound:.1f} ms per token at the ~{usable:.0f} GB/s pinned copies "
        f"usually reach, never less than {floor:.1f} ms at the raw {bw:.0f} GB/s."
    )
    return bound, floor, text


def performance(base: ModeResult, off: ModeResult, delta_gib: float) -> Performance:
    """Slowdown and extra time per token of `off` over `base`; `delta_gib` extra GiB offloaded."""
    bl, ol = base.latency, off.latency
    bmed = bl.median_s if bl else None
    omed = ol.median_s if ol else None
    if not bmed or not omed:
        return Performance(text="No latency figures to compare.")
    notes: list[str] = []
    slowdown = round(omed / bmed, 2)
    tokens = (ol.completion_tokens_median if ol else None) or (
        bl.completion_tokens_median if bl else None
    )
    text = f"Median latency {bmed * 1e3:.0f} -> {omed * 1e3:.0f} ms ({slowdown:.2f}x)"
    extra = (omed - bmed) * 1e3 / tokens if tokens else None
    if extra is not None:
        text += f", {extra:+.1f} ms per output token"
    text += "."
    bw, link = link_of(off)
    bound = floor = ratio = implied = None
    consistent: bool | None = None
    what = "the extra offloaded weights" if base.offload_gb > 0 else "the offloaded weights"
    if bw and delta_gib > 0:
        bound, floor, more = _link_text(delta_gib, bw, link, what)
        text += more
        if extra is not None and extra > 0:
            ratio = round(extra / bound, 2)
    elif delta_gib > 0:
        notes.append(f"PCIe link bandwidth unknown ({link.reason}).")
    if extra is not None and extra > 0 and delta_gib > 0:
        rate = delta_gib * 2**30 / (extra / 1e3) / 1e9
        if bw and rate > bw:
            consistent = False
            text += (
                f" Measured: {extra:.1f} ms per token, which would mean {rate:.0f} GB/s, more than "
                f"the link's raw {bw:.0f} GB/s: not a bandwidth. The difference is too small "
                "against the noise, the prefill share or too few requests."
            )
        else:
            consistent = True if bw else None
            implied = round(rate, 1)
            text += f" Measured: {extra:.1f} ms per token, about {rate:.0f} GB/s."
    elif extra is not None and delta_gib > 0:
        notes.append(
            "The offload mode was not slower: latency noise, too few --repeats, or the offloaded "
            "layers were not on the decode path."
        )
    few = _few_requests(base, off)
    if few:
        notes.append(few)
    return Performance(
        notes=tuple(notes),
        slowdown=slowdown,
        extra_ms_per_token=round(extra, 2) if extra is not None else None,
        link=link,
        offloaded_delta_gib=round(delta_gib, 3) if base.offload_gb > 0 else None,
        link_bound_ms_per_token=round(bound, 2) if bound is not None else None,
        link_floor_ms_per_token=round(floor, 2) if floor is not None else None,
        measured_vs_bound=ratio,
        implied_gbs=implied,
        consistent=consistent,
        text=text,
    )


def solo_performance(off: ModeResult, offloaded_gib: float) -> Performance:
    """Cost per token when only the offload mode served (the baseline did not fit)."""
    lat = off.latency
    if lat is None or not lat.median_s or not lat.completion_tokens_median:
        return Performance(text="No latency figures.")
    per_token = lat.median_s * 1e3 / lat.completion_tokens_median
    text = f"It costs {per_token:.0f} ms per output token (median {lat.median_s:.2f} s"
    text += f" for {lat.completion_tokens_median:g} tokens, prefill included)."
    notes: list[str] = []
    bw, link = link_of(off)
    bound = floor = None
    consistent: bool | None = None
    if bw and offloaded_gib > 0:
        bound, floor, more = _link_text(offloaded_gib, bw, link, "the offloaded weights")
        text += more.replace(" Every", " The link allows: every", 1)
        consistent = per_token >= floor
        if not consistent:
            text += (
                f" {per_token:.0f} ms per token is faster than the raw link allows: the figure "
                "is not consistent (noise or too few requests)."
            )
    elif offloaded_gib > 0:
        notes.append(f"PCIe link bandwidth unknown ({link.reason}).")
    few = _few_requests(off)
    if few:
        notes.append(few)
    return Performance(
        notes=tuple(notes),
        link=link,
        link_bound_ms_per_token=round(bound, 2) if bound is not None else None,
        link_floor_ms_per_token=round(floor, 2) if floor is not None else None,
        consistent=consistent,
        text=text,
    )
