"""The prefiltered path (analyze_file) and the unfiltered one (analyze_lines) agree on every log.

A fact or rule whose words are missing from the prefilter would be found by `analyze_lines`
and lost by `analyze_file`; this compares verdict, offload status and facts on every fixture
and corpus log. Repeated lines (a crash loop) replayed from their first sight must give what
processing each of them in full gives.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
from crash_loops import crash_loop

from vllm_offload_doctor.analyze import engine as analyze
from vllm_offload_doctor.analyze.patterns import declared, literal_matcher, span_finder

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT.parent / "shared" / "corpus"
FIXTURE_LOGS = sorted(
    [
        *ROOT.glob("fixtures/**/*.log"),
        *ROOT.glob("tests/pasted/*.log"),
        *ROOT.glob("tests/unseen/*.log"),
    ]
)
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
        # Each server start (runs.py) split at the same lines and judged alike on every path.
        "runs": [
            (
                r.first_line,
                r.last_line,
                r.starts,
                r.verdict.category.value,
                r.verdict.rule_id,
                r.offload.status.value,
            )
            for r in a.runs
        ],
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
    from vllm_offload_doctor.analyze import patterns
    from vllm_offload_doctor.analyze.patterns import declare

    d = declare(r"took (?P<s>\d+) s", "seconds")
    try:
        assert d.search("took 5 s") is None
        assert d.search("took 5 s (seconds)") is not None
    finally:
        patterns._DECLARED.remove(d)  # engines made later must not see this test's pattern


def test_a_missing_prefilter_word_makes_the_paths_disagree() -> None:
    # The check above is only worth something if it notices a word the prefilter lacks.
    log = ROOT / "fixtures" / "logs" / "offload-effective-v1-0.25.1.log"
    engine = analyze.Engine()
    words = [
        (w, i) for w, i in engine.prefilter_words() if w not in ("Total CPU offloaded", "offload")
    ]
    engine._prefilter = literal_matcher(words)
    engine._find = span_finder(engine._prefilter)
    filtered = engine.analyze_file(log)
    unfiltered = engine.analyze_lines(log.read_text(encoding="utf-8").split("\n"), name=str(log))
    assert unfiltered.facts.offloaded_gib
    assert filtered.facts.offloaded_gib is None
    assert _summary(filtered) != _summary(unfiltered)


def _full_and_replayed(lines: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    engine = analyze.default_engine()
    replayed = engine.analyze_lines(lines)
    with monkeypatch.context() as m:
        m.setattr(analyze._State, "replay", False)
        full = engine.analyze_lines(lines)
    assert _summary(replayed) == _summary(full)
    assert [f.evidence for f in replayed.findings] == [f.evidence for f in full.findings]


@pytest.mark.parametrize("log", FIXTURE_LOGS + CORPUS_LOGS, ids=lambda p: p.name)
def test_replayed_repeats_give_what_full_processing_gives(
    log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _full_and_replayed(crash_loop(log.read_bytes().decode("utf-8", "replace"), 3), monkeypatch)


def test_a_long_crash_loop_keeps_the_verdict_of_one_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 150 restarts log more traceback frames than the engine keeps: the first ones must stay.
    text = (ROOT / "fixtures" / "logs" / "oom-weights-0.25.1.log").read_text(encoding="utf-8")
    one = analyze.analyze_lines(text.split("\n"))
    lines = crash_loop(text, 150)
    assert sum(", line " in line for line in lines) > 5000
    looped = analyze.analyze_lines(lines)
    assert one.verdict.category.value == "oom_weights"
    assert (looped.verdict.category, looped.verdict.rule_id) == (
        one.verdict.category,
        one.verdict.rule_id,
    )
    _full_and_replayed(lines, monkeypatch)


def test_a_flood_of_matching_lines_keeps_the_per_line_state_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With replay off every line is fed in full: the rules a line matched are that line's alone.
    from vllm_offload_doctor.analyze.engine import Engine, _State

    eng = Engine()
    seen: list[int] = []
    feed = _State.feed

    def watch(self: _State, line: object) -> None:
        feed(self, line)  # type: ignore[arg-type]
        seen.append(len(self.matched))

    monkeypatch.setattr(_State, "replay", False)
    monkeypatch.setattr(_State, "feed", watch)
    oom = "(EngineCore pid=7) ERROR 12-02 10:00:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    a = eng.analyze_lines([oom] * 2000)
    assert a.failed and len(seen) == 2000
    assert max(seen) <= len(eng.rules) and seen[-1] == seen[0]


@pytest.mark.parametrize("which", ["fixtures", "corpus"])
def test_every_log_twice_in_one_file_gives_what_full_processing_gives(
    which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The second time a start's lines come they are replayed in a start of their own: a rule's
    # named groups from a replayed line must reach its finding as they do when it is fed.
    from vllm_offload_doctor.analyze.render import Renderer

    logs = FIXTURE_LOGS if which == "fixtures" else CORPUS_LOGS
    if not logs:
        pytest.skip("../shared/corpus is absent (it lives beside the repo)")
    texts = [p.read_bytes().decode("utf-8", "replace") for p in logs]
    lines = "".join(t if t.endswith("\n") else t + "\n" for t in texts * 2).split("\n")[:-1]
    engine = analyze.default_engine()
    with monkeypatch.context() as m:  # a plan kept from a line's first sight, not its second
        m.setattr(analyze._State, "_again", lambda self, key: True)
        replayed = engine.analyze_lines(lines, name="log")
    with monkeypatch.context() as m:
        m.setattr(analyze._State, "replay", False)
        full = engine.analyze_lines(lines, name="log")
    render = Renderer(color=False).json
    assert render([replayed], []) == render([full], [])
