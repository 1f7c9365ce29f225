"""Blocks read ahead by a thread, which scans each one until the engine takes it.

A system call's read and Hyperscan's scan both release the GIL: while the engine works through
one block, a thread reads the next and scans it from its start, a piece at a time. The engine
takes what the thread found so far and scans the rest itself, so the two cores share a big log
whatever their speeds, and the finds are those of the engine's own scan (patterns.block_scanner).
"""

from __future__ import annotations

import queue
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator

from vllm_offload_doctor.analyze.patterns import Piece

PieceScan = Callable[[bytes, int], Piece]

DEPTH = 2  # blocks read ahead: a few MiB each
# The GIL's switch interval while a thread reads ahead. The default 5 ms makes the thread wait
# that long for the GIL after each read or scan it did without it: then it mostly waits.
SWITCH_S = 0.00005


class Ahead:
    """A block, and the pieces the thread scanned from its start before the engine took it."""

    __slots__ = ("_lock", "_pieces", "_taken", "data")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._pieces: list[Piece] = []
        self._lock = threading.Lock()
        self._taken = False

    def take(self) -> list[Piece]:
        """The pieces scanned so far, in order from offset 0; the thread scans no more of it."""
        self._taken = True  # seen before the next piece: the lock waits for one piece at most
        with self._lock:
            return self._pieces

    def _scan(self, scan: PieceScan | None) -> None:
        at, size = 0, len(self.data)
        while scan is not None and at < size:
            with self._lock:
                if self._taken:  # set before take waits for the lock: seen here at the latest
                    return
                piece = scan(self.data, at)
                self._pieces.append(piece)
            at = piece[1]


_END = object()
_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = 0.0


def _lower_switch() -> None:
    global _switch_users, _switch_saved
    with _switch_lock:
        if not _switch_users:
            _switch_saved = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_saved, SWITCH_S))
        _switch_users += 1


def _restore_switch() -> None:
    global _switch_users
    with _switch_lock:
        _switch_users -= 1
        if not _switch_users:
            sys.setswitchinterval(_switch_saved)


class Reads:
    """A file's blocks for the engine, as Ahead records: read by the engine's thread, or, while
    `ahead(True)` holds, by a thread DEPTH blocks ahead that scans each one with `scanner()`'s
    scan (asked as the block is read; None: none) until taken. An error reading is raised where
    its block would have come. close() stops the thread.

    Only a served log's bulk pays for the thread: there the engine mostly waits on Hyperscan,
    which releases the GIL. Where it runs Python (a crash loop, an error-dense log) the thread
    mostly waits for the GIL, and takes it at each RE2 match (which releases it): measured 20 %
    slower on a crash loop, so the engine asks for the thread only while its start serves.
    """

    def __init__(self, blocks: Iterator[bytes], scanner: Callable[[], PieceScan | None]) -> None:
        self._blocks = blocks
        self._scanner = scanner
        self._back: deque[object] = deque()  # what the thread read that the engine did not take
        self._out: queue.Queue[object] = queue.Queue(DEPTH)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __iter__(self) -> Reads:
        return self

    def __next__(self) -> Ahead:
        if self._back:
            item = self._back.popleft()
        elif self._thread is not None:
            item = self._out.get()
        else:
            return Ahead(next(self._blocks))
        if item is _END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, Ahead)
        return item

    def ahead(self, on: bool) -> None:
        """Read ahead in a thread from the next block on, or stop doing so."""
        if on and self._thread is None and not self._back:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="offload-doctor read-ahead", daemon=True
            )
            _lower_switch()
            self._thread.start()
        elif not on:
            self.close()

    def close(self) -> None:
        """Stop the thread; what it read and the engine did not take comes next, unscanned."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        while thread.is_alive() or not self._out.empty():  # a put waiting for room returns
            try:
                item = self._out.get(timeout=0.05)
            except queue.Empty:
                continue
            if isinstance(item, Ahead):
                item._taken = True  # its scan stops; take() gives what it found
            self._back.append(item)
        self._thread = None
        _restore_switch()

    def _run(self) -> None:
        try:
            for data in self._blocks:
                block = Ahead(data)
                self._out.put(block)
                if self._stop.is_set():
                    return
                block._scan(self._scanner())
                if self._stop.is_set():
                    return
            self._out.put(_END)
        except BaseException as exc:  # given to the engine, in order
            self._out.put(exc)
