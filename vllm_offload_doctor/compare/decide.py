"""The verdict, from typed modes: did offload take effect, was it ignored, did it make a model fit.

Pure functions: `compare_pair(base, off)` judges one offload mode against the baseline,
`decide(comparisons)` picks the report's verdict. A baseline that cannot load for lack of GPU
memory is the expected start for a model that needs offload, not the end of the test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from vllm_offload_doctor import links as links_mod
from vllm_offload_doctor import runner
from vllm_offload_doctor.analyze.model import Category, Facts, OffloadStatus
from vllm_offload_doctor.compare.config import V1_RUNNER_ENV, fmt_gb
from vllm_offload_doctor.compare.hostmem import SPARED
from vllm_offload_doctor.compare.model import (
    CompareStatus,
    Comparison,
    Figures,
    Finding,
    ModeResult,
    ModeStatus,
    Pair,
    Performance,
    RankView,
    Verdict,
)
from vllm_offload_doctor.compare.performance import performance, solo_performance
from vllm_offload_doctor.machine.fit import GIB, ModelShape, plan

MRV2_LINKS = links_mod.MRV2
MRV2_REMEDY = (
    "Set VLLM_USE_V2_MODEL_RUNNER=0 (vLLM 0.22-0.27.x), or upgrade to vLLM >= 0.28.0, "
    "whose V2 model runner installs the offloader."
)
# Failures offload can change: the weights or the KV cache did not fit in GPU memory.
MEMORY_CATEGORIES = frozenset({Category.OOM_WEIGHTS, Category.OOM_KV_CACHE})
NO_CAUSE = (Category.HEALTHY, Category.UNKNOWN)  # a verdict that names no root cause


def _version(text: str | None) -> Version | None:
    if not text:
        return None
    try:
        return Version(text.split("+", 1)[0])
    except InvalidVersion:
        return None


def has_escape_hatch(version: str | None) -> bool:
    """vLLM 0.22-0.27.x default to the V2 runner and let VLLM_USE_V2_MODEL_RUNNER=0 undo it."""
    v = _version(version)
    return v is not None and runner.has_escape_hatch(v)


def runner_remedy(version: str | None) -> str:
    v = _version(version)
    if v is not None and has_escape_hatch(version):
        return (
            f"Set {V1_RUNNER_ENV[0]}={V1_RUNNER_ENV[1]} (vLLM {v} defaults to the V2 model runner, "
            "which ignores --cpu-offload-gb before 0.28.0), or upgrade to vLLM >= 0.28.0."
        )
    return MRV2_REMEDY


def gpu_util_default(version: str | None) -> float:
    """vLLM's default --gpu-memory-utilization for the release a log or server names."""
    return runner.default_gpu_memory_utilization(_version(version))


def nvsmi_note(version: str | None, configured: float | None) -> str:
    util = (
        f"{configured:g} as configured"
        if configured is not None
        else f"{gpu_util_default(version):g} by default for vLLM {version or '>= 0.20'}"
    )
    return (
        "nvidia-smi totals barely move with offloading: vLLM reserves gpu_memory_utilization "
        f"({util}) of the card at startup and the KV cache takes whatever the offloaded weights "
        "free. Compare `Model loading took` (weights on GPU) and the KV cache size instead."
    )


def version_of(mode: ModeResult) -> str | None:
    if mode.served and mode.served.server_version:
        return mode.served.server_version
    return mode.log_facts.vllm_version if mode.log_facts else None


def out_of_memory(mode: ModeResult) -> bool:
    """The mode could not start for lack of GPU memory: weights, KV cache, or a CUDA OOM later in
    start-up (profiling, graph capture), all of which offloaded weights make room for. Not when
    another process holds the memory (oom_gpu_util): offload cannot change that."""
    a = mode.analysis
    if mode.ok or a is None:
        return False
    started = mode.log_facts is not None and mode.log_facts.reached_ready
    return a.category in MEMORY_CATEGORIES or (a.category is Category.OOM_RUNTIME and not started)


