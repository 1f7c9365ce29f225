"""Whether the model fits the GPU budget, and the least `--cpu-offload-gb` that makes it fit.

Needs `--model` (a local directory, or a repo id already in the Hugging Face cache; never downloaded).
The need per GPU is weights / TP + the KV cache of one `--max-model-len` request (default: the
model's own limit; in `--kv-cache-dtype`, default the model's dtype) + the activation peak of vLLM's profiling pass + non-torch overhead; the budget is
`--gpu-memory-utilization` (default: the installed vLLM's, 0.92 from 0.20.0, 0.9 before) x the
smallest GPU used. The arithmetic and its calibration on an H200 are in `vllm_offload_doctor.machine.fit`.
Fails when the weights do not fit with the offload given, warns when offload is given but not
needed (it only costs speed) or is more than the weights. Without a GPU it still reports the need;
`--gpu-memory-gib N` plans for a GPU you do not have.
"""

from __future__ import annotations

from typing import Any

from vllm_offload_doctor.checks.context import GIB, Context, gib
from vllm_offload_doctor.checks.model import CheckResult, Result
from vllm_offload_doctor.checks.registry import register
from vllm_offload_doctor.errors import ProbeError
from vllm_offload_doctor.links import DOCS_MEMORY, ISSUE_FITS_ANYWAY
from vllm_offload_doctor.machine.fit import FitPlan, longest_fitting_len, plan
from vllm_offload_doctor.machine.hostbudget import host_budget, need_range
from vllm_offload_doctor.machine.modelsize import ModelSize
from vllm_offload_doctor.machine.pcie import (
    PRACTICAL_FRACTION,
    link_bandwidth_gbs,
    pcie_bandwidth_gbs,
    step_cost_ms,
)


@register("fit", "Model fit")
def check_fit(ctx: Context, r: Result) -> CheckResult:
    opts = ctx.options
    if not opts.model:
        return r.skip("no --model given")
    try:
        size = ctx.probe.model_size(opts.model)
    except ProbeError as exc:  # the other checks still run; only this one cannot answer
        return r.fail(
            f"cannot read --model: {exc}",
            remedy="Pass a local model directory with its config.json, or download the model "
            "first (check never downloads).",
        )
    total, gpu = _gpu_total(ctx)
    n = opts.tensor_parallel_size
    p = plan(
        size.total_bytes,
        size.shape,
        tp=n,
        gpu_total=total,
        utilization=ctx.gpu_memory_utilization,
        max_model_len=opts.max_model_len,
        kv_cache_dtype=opts.kv_cache_dtype,
    )
    details = [*_need_details(size, p, n, opts.kv_cache_dtype), *_budget_details(ctx, p, gpu)]
    data = _plan_data(ctx, size, p, total)
    details += _plan_extras(data)
    est = " (estimated from config.json)" if size.estimated else ""
    weights = f"{gib(p.weights)} of weights per GPU{est}"
    need = f"{gib(p.need)} needed per GPU{_for_length(p)}"
    if p.budget is None or p.to_offload is None:
        return r.skip(
            f"{weights}, {need}; {gpu}: pass --gpu-memory-gib N to plan for a GPU",
            details,
            data=data,
        )
    return _verdict(r, p, opts.offload_gb, f"{weights}, {need}", details, data)


