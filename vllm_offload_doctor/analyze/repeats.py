"""Lines that repeat an earlier one but for pid and time: a crash-looping pod's log.

A pod that restarts prints the same start-up and traceback again and again, with new pids and
timestamps. The engine reads each line in two steps: what the line says (its Plan: the facts it
sets, its frame, its clues, the rules it matches), a function of its text without pid and time,
and what that does to the state so far. The first time a line is seen its plan is made and
kept under the line's key; a later line with the same key is applied from the kept plan,
without parsing or matching it again. Both go through the same update (engine._State._apply),
so the result is the same either way.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

# vLLM's record prefix: process and pid, then (when logged) level, date and time.
# runs.Echo reads the same prefix in bytes (pid and time are what two restarts' lines differ in).
_HEAD = re.compile(
    r"\((?P<proc>[\w:]+) pid=(?P<pid>\d+)\) (?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<time>\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) )?"
)
MAX_KEY = 16_384  # longer lines are always processed in full (and not remembered)
MEMO_CHARS = 2_000_000  # characters of distinct lines remembered (the least recent go first)


def key(raw: str) -> str | None:
    """The line without its pid and time (the whole line when it has no vLLM prefix)."""
    return split(raw)[0]


# A record's level and time where no process prefix comes first (V0's records, or records after a
# collector's prefix): a plan's key leaves its time out too.
_RECORD = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? ")
RECORD_WITHIN = 200  # characters of a line looked at for such a record's start


def split(raw: str) -> tuple[str | None, Any, int, int, str | None, bool]:
    """(key, the key of its plan, where the prefix left out starts and ends, the prefix's pid,
    whether it holds a time). The plan's key is the key but for a line whose record (level and
    time) comes without a process prefix: (what comes before the record, level, what follows
    it); `key` itself keeps such a line whole, as starts are told apart by it (runs.py)."""
    if len(raw) > MAX_KEY:
        return None, None, 0, 0, None, False
    m = _HEAD.match(raw)
    if m is None:
        r = _RECORD.search(raw, 0, RECORD_WITHIN)
        if r is None:
            return raw, raw, 0, 0, None, False
        return raw, (raw[: r.start()], r.group(1), raw[r.end() :]), r.start(), r.end(), None, True
    level = m.group("level")
    key = f"{m.group('proc')}\0{level or ''}\0{raw[m.end() :]}"
    return key, key, 0, m.end(), m.group("pid"), level is not None


class Memo:
    """A size-capped LRU: once its keys add up to MEMO_CHARS characters, the entries used least
    recently go, one by one (never all at once: a crash loop's lines stay while new ones come)."""

    __slots__ = ("chars", "entries")

    def __init__(self) -> None:
        self.entries: OrderedDict[Any, tuple[int, Any]] = OrderedDict()  # key -> (size, value)
        self.chars = 0

    def get(self, key: Any, default: Any = None) -> Any:
        found = self.entries.get(key)
        if found is None:
            return default
        self.entries.move_to_end(key)
        return found[1]

    def remember(self, key: Any, size: int, value: Any) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            self.chars -= old[0]
        while self.entries and self.chars + size > MEMO_CHARS:
            self.chars -= self.entries.popitem(last=False)[1][0]
        self.entries[key] = (size, value)
        self.chars += size

    def __len__(self) -> int:
        return len(self.entries)


UNREAD: Any = object()  # a Plan's stack entry, until a line asks for it


class Plan:
    """What a line says, whatever the state (made by engine._State._classify): a function of its
    key, applied again for a later line with the same key."""

    __slots__ = ("alarm", "clue", "dated", "exception", "facts", "fatal", "frame", "frame_entry",
                 "interrupt", "lent", "level", "loading_4dp", "matches", "msg", "notable", "pid",
                 "pid_in_head", "proc", "reports", "start", "tail", "v2", "wrapped")  # fmt: skip

    def __init__(
        self,
        msg: str,
        proc: str | None,
        reports: tuple[Any, ...],
        level: str | None,
        frame: tuple[str, str] | None,
        frame_entry: Any,
        facts: tuple[tuple[Any, ...], ...],
        clue: Any,
        v2: bool,
        loading_4dp: bool | None,
        dated: bool,
        interrupt: bool,
        alarm: bool,
        exception: str | None,
        fatal: bool,
        notable: bool,
        matches: tuple[tuple[Any, dict[str, Any]], ...],
        wrapped: tuple[str, tuple[str, ...]] | None,
    ) -> None:
        self.msg = msg
        self.proc = proc  # the line's process (a fact's rank)
        self.reports = reports  # the pasted-report reader's state it was read in (not a report)
        self.level = level  # the log level
        self.frame = frame  # a traceback frame: (function, path)
        self.frame_entry = frame_entry  # the knowledge's entry for that frame
        self.facts = facts  # facts.Ops
        self.clue = clue  # verdict.Clue (not for a frame)
        self.v2 = v2  # 'Using V2 Model Runner'
        self.loading_4dp = loading_4dp  # 'Model loading took' with four decimals, or not
        self.dated = dated  # a vLLM time stamp
        self.interrupt = interrupt  # Ctrl+C
        self.alarm = alarm  # an ERROR/CRITICAL level, or such a prefix cut off
        self.exception = exception  # an exception's message, after `Class: `
        self.fatal = fatal  # an exception or a fatal hint
        self.notable = notable  # listed among the notable lines
        self.matches = matches  # (rule, named groups) of the rules whose patterns match
        self.wrapped = wrapped  # 'Value error, ...': verdict.wrapped_of
        self.lent: Any = UNREAD  # the stack catalogue's entry for the message, read once asked
        # The line's text: the raw line's from `start`, stripped (tail None), else the left out
        # prefix (repeats.split) and the tail; its pid, where it is not the prefix's.
        self.start = 0
        self.tail: str | None = None
        self.pid: int | None = None
        self.pid_in_head = False
