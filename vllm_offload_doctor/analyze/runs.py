"""Server starts in one log: where a new one begins, and the per-start results kept.

A file may hold several starts: a restart appended to the same file, a crash-looping pod, two
writers in one file with a hole of NUL bytes between. Each start is judged on its own lines
(engine._State starts afresh at each boundary); the result is the last start's (or, when that one
is cut off and decides nothing, the last start that does).

A start prints its markers once: the command line (first), the version banner and `non-default
args` (in either order: 0.33 prints the args first). A marker that comes again once the start got
past them (a start-up phase, or its end), or a command line after any marker, begins a new start; so does a new pid of the server's own processes once the
start before has ended (a fatal line, a death, a shutdown), and a NUL hole.

Only lines that hold a word of the engine's prefilter may move a boundary, so the streaming path
(which sees those lines only) and the line-by-line path split at the same lines.
"""

from __future__ import annotations

import bisect
import operator
import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from vllm_offload_doctor.analyze import recall, repeats
from vllm_offload_doctor.analyze.model import Analysis, Run

# A shell prompt (or none), then the server's command: never a message that quotes `vllm serve`,
# nor argparse's `vllm serve: error: ...` (its program name).
_COMMAND = re.compile(
    r"^\s*(?:[\w@.:~/-]*[$#%>]\s*|\+\s*)?(?:\S*/)?(?:vllm serve(?=\s|$)|python[\d.]* -m vllm\.entrypoints\.)"
)
_BANNER = re.compile(r"vLLM (?:API )?server version \S|\S\s{2,}version\s+\d+\.\d+")
# The server's own processes: one pid each per start (workers and DP ranks have their own names).
_PID = re.compile(r"\((APIServer|EngineCore(?:_DP)?\d*) pid=(\d+)\)")
COMMAND, BANNER, ARGS = 1, 2, 4  # a start's markers, as bits
MAX_RUNS = 200  # entries kept in `runs` (the latest); a crash loop's identical starts are one


class Splitter:
    """Says, line by line, whether a new server start begins (a few substring tests a line)."""

    __slots__ = ("head", "pids", "seen", "visible")

    def __init__(self, visible: Callable[[str], bool]) -> None:
        self.visible = visible  # whether a line holds a prefilter word (see the module's note)
        self.seen = 0  # the markers the current start printed (bits)
        self.pids: dict[str, str] = {}  # process name -> its pid in the current start
        self.head = "\0"  # `(Name pid=N)` of a line whose pid is known: most lines repeat it

    def new_start(
        self, raw: str, ended: Callable[[], bool], progressed: Callable[[], bool]
    ) -> bool:
        """Whether `raw` begins a new start.

        `ended`: whether the current start has ended; `progressed`: whether it got past its header
        (a banner or args line printed twice in a row is one start's, not a restart).
        """
        marker = _marker(raw)
        if raw.startswith(self.head):
            m = None  # the pid of the last such line, known already
        else:
            m = _PID.search(raw, 0, 160) if raw.find(" pid=", 0, 160) >= 0 else None
        if m is not None:
            name, pid = m.groups()
            known = self.pids.get(name)
            if known != pid and self.visible(raw):
                if known is not None and ended():
                    self.pids = {name: pid}
                    self.seen = marker
                    self.head = m.group(0) if m.start() == 0 else "\0"
                    return True
                self.pids[name] = pid  # a second process of that name, or a restart not yet seen
            if self.pids.get(name) == pid and m.start() == 0:
                self.head = m.group(0)
        if not marker or not self.visible(raw):
            return False
        # A start begins when a marker comes again; a command line comes before all of them.
        repeated = bool(self.seen & marker) and progressed()
        new = self.seen != 0 if marker == COMMAND else repeated
        self.seen = marker if new else self.seen | marker
        if new:
            if m is None and raw.startswith(self.head):
                m = _PID.match(raw)
            self.pids = {m.group(1): m.group(2)} if m else {}
            self.head = m.group(0) if m is not None and m.start() == 0 else "\0"
        return new

    def hole(self) -> None:
        """A NUL hole: what follows is another writer, a start of its own."""
        self.seen = 0
        self.pids = {}
        self.head = "\0"

    def snapshot(self) -> tuple[int, dict[str, str], str]:
        return self.seen, dict(self.pids), self.head

    def restore(self, state: tuple[int, dict[str, str], str], rename: dict[str, str]) -> None:
        """A snapshot's state with its pids renamed (an echoed start's, see Echo)."""
        self.seen, pids, head = state
        self.pids = {name: rename[pid] for name, pid in pids.items()}
        m = _PID.match(head)
        self.head = f"({m[1]} pid={rename[m[2]]})" if m else head