def _verdict(
    r0: Result,
    p: FitPlan,
    offload_gb: float,
    what: str,
    details: list[str],
    data: dict[str, Any],
) -> CheckResult:
    assert p.budget is not None and p.to_offload is not None
    r = _WithData(r0, data)
    budget, to_offload, offload = gib(p.budget), p.to_offload, offload_gb * GIB
    links = (DOCS_MEMORY,)
    if to_offload <= 0:
        room = _kv_room(p, 0)
        if offload > 0:
            return r.warn(
                f"{what}: fits in {budget} without offload; --offload-gb {offload_gb:g} only "
                "costs speed",
                details,
                remedy="Drop --cpu-offload-gb; the freed GPU memory goes to the KV cache.",
                links=(ISSUE_FITS_ANYWAY, *links),
            )
        return r.ok(f"{what}: fits in {budget} without offload{room}", details, links=links)
    minimum = p.min_offload_gib
    if to_offload >= p.weights:
        return r.fail(
            f"{what}: a {budget} budget leaves no room even with everything offloaded",
            details,
            remedy="Raise --gpu-memory-utilization, lower --max-model-len or use more GPUs.",
            links=links,
        )
    if offload > 0:
        details.append(
            "vLLM offloads whole parameters: it may move slightly more than asked "
            "(27 asked, 27.34 GiB moved on the H200), which leaves a little more KV cache"
        )
    if offload >= to_offload:
        if offload > p.weights:
            return r.warn(
                f"--offload-gb {offload_gb:g} is more than the {gib(p.weights)} of weights per "
                f"GPU; {minimum} GiB per GPU is enough",
                details,
                remedy=f"Use --cpu-offload-gb {minimum}: every offloaded GiB costs speed.",
                links=links,
            )
        if minimum is not None and offload > minimum * GIB:
            details.append(f"offloading more than {minimum} GiB per GPU only costs speed")
        return r.ok(
            f"{what}: fits in {budget} only with offload, at least {minimum} GiB per GPU; "
            f"{offload_gb:g} given{_kv_room(p, offload)}",
            details,
            links=links,
        )
    given = f"even with {offload_gb:g} GiB offloaded" if offload > 0 else "without offload"
    return r.fail(
        f"{what}: does not fit in {budget} {given}; offload at least {minimum} GiB per GPU",
        details,
        remedy=f"vllm serve ... --cpu-offload-gb {minimum} (or more GPUs with -tp, or a "
        "smaller --max-model-len).",
        links=links,
    )


class _WithData:
    """`Result` whose verdicts all carry the plan's figures."""

    def __init__(self, r: Result, data: dict[str, Any]) -> None:
        self.r, self.data = r, data

    def ok(self, message: str, details: list[str], **kw: Any) -> CheckResult:
        return self.r.ok(message, details, data=self.data, **kw)

    def warn(self, message: str, details: list[str], **kw: Any) -> CheckResult:
        return self.r.warn(message, details, data=self.data, **kw)

    def fail(self, message: str, details: list[str], **kw: Any) -> CheckResult:
        return self.r.fail(message, details, data=self.data, **kw)


def _round(v: float | None) -> float | None:
    return None if v is None else round(v / GIB, 2)


def _plan_data(ctx: Context, size: ModelSize, p: FitPlan, total: float | None) -> dict[str, Any]:
    """The plan as numbers (GiB per GPU): what a script or the compare preflight reads."""
    opts = ctx.options
    n = opts.tensor_parallel_size
    minimum = p.min_offload_gib
    offload = opts.offload_gb or float(minimum or 0)
    data: dict[str, Any] = {
        "weights_gib": _round(p.weights),
        "kv_cache_gib": _round(p.kv_cache),
        "activation_gib": _round(p.activation),
        "overhead_gib": _round(p.overhead),
        "need_gib": _round(p.need),
        "budget_gib": _round(p.budget),
        "max_model_len": p.max_model_len,
        "min_offload_gib": minimum,
        "kv_tokens": p.kv_tokens(offload * GIB),
        "host_need_gib": None,
        "longest_max_model_len_without_offload": None,
        "per_token_cost_ms": {},
        "priced_offload_gib": offload or None,  # the offload the host need and costs are for
    }
    if offload > 0:
        b = host_budget(offload, n)
        data["host_need_gib"] = [round(b.low_gib, 1), round(b.high_gib, 1)]
    if total is not None:
        limit = (size.shape.max_model_len if size.shape else None) or p.max_model_len
        if limit:
            data["longest_max_model_len_without_offload"] = longest_fitting_len(
                size.total_bytes, size.shape, tp=n, gpu_total=total,
                utilization=ctx.gpu_memory_utilization, limit=limit,
                kv_cache_dtype=opts.kv_cache_dtype,
            )  # fmt: skip
    if offload > 0:
        data["per_token_cost_ms"] = {
            name: round(step_cost_ms(offload, gbs * PRACTICAL_FRACTION), 1)
            for name, gbs in _links(ctx).items()
        }
    return data


