"""A mode's log through the analyze engine: its verdict as compare records it, and its facts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vllm_offload_doctor.compare.records import ModeAnalysis

if TYPE_CHECKING:
    from vllm_offload_doctor.analyze.model import Analysis, Facts

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
        category=v.category,
        rule_id=v.rule_id,
        title=v.title,
        summary=v.summary,
        severity=v.severity,
        remedy=v.remedy,
        links=tuple(v.links),
        offload_status=a.offload.status,
        offload_explanation=a.offload.explanation,
        ranks_disagree=a.offload.ranks_disagree,
        evidence=decisive_lines(a),
    )


def read_mode_log(path: Path, name: str) -> tuple[ModeAnalysis, Facts, str | None]:
    """A mode's log through the analyze engine: its verdict, its facts, its last notable line."""
    from vllm_offload_doctor.analyze.engine import analyze_file

    a = analyze_file(path, display_name=name)
    last = a.notable[-1].text if a.notable else None
    return mode_analysis(a), a.facts, last
