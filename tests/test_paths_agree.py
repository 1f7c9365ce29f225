"""The prefiltered path (analyze_file) and the unfiltered one (analyze_lines) agree on every log.

A fact or rule whose words are missing from the prefilter would be found by `analyze_lines`
and lost by `analyze_file`; this compares verdict, offload status and facts on every fixture
and corpus log.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from vllm_offload_doctor import analyze
from vllm_offload_doctor.patterns import declared

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"
FIXTURE_LOGS = sorted(ROOT.glob("fixtures/**/*.log"))
CORPUS_LOGS = sorted(CORPUS.glob("*.log")) if CORPUS.is_dir() else []


def _summary(a: analyze.Analysis) -> dict[str, object]:
    return {
        "verdict": a.verdict.category.value,
        "rule": a.verdict.rule_id,
        "offload": a.offload.status.value,
        "facts": asdict(a.facts),
        "summary": a.verdict.summary,
        "findings": [(f.rule_id, [e.line for e in f.evidence]) for f in a.findings],
        "notable": [e.line for e in a.notable],
    }


def _agree(log: Path) -> None:
    engine = analyze.default_engine()
    filtered = engine.analyze_file(log)
    # Lines end at "\n" only, as the streaming reader counts them (a bare "\r" is not a break).
    lines = log.read_bytes().decode("utf-8", "replace").split("\n")
    if lines and not lines[-1]:
        lines.pop()
    unfiltered = engine.analyze_lines(lines, name=str(log))
    assert _summary(filtered) == _summary(unfiltered), log.name


@pytest.mark.parametrize("log", FIXTURE_LOGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_fixture_logs_agree(log: Path) -> None:
    _agree(log)


@pytest.mark.skipif(not CORPUS_LOGS, reason="../shared/corpus is absent (it lives beside the repo)")
@pytest.mark.parametrize("log", CORPUS_LOGS, ids=lambda p: p.name)
def test_corpus_logs_agree(log: Path) -> None:
    _agree(log)


def test_every_declared_pattern_has_its_words_in_the_prefilter() -> None:
    engine = analyze.default_engine()
    for d in declared():
        for word in d.words:
            hay = word.upper() if d.icase else word  # an icase word passes in any case
            assert engine._prefilter.search(hay.encode()), (d, word)


def test_a_pattern_without_its_word_never_matches() -> None:
    # The words gate the pattern on every path, so a wrong word fails tests built on lines too.
    from vllm_offload_doctor.patterns import declare

    d = declare(r"took (?P<s>\d+) s", "seconds")
    assert d.search("took 5 s") is None
    assert d.search("took 5 s (seconds)") is not None