def _links(ctx: Context) -> dict[str, float]:
    """The links to price a token on: --link-gbs, else the GPU's own, else PCIe gen4 and gen5 x16."""
    given = ctx.options.link_gbs
    if given is not None:
        return {f"--link-gbs {given:g}": given}
    gpus = [] if ctx.nvml.error else ctx.used_gpus()
    if gpus and ctx.options.gpu_memory_gib is None:
        g = gpus[0]
        now = link_bandwidth_gbs(g.pcie_gen, g.pcie_width)
        if now is not None:
            return {f"PCIe gen{g.pcie_gen} x{g.pcie_width}": now}
    return {"PCIe gen4 x16": pcie_bandwidth_gbs(4, 16) or 0.0,
            "PCIe gen5 x16": pcie_bandwidth_gbs(5, 16) or 0.0}  # fmt: skip


def _plan_extras(data: dict[str, Any]) -> list[str]:
    out = []
    longest = data["longest_max_model_len_without_offload"]
    if longest is not None:
        out.append(
            "longest --max-model-len that fits without offload: "
            + (f"{longest:,}" if longest else "none (the weights alone do not fit)")
        )
    costs = data["per_token_cost_ms"]
    if costs:
        each = ", ".join(f"{ms:g} ms on {name}" for name, ms in costs.items())
        what = f"{data['priced_offload_gib']:g} GiB"
        out.append(
            f"each generated token reads {what} over the link: at least {each} "
            f"({PRACTICAL_FRACTION:.0%} of the link rate)"
        )
    if data["host_need_gib"]:
        low, high = data["host_need_gib"]
        out.append(f"host memory for that offload: {need_range(low, high)}")
    return out


def _gpu_total(ctx: Context) -> tuple[float | None, str]:
    """The per-GPU size to plan for, and where it comes from."""
    planned = ctx.options.gpu_memory_gib
    if planned is not None:
        return planned * GIB, f"--gpu-memory-gib {planned:g}"
    if ctx.nvml.error or not ctx.nvml.gpus:
        return None, "no GPU found"
    totals = [g.memory_usable for g in ctx.used_gpus() if g.memory_usable]
    if not totals:
        return None, "GPU memory size unknown"
    return min(totals), "smallest used GPU, less the driver's reserve"


def _for_length(p: FitPlan) -> str:
    return f" with max-model-len {p.max_model_len}" if p.kv_cache is not None else ""


def _kv_room(p: FitPlan, offload: float) -> str:
    tokens = p.kv_tokens(offload)
    return "" if tokens is None else f", KV cache for about {tokens:,} tokens"


def _kv_dtype(kv_cache_dtype: str | None) -> str:
    return f", --kv-cache-dtype {kv_cache_dtype}" if kv_cache_dtype not in (None, "auto") else ""


def _need_details(size: ModelSize, p: FitPlan, n: int, opts_kv: str | None) -> list[str]:
    out = [
        f"weights: {gib(size.total_bytes)} ({size.source})"
        + (f", dtype {size.dtype}" if size.dtype else ""),
        f"per GPU: {gib(p.weights)} (tensor parallel {n})",
    ]
    shape = size.shape
    if shape is None:
        out.append("KV cache and activations: unknown (config.json lacks the shape): not counted")
    elif p.kv_cache is None:
        why = shape.kv_unknown or "no max-model-len in config.json (pass --max-model-len)"
        out.append(f"KV cache: unknown ({why}): not counted, the need is a lower bound")
    else:
        per_token = (p.kv_per_token or 0) / 1024
        out.append(
            f"KV cache for one {p.max_model_len}-token request: {gib(p.kv_cache)} "
            f"({per_token:,.0f} KiB per token per GPU{_kv_dtype(opts_kv)})"
        )
    if p.activation is not None:
        out.append(
            f"activation peak of vLLM's profiling pass: {gib(p.activation)} "
            f"({p.tokens} batched tokens)"
        )
    out.append(f"non-torch overhead: {gib(p.overhead)} (CUDA context, workspaces, sampler)")
    out.append(f"needed per GPU without offload: {gib(p.need)}")
    if size.quantized:
        out.append("quantized checkpoint: sizes are what is on disk")
    out.append("embeddings and lm_head are never offloaded")
    return out


def _budget_details(ctx: Context, p: FitPlan, gpu: str) -> list[str]:
    if p.budget is None:
        return []
    util = ctx.gpu_memory_utilization
    if ctx.options.gpu_memory_utilization is None:
        version = ctx.vllm_version
        source = f", vLLM {version}'s default" if version else ", current vLLM's default"
    else:
        source = ""
    return [f"GPU budget: {gib(p.budget)} ({util:g} × {gpu}{source})"]