def offload_installed(mode: ModeResult) -> bool:
    f = mode.log_facts
    return f is not None and (
        f.offloader is not None
        or bool(f.offloaded_gib)
        or any(r.offloader or r.offloaded_gib for r in f.ranks.values())
    )


def _lower(title: str) -> str:
    """A title inside a sentence: 'No room left' -> 'no room left', 'CUDA OOM' unchanged."""
    if len(title) > 1 and title[0].isupper() and not title[1].isupper():
        return title[0].lower() + title[1:]
    return title


def _gib(v: float | None) -> str:
    return "?" if v is None else f"{v:g}"


def _mode_words(mode: ModeResult, which: str) -> str:
    return f"The {which} mode (--cpu-offload-gb {fmt_gb(mode.offload_gb)})"


def failure(mode: ModeResult, which: str) -> Finding:
    """A mode that did not serve, with the root cause its log names."""
    a = mode.analysis
    reason = mode.reason or str(mode.status)
    title = f"the {which} mode failed"
    summary = f"{_mode_words(mode, which)} failed: {reason}."
    cat = a.category if a else None
    if mode.status == ModeStatus.UNAUTHORIZED:
        title = f"the {which} mode refused the requests: 401, the server wants an API key"
    elif a and cat not in NO_CAUSE:
        summary += f" Its log names the root cause ({cat}): {_lower(a.summary)}"
        title = f"the {which} mode failed: {_lower(a.title) or cat}"
    elif mode.status == ModeStatus.TIMEOUT:
        summary += (
            f" Its log ends in the phase '{mode.phase}'; raise --timeout if it was still "
            "making progress, else read the log."
        )
    elif a:
        summary += " Its log names no known root cause; read the end of the log."
        if SPARED in a.summary:  # what host memory did during that silent death
            summary += " " + a.summary[a.summary.index(SPARED) :]
    if (not a or cat in NO_CAUSE) and mode.last_error_line:
        summary += f" Last error line: {mode.last_error_line}"
    if mode.analysis_error:
        summary += f" ({mode.analysis_error})"
    notes: list[str] = []
    links = list(a.links) if a else []
    remedy = a.remedy if a else ""
    if a and a.offload_status is OffloadStatus.IGNORED:
        notes.append(
            "analyze also found that --cpu-offload-gb was silently ignored in this mode: "
            f"{a.offload_explanation}".strip()
        )
        links += [link for link in MRV2_LINKS if link not in links]
        remedy = remedy or runner_remedy(version_of(mode))
    if a:  # the lines it failed on, so "the evidence" the remedy names is on the page
        notes += [f"{mode.log} line {n}: {t}" for n, t in a.evidence]
    return Finding(CompareStatus.FAILED, title, summary, remedy, tuple(links), tuple(notes))


def _expected(requested: float, base_load: float | None) -> float:
    """The weights a request can move: not more than what the baseline holds."""
    if base_load is None:
        return requested
    return max(0.0, min(requested, base_load * 0.95))


def _delta(b: float | None, o: float | None) -> float | None:
    return round(b - o, 3) if b is not None and o is not None else None


def rank_view(bf: Facts, of: Facts, requested: float) -> dict[str, RankView]:
    """Per-rank offload verdict: each TP rank logs its own lines (the budget is per GPU)."""
    view = {}
    for name, r in of.ranks.items():
        b = bf.ranks.get(name)
        bl = b.model_loading_gib if b else None
        delta = _delta(bl, r.model_loading_gib)
        off = r.offloaded_gib
        if (off is not None and off > 0) or (
            delta is not None and delta >= 0.5 * _expected(requested, bl)
        ):
            status = "effective"
        elif delta is not None and abs(delta) < max(0.05, 0.2 * requested):
            status = "ignored"
        else:
            status = "unknown"
        view[name] = RankView(off, Pair(bl, r.model_loading_gib), delta, status)
    return view


