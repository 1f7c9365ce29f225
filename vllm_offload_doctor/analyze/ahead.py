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


def read_ahead(blocks: Iterator[bytes], scanner: Callable[[], PieceScan | None]) -> Iterator[Ahead]:
    """`blocks` read in a thread, DEPTH ahead; `scanner()`, asked as each block is read, gives
    the scan to run on it until taken (None: none). An error reading is raised where its block
    would have come. The thread stops when the caller stops."""
    out: queue.Queue[object] = queue.Queue(DEPTH)
    stop = threading.Event()

    def run() -> None:
        try:
            for data in blocks:
                block = Ahead(data)
                out.put(block)
                if stop.is_set():
                    return
                block._scan(scanner())
            out.put(_END)
        except BaseException as exc:  # given to the caller, in order
            out.put(exc)

    thread = threading.Thread(target=run, name="offload-doctor read-ahead", daemon=True)
    _lower_switch()
    try:
        thread.start()
        while True:
            item = out.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, Ahead)
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # a put waiting for room returns, then the thread sees stop
            try:
                item = out.get(timeout=0.05)
            except queue.Empty:
                continue
            if isinstance(item, Ahead):
                item._taken = True
        _restore_switch()
