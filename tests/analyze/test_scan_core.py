"""The compiled scan core finds what the reference finds: Hyperscan's prefilter the lines RE2's
does, the C binary check what the per-byte count said."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pytest
from found_lines import found_lines
from hypothesis import given
from hypothesis import strategies as st

from vllm_offload_doctor.analyze import engine as analyze
from vllm_offload_doctor.analyze import logread
from vllm_offload_doctor.analyze.patterns import block_scanner

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT.parent / "shared" / "corpus"
LOGS = sorted(
    [
        *ROOT.glob("fixtures/**/*.log"),
        *ROOT.glob("tests/pasted/*.log"),
        *ROOT.glob("tests/unseen/*.log"),
        *(CORPUS.glob("*.log") if CORPUS.is_dir() else ()),
    ]
)


def test_hyperscan_finds_the_lines_re2_finds() -> None:
    engine = analyze.Engine()
    words = engine.prefilter_words()
    served = set(engine.prefilter_words(served=True))
    scan = block_scanner(words)
    if scan is None:
        pytest.skip("hyperscan is not installed here (an optional dependency): RE2 only")
    crafted = b"x\nKV CACHE SIZE: 5 tokens\nmodel runner\n\xff\xfeERROR\n" + b"a" * 5000
    for data in [crafted, *(p.read_bytes() for p in LOGS)]:
        every, only = scan(data, [None, [wi in served for wi in words]])
        assert found_lines(every, data) == found_lines(engine._find, data)
        assert found_lines(only, data) == found_lines(engine._find_served, data)
    assert len(LOGS) > 20


def _per_byte(sample: bytes) -> bool:
    """looks_binary as it was: a generator over every byte."""
    window = sample[:8192]
    if b"\x00" in window:
        window = logread.NUL_HOLE.sub(b"", window)
        if b"\x00" in window or not window:
            return True
    text = sum(1 for b in window if b in b"\t\n\r\f\x1b" or 32 <= b < 127 or b >= 128)
    return text / len(window) < 0.85


@given(st.binary(min_size=1, max_size=9000))
def test_the_binary_check_counts_as_the_per_byte_one_did(sample: bytes) -> None:
    assert logread.looks_binary(sample) == _per_byte(sample)


def test_the_binary_check_on_text_and_on_binary() -> None:
    assert not logread.looks_binary(b"INFO 12-02 ready\n" * 100)
    assert logread.looks_binary(bytes(range(1, 32)) * 100)


def test_the_line_memo_forgets_the_least_recent_lines_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_offload_doctor.analyze import repeats

    monkeypatch.setattr(repeats, "MEMO_CHARS", 30)
    memo = repeats.Memo()
    for key in ("a", "b", "c"):
        memo.remember(key, 10, key.upper())
    assert memo.get("a") == "A"  # used: now the most recent
    memo.remember("d", 10, "D")  # full: "b", the least recent, goes; nothing else
    assert [memo.get(k) for k in "abcd"] == ["A", None, "C", "D"]
    assert memo.chars == 30 and len(memo) == 3


def test_the_pattern_memo_keeps_a_repeated_line_while_new_ones_come(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm_offload_doctor.analyze import patterns

    monkeypatch.setattr(patterns, "MEMO_TEXTS", 4)
    monkeypatch.setattr(patterns, "_SEARCHED", OrderedDict())
    b = patterns.Bounded("x")
    b.search("x repeated")
    for i in range(10):
        b.search(f"x new {i}")
        b.search("x repeated")  # a crash loop's line, seen again
    assert "x repeated" in patterns._SEARCHED and len(patterns._SEARCHED) == 4


def test_a_restart_after_a_served_block_keeps_its_served_words(tmp_path: Path) -> None:
    # A start that served through a whole 4 MiB block, then a restart whose only sign of running
    # is a stats line (a word the prefilter drops once the current start served): the prefilter
    # chooses per line, for the start it is in, so the restart is seen running on both paths.
    banner = (
        "(APIServer pid={p}) INFO 12-02 10:00:0{s} [api_server.py:1] vLLM API server version 0.25.1"
    )
    args = (
        "(APIServer pid={p}) INFO 12-02 10:00:0{s} [utils.py:1] non-default args: {{'model': '/m'}}"
    )
    served = '(APIServer pid=1) INFO:     127.0.0.1:5 - "POST /v1/completions HTTP/1.1" 200 OK '
    lines = [
        banner.format(p=1, s=0),
        args.format(p=1, s=0),
        "(APIServer pid=1) INFO 12-02 10:00:01 [launcher.py:1] Application startup complete.",
        *[served + "x" * 60] * 60_000,
        banner.format(p=2, s=2),
        args.format(p=2, s=2),
        "(APIServer pid=2) INFO 12-02 10:00:03 [loggers.py:1] Engine 000: Avg prompt throughput: "
        "10.0 tokens/s, Running: 1 reqs",
    ]
    path = tmp_path / "served.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert path.stat().st_size > 2 * logread.BLOCK
    engine = analyze.Engine()
    runs_of = [(r.first_line, r.verdict.category.value) for r in engine.analyze_file(path).runs]
    assert runs_of == [
        (r.first_line, r.verdict.category.value) for r in engine.analyze_lines(lines).runs
    ]
    assert runs_of == [(1, "healthy")]