def _ignored(off: ModeResult, of: Facts, fig: Figures) -> Finding:
    a = off.analysis
    v2 = of.model_runner == "v2" or (a is not None and a.category is Category.OFFLOAD_IGNORED)
    base_load, off_load = fig.weights_on_gpu_gib.baseline, fig.weights_on_gpu_gib.offload
    summary = (
        f"--cpu-offload-gb {fmt_gb(off.offload_gb)} was requested but nothing moved: "
        f"weights on GPU {_gib(base_load)} vs {_gib(off_load)} GiB"
        " and no `Total CPU offloaded parameters` line."
    )
    if v2:
        summary += (
            f" vLLM {of.vllm_version or '?'} used Model Runner V2, which never installs "
            "the weight offloader before 0.28.0."
        )
    elif a and a.offload_explanation:
        summary += " " + a.offload_explanation
    else:
        summary += (
            " Possible causes: the model does not build its layers with make_layers, a "
            "--cpu-offload-params filter matched nothing, or --offload-backend prefetch."
        )
    links = list(a.links) if a else []
    if v2:
        links += [link for link in MRV2_LINKS if link not in links]
    remedy = (
        runner_remedy(of.vllm_version)
        if v2
        else ((a.remedy if a else "") or "Check the offload flags in the log.")
    )
    return Finding(
        CompareStatus.IGNORED, "offload flag silently ignored", summary, remedy, tuple(links)
    )


def _served_pair(base: ModeResult, off: ModeResult) -> Comparison:
    """Both modes served: did the weights move, and what did it cost."""
    bf, of = base.log_facts or Facts(), off.log_facts or Facts()
    requested = off.offload_gb - base.offload_gb
    ranks = rank_view(bf, of, requested)
    base_load, off_load = bf.model_loading_gib, of.model_loading_gib
    delta = _delta(base_load, off_load)
    fig = Figures(ranks, requested, Pair(base_load, off_load), delta, of.offloaded_gib)

    def cmp(finding: Finding, perf: Performance | None = None) -> Comparison:
        return Comparison(off.offload_gb, base.offload_gb, finding, fig, perf)

    if base.log_facts is None and off.log_facts is None:
        return cmp(
            Finding(
                CompareStatus.INCONCLUSIVE,
                "no log analysis",
                "Both modes ran, but their logs could not be analysed "
                f"({off.analysis_error or base.analysis_error}).",
                "Read mode logs by hand: look for `Total CPU offloaded parameters` and "
                "compare `Model loading took` between the modes.",
            )
        )
    states = {r.status for r in ranks.values()}
    moved = (of.offloaded_gib or 0) > 0 or (bool(ranks) and states == {"effective"})
    fell = delta is not None and delta >= 0.5 * _expected(requested, base_load)
    unchanged = delta is not None and abs(delta) < max(0.05, 0.2 * requested)
    oa = off.analysis
    if (oa is not None and oa.offload_status is OffloadStatus.IGNORED) or (not moved and unchanged):
        return cmp(_ignored(off, of, fig))
    if not (moved or fell):
        missing = [n for n, v in (("baseline", base_load), ("offload", off_load)) if v is None]
        why = (
            f"`Model loading took` is missing from the {' and '.join(missing)} log"
            if missing
            else f"weights on GPU fell by {delta:g} GiB, neither about 0 nor about {requested:g} GiB"
        )
        return cmp(
            Finding(
                CompareStatus.INCONCLUSIVE,
                "no measurable difference",
                f"Cannot tell whether offloading took effect: {why}, and the log has no "
                "`Total CPU offloaded parameters` line.",
                "Check the vLLM version (the offload log lines exist from 0.17), the "
                "--offload-backend, and the mode logs; a larger --offload-gb makes the difference "
                "clearer.",
            )
        )
    if ranks and len(states) > 1:
        bad = sorted(k for k, r in ranks.items() if r.status != "effective")
        return cmp(
            Finding(
                CompareStatus.INCONCLUSIVE,
                "ranks disagree",
                f"Offload took effect on some ranks but not on {', '.join(bad)}.",
                "Read each rank's `Total CPU offloaded parameters` line in the log.",
            )
        )
    notes: list[str] = []
    offloaded = of.offloaded_gib
    if moved and delta is not None and not fell:
        notes.append(
            f"The log reports {offloaded} GiB offloaded, but `Model loading took` fell only "
            f"{delta:g} GiB."
        )
    extra = (offloaded - (bf.offloaded_gib or 0.0)) if offloaded else (delta or 0.0)
    perf = performance(base, off, round(extra, 3))
    summary = (
        f"Offload took effect: {_gib(offloaded) if offloaded else '?'} GiB per GPU in host "
        f"memory; weights on GPU {_gib(base_load)} -> {_gib(off_load)} GiB."
    )
    summary += " " + perf.text if perf.text else ""
    finding = Finding(
        CompareStatus.EFFECTIVE,
        "offload took effect",
        summary,
        "",
        (),
        tuple(notes) + perf.notes,
    )
    return cmp(finding, perf)


