"""The read-ahead thread (ahead.py) changes when a block is read and scanned, never what is found:
its pieces and the engine's own scan give the finds one scan gives, blocks come in order with a
read's error where it happened, the thread ends with its caller, and a served log read ahead is
judged byte for byte as the line-by-line engine judges it."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from found_lines import found_lines
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_offload_doctor.analyze import ahead, logread, patterns
from vllm_offload_doctor.analyze import engine as analyze
from vllm_offload_doctor.analyze.render import Renderer

ROOT = Path(__file__).resolve().parents[2]
WORDS = [("ERROR", False), ("Traceback", False), ("out of memory", True), ("KV cache", False)]


def _scan_or_skip() -> patterns.BlockScan:
    scan = patterns.block_scanner(WORDS)
    if scan is None:
        pytest.skip("hyperscan is not installed here (an optional dependency): no read-ahead scan")
    return scan


_LINE = st.sampled_from(
    [
        b"plain line",
        b"ERROR here",
        b"an Out Of Memory error",
        b"KV cache 5",
        b"Trace",
        b"",
        b"x" * 300,
    ]
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_LINE, min_size=1, max_size=400), st.integers(0, 50))
def test_pieces_scanned_ahead_give_the_finds_of_one_scan(
    lines: list[bytes], pieces_ahead: int
) -> None:
    scan = _scan_or_skip()
    data = b"\n".join(lines) + b"\n"
    whole = found_lines(scan(data, [None])[0], data)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(patterns, "PIECE", 64)  # many pieces in a short block
        piece = scan.piece_scan()
        pieces: list[patterns.Piece] = []
        while len(pieces) < pieces_ahead and (not pieces or pieces[-1][1] < len(data)):
            pieces.append(piece(data, pieces[-1][1] if pieces else 0))
    assert [p[0] for p in pieces[1:]] == [p[1] for p in pieces[:-1]]  # contiguous, from 0
    assert found_lines(scan(data, [None], pieces)[0], data) == whole
    assert whole == [i for i in _starts(data) if any(w.lower() in _line_at(data, i).lower()
                                                     for w in (b"ERROR", b"Traceback", b"KV cache",
                                                               b"out of memory"))]  # fmt: skip


def _starts(data: bytes) -> list[int]:
    return [0, *(i + 1 for i, c in enumerate(data[:-1]) if c == 10)]


def _line_at(data: bytes, i: int) -> bytes:
    return data[i : data.index(b"\n", i)]


@given(st.binary(max_size=300_000), st.data())
@settings(max_examples=40, deadline=None)
def test_newlines_counts_as_bytes_count(data: bytes, draw: st.DataObject) -> None:
    lo = draw.draw(st.integers(0, len(data)))
    hi = draw.draw(st.integers(lo, len(data)))
    assert logread.newlines(data, lo, hi) == data.count(b"\n", lo, hi)
    assert logread.newlines(data, 0, len(data)) == data.count(b"\n")


def _read_ahead(blocks: Iterator[bytes], scan: ahead.PieceScan | None = None) -> ahead.Reads:
    reads = ahead.Reads(blocks, lambda: scan)
    reads.ahead(True)
    return reads


def _alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "offload-doctor read-ahead"]


def test_blocks_come_in_order_and_the_thread_scans_each_from_its_start() -> None:
    scan = _scan_or_skip()
    blocks = [b"line %d ERROR\n" % i * 3000 for i in range(8)]
    got = []
    for read in _read_ahead(iter(blocks), scan.piece_scan()):
        time.sleep(0.01)  # the engine at work: the thread scans meanwhile
        pieces = read.take()
        assert not pieces or pieces[0][0] == 0
        assert [p[0] for p in pieces[1:]] == [p[1] for p in pieces[:-1]]
        got.append((read.data, pieces))
    assert [data for data, _ in got] == blocks
    assert any(pieces for _, pieces in got)  # the thread did scan ahead
    assert not _alive()


def test_a_read_error_comes_after_the_blocks_read_before_it() -> None:
    def blocks() -> Iterator[bytes]:
        yield b"one\n"
        yield b"two\n"
        raise logread.TruncatedInput("cut")

    got = []
    with pytest.raises(logread.TruncatedInput, match="cut"):
        got.extend(read.data for read in _read_ahead(blocks()))
    assert got == [b"one\n", b"two\n"]
    assert not _alive()


def test_the_thread_ends_with_its_caller_and_the_switch_interval_comes_back() -> None:
    before = sys.getswitchinterval()
    endless = (b"ERROR %d\n" % i * 1000 for i in range(10**9))
    reads = _read_ahead(endless)
    next(reads)
    assert sys.getswitchinterval() <= ahead.SWITCH_S
    assert _alive()
    reads.close()  # the caller stops (an error, Ctrl+C): the thread is gone when close returns
    assert not _alive()
    assert sys.getswitchinterval() == before


def test_blocks_read_ahead_and_not_taken_come_next_when_the_thread_stops() -> None:
    scan = _scan_or_skip()
    blocks = [b"%d ERROR\n" % i * 5000 for i in range(12)]
    reads = _read_ahead(iter(blocks), scan.piece_scan())
    got = [next(reads).data, next(reads).data]
    time.sleep(0.05)  # the thread reads DEPTH blocks ahead meanwhile
    reads.ahead(False)
    assert not _alive()
    got += [read.data for read in reads]  # the ones it read, then the engine's own reads
    assert got == blocks
    reads.ahead(False)  # stopping twice, or when stopped, is a no-op


def test_a_regular_file_is_read_in_whole_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Blocks that end at a line's end are yielded as read: no copy joins a line cut in two.
    monkeypatch.setattr(logread, "BLOCK", 64 << 10)
    monkeypatch.setattr(logread, "_PROBE", 8 << 10)
    lines = [b"line %d " % i + b"y" * (i % 300) for i in range(3000)]
    lines[1500] = b"z" * (20 << 10)  # longer than the probe: that block is read as before
    body = b"\n".join(lines) + b"\n"
    path = tmp_path / "a.log"
    path.write_bytes(body)
    stream = logread.open_source(logread.Source("a.log", path))
    try:
        blocks = list(logread.iter_blocks(stream))
    finally:
        stream.close()
    assert b"".join(blocks) == body
    assert all(b.endswith(b"\n") for b in blocks)
    assert len(blocks) > 4
    # Every block but the first (the encoding check's head) and the long line's comes whole.
    assert sum(len(b) > (64 << 10) - (8 << 10) for b in blocks) >= len(blocks) - 3


def _serving_log(path: Path) -> None:
    start = [
        "(APIServer pid=7) INFO 12-02 10:00:00 [api_server.py:1] vLLM API server version 0.25.1",
        "(APIServer pid=7) INFO 12-02 10:00:00 [utils.py:1] non-default args: "
        "{'model': '/m', 'cpu_offload_gb': 4.0}",
        "(EngineCore pid=9) INFO 12-02 10:00:05 [offloader.py:50] Offloader set to UVAOffloader",
        "(APIServer pid=7) INFO 12-02 10:00:09 [launcher.py:1] Application startup complete.",
    ]
    access = '(APIServer pid=7) INFO:     127.0.0.1:{n} - "POST /v1/completions HTTP/1.1" 200 OK'
    stats = (
        "(APIServer pid=7) INFO 12-02 10:{m:02d}:00 [loggers.py:1] Engine 000: Avg prompt "
        "throughput: {n}.0 tokens/s, Running: 1 reqs, GPU KV cache usage: 1.0%"
    )
    bad = (  # a word the served scan keeps: found in the thread's pieces or the engine's scan
        "(APIServer pid=7) ERROR 12-02 10:{m:02d}:01 [serving_chat.py:1] Error in preprocessing "
        "prompt inputs of request {n}"
    )
    body = list(start)
    for n in range(40_000):
        body.append(access.format(n=n) if n % 7 else stats.format(m=n % 60, n=n))
        if n % 4999 == 4998:
            body.append(bad.format(m=n % 60, n=n))
    body += [
        "(EngineCore pid=9) ERROR 12-02 11:00:00 [core.py:1] torch.OutOfMemoryError: CUDA out of "
        "memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB of which "
        "1.0 GiB is free.",
    ]
    path.write_text("\n".join(body) + "\n", encoding="utf-8")


def test_a_served_log_read_ahead_is_judged_as_the_line_by_line_engine_judges_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _scan_or_skip()
    # Small blocks and pieces: many of each in a 3 MB log, scanned by both threads.
    monkeypatch.setattr(logread, "BLOCK", 128 << 10)
    monkeypatch.setattr(logread, "_PROBE", 8 << 10)
    monkeypatch.setattr(patterns, "PIECE", 8 << 10)
    monkeypatch.setattr(analyze, "HYPERSCAN_BLOCK", 0)
    path = tmp_path / "served.log"
    _serving_log(path)
    taken: list[int] = []
    real_take = ahead.Ahead.take

    def take(self: ahead.Ahead) -> list[patterns.Piece]:
        if len(taken) % 2:
            time.sleep(0.005)  # every other block, the thread gets ahead of the engine
        pieces = real_take(self)
        taken.append(pieces[-1][1] if pieces else 0)
        return pieces

    monkeypatch.setattr(ahead.Ahead, "take", take)
    fast, pure = analyze.Engine(), analyze.Engine()
    pure.fast = False
    render = Renderer(color=False).json
    analysis = fast.analyze_file(path, display_name="log")
    assert len(taken) > 10 and sum(taken) > 0  # blocks read ahead, scanned there in part
    assert render([analysis], []) == render([pure.analyze_file(path, display_name="log")], [])
    assert [r.verdict.category.value for r in analysis.runs] == ["oom_runtime"]


def _small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many blocks and pieces in a 3 MB log; Hyperscan for every block."""
    monkeypatch.setattr(logread, "BLOCK", 128 << 10)
    monkeypatch.setattr(logread, "_PROBE", 8 << 10)
    monkeypatch.setattr(patterns, "PIECE", 8 << 10)
    monkeypatch.setattr(analyze, "HYPERSCAN_BLOCK", 0)


