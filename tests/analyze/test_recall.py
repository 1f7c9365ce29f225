"""Starts seen before (recall.py): templates learned from two sightings, and the engine's skips.

The engine recalls a start only from its third sighting, with the analysis its first two
taught; every test holds the result to the line-by-line engine (OFFLOAD_DOCTOR_PURE=1), byte
for byte in analyze's JSON.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from vllm_offload_doctor.analyze import engine as analyze
from vllm_offload_doctor.analyze import logread, recall
from vllm_offload_doctor.analyze.model import Evidence
from vllm_offload_doctor.analyze.render import Renderer

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT.parent / "shared" / "corpus"
CORPUS_LOGS = sorted(CORPUS.glob("*.log")) if CORPUS.is_dir() else []
# vLLM's own logs (the pasted reports of tests/ hold command lines that begin no start).
VLLM_LOGS = sorted(ROOT.glob("fixtures/**/*.log"))
HEALTHY = ROOT / "fixtures" / "logs" / "healthy-0.25.1.log"
OOM = ROOT / "fixtures" / "logs" / "oom-weights-0.25.1.log"


# -- templates -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Found:
    line: int
    text: str
    evidence: tuple[Evidence, ...]
    extra: dict[str, float]


def _found(base: int, text: str = "x") -> _Found:
    return _Found(
        base + 4,
        f'stopped (line {base + 4}): {text} at line 12, File "a.py", line 7',
        (Evidence(base + 1, "ERROR 12-02 10:00:01 step 3"), Evidence(base + 9, "pid=42")),
        {"gib": 1.5},
    )


def test_a_template_moves_every_line_number_and_nothing_else() -> None:
    learned = recall.template(_found(100), _found(250), 150)
    assert recall.build(learned, 0) == _found(100)
    assert recall.build(learned, 150) == _found(250)
    assert recall.build(learned, 1000) == _found(1100)  # 999 -> 1104: a digit more is fine


@pytest.mark.parametrize(
    "second",
    [
        dataclasses.replace(_found(250), text="stopped (line 254): y at line 12"),  # other words
        dataclasses.replace(_found(250), line=255),  # moved by another distance
        dataclasses.replace(_found(250), extra={"gib": 2.0}),  # a number that is no line
        dataclasses.replace(_found(250), extra={"tib": 1.5}),  # other keys
        dataclasses.replace(_found(250), evidence=(Evidence(251, "x"),)),  # fewer
        dataclasses.replace(
            _found(250), text='stopped (line 254): x at line 012, File "a.py", line 7'
        ),  # a leading zero is no line number
    ],
)
def test_a_template_refuses_any_other_difference(second: _Found) -> None:
    with pytest.raises(recall.Differs):
        recall.template(_found(100), second, 150)


def test_a_type_it_does_not_know_is_refused() -> None:
    with pytest.raises(recall.Differs):
        recall.template({1, 2}, {1, 3}, 1)


@pytest.mark.skipif(not CORPUS_LOGS, reason="../shared/corpus is absent (it lives beside the repo)")
def test_the_template_of_every_corpus_analysis_predicts_a_third_place() -> None:
    # Blank lines in front move every line of a log and change nothing else: what two places
    # teach must give the analysis at a third, exactly.
    engine = analyze.Engine()
    learned = 0
    for log in CORPUS_LOGS:
        text = log.read_bytes().decode("utf-8", "replace")
        at = [engine.analyze_lines(("\n" * k + text).split("\n"), name="x") for k in (0, 5, 17)]
        try:
            t = recall.template(at[0], at[1], 5)
        except recall.Differs:
            continue
        learned += 1
        assert recall.build(t, 17) == at[2], log.name
    assert learned >= len(CORPUS_LOGS) * 0.9


# -- the engine ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engines() -> tuple[analyze.Engine, analyze.Engine]:
    fast, pure = analyze.Engine(), analyze.Engine()
    pure.fast = False
    return fast, pure


def _json(engine: analyze.Engine, path: Path) -> str:
    return Renderer(color=False).json([engine.analyze_file(path, display_name="log")], [])


def _recalls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    real = analyze._State.recall_start

    def watch(self: analyze._State, no: int, entry: recall.Entry, learned: recall.Learned) -> None:
        seen.append(no)
        real(self, no, entry, learned)

    monkeypatch.setattr(analyze._State, "recall_start", watch)
    return seen


def _joined(logs: list[Path], times: int) -> str:
    texts = [p.read_bytes().decode("utf-8", "replace") for p in logs]
    return "".join(t if t.endswith("\n") else t + "\n" for t in texts) * times


@pytest.mark.parametrize("which", ["fixtures", "corpus"])
@pytest.mark.parametrize("block", [None, 64 << 10])
def test_every_log_three_times_is_recalled_and_agrees(
    engines: tuple[analyze.Engine, analyze.Engine],
    which: str,
    block: int | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logs = VLLM_LOGS if which == "fixtures" else CORPUS_LOGS
    if not logs:
        pytest.skip("../shared/corpus is absent (it lives beside the repo)")
    if block:  # blocks of 64 KiB: starts straddle block ends
        monkeypatch.setattr(logread, "BLOCK", block)
        monkeypatch.setattr(analyze, "HYPERSCAN_BLOCK", 0)
    recalled = _recalls(monkeypatch)
    path = tmp_path / "all.log"
    path.write_text(_joined(logs, 3), encoding="utf-8")
    fast, pure = engines
    assert _json(fast, path) == _json(pure, path)
    # The third time, the starts judged twice before are skipped.
    third = path.read_text(encoding="utf-8").count("\n") * 2 // 3
    assert len([no for no in recalled if no > third]) >= 10


def test_a_start_whose_pids_differ_is_fed_in_full_and_agrees(
    engines: tuple[analyze.Engine, analyze.Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    healthy, oom = HEALTHY.read_text(encoding="utf-8"), OOM.read_text(encoding="utf-8")
    other = re.sub(r"pid=(\d+)", lambda m: f"pid={int(m[1]) + 5}", oom)
    recalled = _recalls(monkeypatch)
    path = tmp_path / "log.log"
    path.write_text((healthy + oom + healthy + other) * 3, encoding="utf-8")
    fast, pure = engines
    assert _json(fast, path) == _json(pure, path)
    # Byte for byte, only the healthy start and the first OOM one come back: the second OOM one's
    # pids differ, and its window (up to the next start's first line) too.
    assert recalled


def test_memory_for_starts_is_bounded(
    engines: tuple[analyze.Engine, analyze.Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recall.Seen, "MAX_BYTES", 4096)  # fewer bytes than one start holds
    recalled = _recalls(monkeypatch)
    path = tmp_path / "log.log"
    path.write_text(_joined(VLLM_LOGS, 3), encoding="utf-8")
    fast, pure = engines
    assert _json(fast, path) == _json(pure, path)
    assert not recalled


def test_a_careless_template_would_show(
    engines: tuple[analyze.Engine, analyze.Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agreement above is worth something only if a recalled start's line numbers matter:
    # a template that keeps the first sighting's numbers must change the JSON.
    path = tmp_path / "all.log"
    path.write_text(_joined(VLLM_LOGS, 3), encoding="utf-8")
    fast, pure = engines
    expected = _json(pure, path)
    real = recall.build
    monkeypatch.setattr(recall, "build", lambda part, shift: real(part, 0))
    assert _json(fast, path) != expected