@dataclass(frozen=True, slots=True)
class Need:
    """How much offload per GPU would make the model fit, and what the figure rests on."""

    gib: float
    lower_bound: bool
    why: str

    @property
    def flag(self) -> int:
        """The smallest whole --offload-gb the estimate allows."""
        return math.ceil(self.gib + (0.01 if self.lower_bound else 0.0))

    def words(self) -> str:
        if self.lower_bound:
            return (
                f"More than {self.gib:g} GiB per GPU is needed: {self.why}. "
                f"Try --offload-gb {self.flag} or more."
            )
        return (
            f"About {self.gib:g} GiB per GPU would be needed: {self.why}. "
            f"Try --offload-gb {self.flag}."
        )


def needed_offload(
    off: ModeResult,
    weights_per_gpu_gib: float | None,
    util: float,
    max_model_len: int | None = None,
    shape: ModelShape | None = None,
    tp: int = 1,
) -> Need | None:
    """How much offload would make the model fit, from the mode's own log figures first.

    The weights loaded but one request's KV cache did not fit: what was offloaded plus the
    shortfall the log states. No KV memory at all: a lower bound (the KV cache of one request comes
    on top). The weights did not load: with the model's size known, check's fit model
    (`machine.fit.plan`: weights, one request's KV cache, the activation peak, non-torch overhead)
    against util x the GPU the log names; else a lower bound.
    """
    f = off.log_facts or Facts()
    done = f.offloaded_gib or off.offload_gb
    per_request = (
        f"one request of max-model-len {max_model_len}" if max_model_len else "one request"
    )
    if f.kv_needed_gib is not None and f.kv_available_gib is not None:
        short = max(0.0, f.kv_needed_gib - f.kv_available_gib)
        return Need(
            round(off.offload_gb + short, 2),
            False,
            f"{per_request} needs {f.kv_needed_gib:g} GiB of KV cache and "
            f"{f.kv_available_gib:g} GiB was left, {short:.2f} GiB short",
        )
    kv = f.kv_cache_gib
    if f.model_loading_gib is not None and kv is not None and kv <= 0:
        return Need(
            round(off.offload_gb - kv, 2),
            True,
            f"the weights loaded ({f.model_loading_gib:g} GiB on the GPU, {done:g} GiB offloaded) "
            f"but {kv:g} GiB was left for the KV cache, and the KV cache of {per_request} comes on "
            "top (the log does not say how much)",
        )
    total = f.oom_total_gib or f.gpu_total_gib
    if weights_per_gpu_gib is not None and total:
        p = plan(
            weights_per_gpu_gib * tp * GIB, shape, tp=tp, gpu_total=total * GIB,
            utilization=util, max_model_len=max_model_len,
        )  # fmt: skip
        short = (p.to_offload or 0.0) / GIB
        gib = max(off.offload_gb, math.ceil(short * 100) / 100)  # up: never below the need
        parts = [f"{weights_per_gpu_gib:.1f} GiB of weights per GPU"]
        if p.kv_cache is not None:
            parts.append(f"{p.kv_cache / GIB:.2f} GiB of KV cache for {per_request}")
        if p.activation is not None:
            parts.append(f"{p.activation / GIB:.2f} GiB of activation peak")
        parts.append(f"{p.overhead / GIB:g} GiB non-torch overhead")
        return Need(
            gib,
            p.kv_cache is None,  # without the model's shape the KV cache comes on top
            f"{', '.join(parts)} against {util:g} x {total:g} GiB (check's fit model)",
        )
    if f.oom_tried_gib is not None and f.oom_free_gib is not None:
        gap = max(0.0, f.oom_tried_gib - f.oom_free_gib)
        return Need(
            round(off.offload_gb + gap, 2),
            True,
            f"the allocation that failed was {gap:.2f} GiB short; the weights still to load after "
            "it are not in the log",
        )
    return None