# The prefix repeats.key leaves out, read in bytes at every line start: a restart's lines differ
# from the last start's in its pid and time only.
_HEAD_B = re.compile(b"(?m)^" + repeats._HEAD.pattern.encode())
_PIDS = re.compile(rb"pid=(\d+)")
_BLIND = bytes.maketrans(b"0123456789", b"0000000000")
NEAR = 64  # a word with digits this long at most is looked for around a prefix's digits


class Echo:
    """The bytes of one start, from its first line to the next start's first line.

    A crash-looping pod prints the same start again and again. When a start begins at a line and
    the bytes from there are this window's but for the digits of the pids and times in their
    vLLM prefixes, with the pids renamed one to one, feeding them would do what feeding this
    window did: the Splitter and the engine's state decide on text, and on pids by equality
    only; a line's prefilter result is the same (a word without digits never meets a changed
    byte; the words with digits are checked); the key of every line is the same (repeats.key
    leaves exactly those prefixes out), so the start repeats the one before and is merged
    unjudged (Runs.repeat). The engine then skips it (engine._State.echo_start).
    """

    __slots__ = ("blind", "digits", "keep", "last_at", "lines", "near", "npids", "pid_at", "pids",
                 "sig", "size", "splitter", "spots", "value", "visible", "window")  # fmt: skip

    def __init__(
        self,
        window: bytes,
        lines: int,
        run: tuple[int, bool],
        splitter: tuple[int, dict[str, str], str],
        near: Callable[[bytes], list[int] | None],
    ) -> None:
        """`near`: where the prefilter's words with digits match, their digits made 0, in a text
        whose digits are made 0 (a digit they hold may change), or None: anywhere (a word longer
        than NEAR); `rename`'s `digits`: where they match."""
        self.size = len(window)
        self.lines = lines  # lines from the first to the next start's first line
        self.sig, self.visible = run  # the start's fingerprint and visibility (engine._State)
        self.splitter = splitter  # the Splitter's state after the next start's first line
        self.last_at = window.rfind(b"\n", 0, self.size - 1) + 1  # that line's offset
        self.window: bytes | None = window  # until a start of its size comes (most never do)
        self.near = near
        self.digits: list[list[int]] = []

    def _prepare(self, window: bytes, digits: Callable[[bytes], list[int]]) -> None:
        self.window = None
        self.blind = window.translate(_BLIND)
        keep = bytearray(b"\xff" * self.size)
        changing = []  # (start, end) of each prefix's pid and time
        for m in _HEAD_B.finditer(window):
            for group in ("pid", "time"):
                a, b = m.span(group)
                if a >= 0:
                    keep[a:b] = bytes(b - a)
            changing.append((m.start("pid"), max(m.end("pid"), m.end("time"))))
        # A word with digits could meet a changed digit: its hits are then compared, in the
        # stretches where one could be. Every match of such a word (in either window) overlaps
        # a near hit (finditer's hits do not overlap), so it lies within NEAR before and 2 x NEAR
        # after one; only a stretch that holds a changed digit can differ.
        hits = self.near(self.blind)
        starts = [a for a, _ in changing]
        spots: list[tuple[int, int]] = []
        for lo, hi in (
            [(0, self.size)] if hits is None else [(h - NEAR, h + 2 * NEAR) for h in hits]
        ):
            i = bisect.bisect_left(starts, hi) - 1  # the last changed stretch starting before hi
            if i >= 0 and changing[i][1] > lo:
                if spots and lo <= spots[-1][1]:
                    spots[-1] = (spots[-1][0], hi)
                else:
                    spots.append((max(lo, 0), hi))
        self.spots = spots
        self.keep = int.from_bytes(keep, "little")
        self.value = int.from_bytes(window, "little") & self.keep
        spans = [m.span(1) for m in _PIDS.finditer(window)]
        self.pids = [window[a:b] for a, b in spans]
        self.pid_at: Any = operator.itemgetter(*(slice(a, b) for a, b in spans)) if spans else None
        self.npids = len(set(self.pids))
        self.digits = [digits(window[a:b]) for a, b in spots]  # where words with digits match

    @staticmethod
    def fits(window: bytes) -> bool:
        """Whether a window can be echoed: no NUL hole, every line keyed (repeats.MAX_KEY)."""
        return b"\0" not in window and max(map(len, window.split(b"\n"))) <= repeats.MAX_KEY

    def rename(
        self, block: bytes, at: int, digits: Callable[[bytes], list[int]]
    ) -> dict[str, str] | None:
        """The pid renaming under which `block[at:]` repeats this window, or None."""
        window = block[at : at + self.size]
        if len(window) != self.size:
            return None
        blind = window.translate(_BLIND)
        if self.window is not None:  # prepared when a start first looks like it (few ever do)
            if blind != self.window.translate(_BLIND):
                return None
            self._prepare(self.window, digits)
        if blind != self.blind:
            return None
        if int.from_bytes(window, "little") & self.keep != self.value:
            return None
        got: Any = self.pid_at(window) if self.pid_at is not None else ()
        pids: Sequence[bytes] = (got,) if len(self.pids) == 1 else got  # one item: not a tuple
        pairs = set(zip(self.pids, pids, strict=True))
        if len(pairs) != self.npids or len(set(pids)) != self.npids:
            return None  # not one to one
        if self.spots and [digits(window[a:b]) for a, b in self.spots] != self.digits:
            return None
        rename = {a.decode(): b.decode() for a, b in pairs}
        _, pids_then, head = self.splitter
        m = _PID.match(head)
        if not all(p in rename for p in (*pids_then.values(), *((m[2],) if m else ()))):
            return None
        return rename