def test_an_error_while_the_thread_reads_ahead_leaves_no_thread_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _scan_or_skip()
    _small_blocks(monkeypatch)
    path = tmp_path / "served.log"
    _serving_log(path)
    real = analyze._State.feed_raw

    def feed_raw(self: analyze._State, no: int, raw: str) -> None:
        if "request 24994" in raw:  # deep in the served bulk: the thread is reading ahead
            assert _alive()
            raise KeyboardInterrupt
        real(self, no, raw)

    monkeypatch.setattr(analyze._State, "feed_raw", feed_raw)
    try:
        analyze.Engine().analyze_file(path)
    except KeyboardInterrupt:  # checked while the error (and its frames) still lives
        assert not _alive()
    else:
        pytest.fail("the interrupt was lost")


def test_a_log_that_never_serves_is_read_without_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # There the engine runs Python, and a thread would mostly wait for the GIL (ahead.Reads).
    _small_blocks(monkeypatch)
    started = []
    real_run = ahead.Reads._run

    def run(self: ahead.Reads) -> None:
        started.append(self)
        real_run(self)

    monkeypatch.setattr(ahead.Reads, "_run", run)
    path = tmp_path / "loop.log"
    start = (ROOT / "fixtures" / "logs" / "oom-weights-0.25.1.log").read_text(encoding="utf-8")
    path.write_text(start * (3_000_000 // len(start)), encoding="utf-8")
    analysis = analyze.Engine().analyze_file(path)
    assert analysis.runs[0].starts > 20  # identical starts, merged into one run
    assert started == []


def test_without_pread_a_file_is_read_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logread, "BLOCK", 64 << 10)
    monkeypatch.setattr(logread, "_PROBE", 8 << 10)
    monkeypatch.delattr(logread.os, "pread")  # Windows
    body = b"".join(b"line %d\n" % i for i in range(40_000))
    path = tmp_path / "a.log"
    path.write_bytes(body)
    stream = logread.open_source(logread.Source("a.log", path))
    try:
        assert b"".join(logread.iter_blocks(stream)) == body
    finally:
        stream.close()
