"""Figures compare reads from a mode's raw log itself, and the conversion of analyze's result."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_offload_doctor.compare.records import LogFacts, ModeAnalysis, OomFigures, RankFacts

if TYPE_CHECKING:
    from vllm_offload_doctor.analyze.model import Analysis

MAX_LINE = 16384  # longer lines are cut before any pattern sees them
_UNIT = {"bytes": 2**-30, "KiB": 2**-20, "MiB": 2**-10, "GiB": 1.0}
_OOM = re.compile(
    r"Tried to allocate (?P<t>[\d.]{1,12}) (?P<tu>bytes|KiB|MiB|GiB)\. GPU \d{1,3} has a total "
    r"capacity of (?P<c>[\d.]{1,12}) (?P<cu>bytes|KiB|MiB|GiB) of which (?P<f>[\d.]{1,12}) "
    r"(?P<fu>bytes|KiB|MiB|GiB) is free\.(?: Including non-PyTorch memory, this process has "
    r"(?P<u>[\d.]{1,12}) (?P<uu>bytes|KiB|MiB|GiB) memory in use)?"
)

_KV_NEEDED = re.compile(
    r"\((?P<need>[\d.]{1,12}) GiB KV cache is needed, which is larger than the available KV cache "
    r"memory \((?P<avail>-?[\d.]{1,12}) GiB\)"
)


def _gib(num: str | None, unit: str | None) -> float | None:
    if num is None or unit is None:
        return None
    try:
        return round(float(num) * _UNIT[unit], 3)
    except ValueError:
        return None


def oom_figures(path: Path) -> OomFigures | None:
    """The figures of the last CUDA OOM and of the last KV cache shortfall in the log, if any."""
    found = kv = None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if "Tried to allocate" in line:
                    found = _OOM.search(line[:MAX_LINE]) or found
                if "KV cache is needed" in line:
                    kv = _KV_NEEDED.search(line[:MAX_LINE]) or kv
    except OSError:
        return None
    tried = _gib(found["t"], found["tu"]) if found else None
    kv_need = _gib(kv["need"], "GiB") if kv else None
    if tried is None and kv_need is None:
        return None
    return OomFigures(
        tried,
        _gib(found["c"], found["cu"]) if found else None,
        _gib(found["f"], found["fu"]) if found else None,
        _gib(found["u"], found["uu"]) if found else None,
        kv_need,
        _gib(kv["avail"], "GiB") if kv else None,
    )


def log_facts(a: Analysis, oom: OomFigures | None) -> LogFacts:
    f = a.facts
    ranks = {
        name: RankFacts(r.offloader, r.offloaded_gib, r.model_loading_gib, str(r.status))
        for name, r in sorted(f.ranks.items())
    }
    return LogFacts(
        vllm_version=f.vllm_version,
        model_runner=f.model_runner,
        model_runner_evidence=f.model_runner_evidence,
        cpu_offload_gb=f.cpu_offload_gb,
        tensor_parallel_size=f.tensor_parallel_size,
        offloader=f.offloader,
        offloaded_gib=f.offloaded_gib,
        model_loading_gib=f.model_loading_gib,
        kv_cache_gib=f.kv_cache_gib,
        kv_cache_tokens=f.kv_cache_tokens,
        reached_ready=f.reached_ready,
        ranks=ranks,
        gpu_total_gib=f.gpu_total_gib,
        gpu_free_gib=f.gpu_free_gib,
        oom=oom,
    )


MAX_EVIDENCE = 5
EVIDENCE_CHARS = 400


def decisive_lines(a: Analysis) -> tuple[tuple[int, str], ...]:
    """The lines of the deciding rule's finding, else analyze's most notable lines."""
    decisive = next((f for f in a.findings if f.rule_id == a.verdict.rule_id), None)
    lines = decisive.evidence if decisive and decisive.evidence else a.notable
    return tuple((e.line, e.text[:EVIDENCE_CHARS]) for e in lines[-MAX_EVIDENCE:])


def mode_analysis(a: Analysis) -> ModeAnalysis:
    v = a.verdict
    return ModeAnalysis(
        category=str(v.category),
        rule_id=v.rule_id,
        title=v.title,
        summary=v.summary,
        severity=str(v.severity),
        remedy=v.remedy,
        links=tuple(v.links),
        offload_status=str(a.offload.status),
        offload_explanation=a.offload.explanation,
        ranks_disagree=a.offload.ranks_disagree,
        evidence=decisive_lines(a),
    )


def read_mode_log(path: Path, name: str) -> tuple[ModeAnalysis, LogFacts, str | None]:
    """A mode's log through the analyze engine: its verdict, its figures, its last notable line."""
    from vllm_offload_doctor.analyze.engine import analyze_file

    a = analyze_file(path, display_name=name)
    last = a.notable[-1].text if a.notable else None
    return mode_analysis(a), log_facts(a, oom_figures(path)), last