def _marker(raw: str) -> int:
    if "non-default args" in raw:
        return ARGS
    if "version" in raw and _BANNER.search(raw):
        return BANNER
    if ("vllm serve" in raw or "vllm.entrypoints" in raw) and _COMMAND.match(raw):
        return COMMAND
    return 0


def _same(run: Run, a: Analysis | recall.Recalled) -> bool:
    """The same failure: category, rule and offload status (line numbers and times may differ)."""
    v = a.verdict
    return (run.verdict.category, run.verdict.rule_id, run.offload.status) == (
        v.category,
        v.rule_id,
        a.offload.status,
    )


class Runs:
    """The starts judged so far: consecutive ones that ended the same way share an entry."""

    def __init__(self) -> None:
        self.entries: deque[Run] = deque(maxlen=MAX_RUNS)
        # The latest start that names an outcome (a recalled one's analysis is built if asked).
        self.last_event: Analysis | recall.Recalled | None = None
        self.last_sig: int | None = None  # the fingerprint of the latest start's lines

    def repeats(self, sig: int) -> bool:
        """Whether a start with this fingerprint would be merged (see `repeat`)."""
        return sig == self.last_sig and bool(self.entries)

    def repeat(self, sig: int, last: int) -> bool:
        """A start whose lines repeat the one before (but for pids and times): merged unjudged."""
        if sig != self.last_sig or not self.entries:
            return False
        prev = self.entries[-1]
        self.entries[-1] = replace(prev, last_line=last, starts=prev.starts + 1)
        return True

    def add(
        self,
        first: int,
        last: int,
        a: Analysis | recall.Recalled,
        decides: bool,
        sig: int | None = None,
    ) -> None:
        """`decides`: the start shows an outcome (a start cut off after its banner shows none)."""
        self.last_sig = sig
        if decides:
            self.last_event = a
        prev = self.entries[-1] if self.entries else None
        if prev is not None and _same(prev, a):
            self.entries[-1] = replace(prev, last_line=last, starts=prev.starts + 1)
            return
        self.entries.append(Run(first, last, a.verdict, a.offload, a.facts))

    def result(self, first: int, last: int, final: Analysis, decides: bool) -> Analysis:
        """The file's result: the last start's (the last that decides, when it does not), with all."""
        self.add(first, last, final, decides)
        event = self.last_event
        picked = final if decides or event is None else event
        chosen = picked.analysis() if isinstance(picked, recall.Recalled) else picked
        return replace(
            chosen,
            file=final.file,
            lines_read=final.lines_read,
            error=final.error,
            notes=final.notes,
            runs=tuple(self.entries),
        )