def _needs_offload(base: ModeResult, off: ModeResult, fit: FitInputs) -> Comparison:
    """The baseline did not fit in GPU memory: did the offload mode make it fit?"""
    req = fmt_gb(off.offload_gb)
    why = _lower((base.analysis.title if base.analysis else "") or "out of GPU memory")
    lead = (
        "Without offload"
        if base.offload_gb == 0
        else f"With --cpu-offload-gb {fmt_gb(base.offload_gb)} (the baseline)"
    )
    start = f"{lead} the model does not load: {why}."
    of = off.log_facts

    def cmp(finding: Finding, **kw: object) -> Comparison:
        return Comparison(off.offload_gb, base.offload_gb, finding, **kw)  # type: ignore[arg-type]

    if off.ok:
        offloaded = of.offloaded_gib if of else None
        perf = solo_performance(off, offloaded or off.offload_gb)
        summary = (
            f"{start} --cpu-offload-gb {req} makes it fit: {_gib(offloaded)} GiB per GPU stay in "
            f"host memory and {_gib(of.model_loading_gib if of else None)} GiB of weights on the "
            f"GPU. {perf.text}"
        )
        return cmp(
            Finding(
                CompareStatus.EFFECTIVE,
                f"offload {req} GiB makes the model fit",
                summary.strip(),
                notes=perf.notes,
            ),
            performance=perf,
        )
    oa = off.analysis
    flagged = oa is not None and (
        oa.category is Category.OFFLOAD_IGNORED or oa.offload_status is OffloadStatus.IGNORED
    )
    if (out_of_memory(off) or flagged) and not offload_installed(off):
        version = version_of(off)
        runner = of.model_runner if of else None
        same = (
            oa is not None and base.analysis is not None and oa.category is base.analysis.category
        )
        summary = (
            f"{start} With --cpu-offload-gb {req} it failed {'the same way' if same else 'too'}, "
            "and its log has no offloader line (`Offloader set to ...`, `Total CPU offloaded "
            "parameters`): the flag was silently ignored."
        )
        if runner == "v2":
            summary += (
                f" vLLM {version or '?'} used Model Runner V2, which never installs the weight "
                "offloader before 0.28.0."
            )
        return cmp(
            Finding(
                CompareStatus.IGNORED,
                "offload flag silently ignored",
                summary,
                runner_remedy(version),
                MRV2_LINKS,
            ),
            failed_mode=off.label,
        )
    if out_of_memory(off):
        need = needed_offload(off, fit.weights_gib, fit.util, fit.max_model_len, fit.shape, fit.tp)
        offloaded = of.offloaded_gib if of else None
        moved = f" ({_gib(offloaded)} GiB offloaded)" if offloaded else ""
        title = _lower((off.analysis.title if off.analysis else "") or "out of GPU memory")
        summary = f"{start} --cpu-offload-gb {req} took effect{moved} but is not enough: {title}."
        if need is not None:
            summary += " " + need.words()
        remedy = (
            f"Raise --offload-gb to {need.flag} or more"
            if need is not None
            else "Raise --offload-gb"
        ) + ", lower --max-model-len, or add GPUs (--tensor-parallel-size)."
        return cmp(
            Finding(CompareStatus.FAILED, "not enough offload", summary, remedy),
            failed_mode=off.label,
            needed_gib=need.gib if need is not None else None,
        )
    f = failure(off, "offload")
    return cmp(
        Finding(f.status, f.title, f"{start} {f.summary}", f.remedy, f.links, f.notes),
        failed_mode=off.label,
    )


_UTIL_DEFAULT = runner.default_gpu_memory_utilization(None)  # when the log names no version


@dataclass(frozen=True, slots=True)
class FitInputs:
    """What the 'how much offload is needed' estimate may use beyond the mode's own log."""

    weights_gib: float | None = None  # weights per GPU, when the model is local
    util: float = _UTIL_DEFAULT
    max_model_len: int | None = None
    shape: ModelShape | None = None  # config.json's, for the KV cache and activations
    tp: int = 1


def compare_pair(
    base: ModeResult, off: ModeResult | None, fit: FitInputs | None = None
) -> Comparison:
    """The verdict for one offload mode against the baseline."""
    if not base.ok:
        if off is not None and out_of_memory(base):
            return _needs_offload(base, off, fit or FitInputs())
        f = failure(base, "baseline")
        return Comparison(
            off.offload_gb if off else None, base.offload_gb, f, failed_mode=base.label
        )
    assert off is not None
    if not off.ok:
        return Comparison(
            off.offload_gb, base.offload_gb, failure(off, "offload"), failed_mode=off.label
        )
    return _served_pair(base, off)


def with_fix(c: Comparison, fix: Comparison, env: str) -> Comparison:
    """Record what the --verify-fix re-run showed on an `ignored` comparison."""
    works = fix.status == CompareStatus.EFFECTIVE
    f = c.finding
    told = fix.finding.summary
    first = f.summary.split(". ", 1)[0] + ". "
    if told.startswith(first):  # both begin with the same baseline sentence: say it once
        told = told[len(first) :]
    if works:
        line = f"Verified: with {env} the same offload mode works. {told}"
        remedy = f"{f.remedy} Verified here by --verify-fix."
    else:
        line = f"Verified: with {env} the offload mode still does not work. {told}"
        remedy = f.remedy
    summary = f"{f.summary} {line}"
    return Comparison(
        c.offload_gb,
        c.baseline_gb,
        Finding(
            f.status,
            f.title,
            summary,
            remedy,
            f.links,
            tuple(dict.fromkeys(f.notes + fix.finding.notes)),
        ),
        c.figures,
        c.performance,
        c.failed_mode,
        c.needed_gib,
        works,
    )


def decide(comparisons: list[Comparison], served_modes: int, note: str | None) -> Verdict:
    """The worst comparison is the verdict; several offload values list each on its own line."""
    worst = max(comparisons, key=lambda c: c.status.rank)
    notes = list(dict.fromkeys(n for c in comparisons for n in c.finding.notes))
    if note and served_modes >= 2:  # the nvidia-smi note only where memory is compared
        notes.append(note)
    f = worst.finding
    if len(comparisons) == 1:
        return Verdict(Finding(f.status, f.title, f.summary, f.remedy, f.links, tuple(notes)))
    summary = "\n".join(
        f"[offload {fmt_gb(c.offload_gb or 0)} GiB: {c.status}] {c.finding.summary}"
        for c in comparisons
    )
    per = {str(float(c.offload_gb or 0)): str(c.status) for c in comparisons}
    links = tuple(dict.fromkeys(link for c in comparisons for link in c.finding.links))
    return Verdict(Finding(f.status, f.title, summary, f.remedy, links, tuple(notes)), per)
