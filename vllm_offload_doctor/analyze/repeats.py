"""Lines that repeat an earlier one but for pid and time: a crash-looping pod's log.

A pod that restarts prints the same start-up and traceback again and again, with new pids and
timestamps. The first time a line is seen, the engine processes it in full and notes what it
did (a plan). A later line with the same key, when the plan says that line only appends to
bounded line-number lists (a traceback frame, a notable error line, a rule hit's evidence),
is replayed from the plan without parsing or matching it again. Lines that set facts, name a
wrapper or a death are processed in full every time, so the result is the same either way.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
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
    if len(raw) > MAX_KEY:
        return None
    m = _HEAD.match(raw)
    if m is None:
        return raw
    return f"{m.group('proc')}\0{m.group('level') or ''}\0{raw[m.end() :]}"


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


@dataclass(frozen=True, slots=True)
class Plan:
    """What processing a line did, replayable for a later line with the same key."""

    msg: str
    frame: tuple[str, str] | None  # (function, path) appended to the collector's frames
    frame_entry: Any  # the knowledge's frame entry the clues noted for it, or None
    notable: bool  # listed among the notable lines
    rules: tuple[str, ...]  # ids of the rules whose patterns matched
    reports: tuple[Any, ...]  # the pasted-report reader's state it was seen in
    # What a later start (its own state, see runs.py) needs to replay it as feeding it would.
    fatal: bool = False  # an exception or a fatal hint: the start's first fatal line
    dated: bool = False  # a vLLM time stamp (the start's first time)
    open: int = 0  # engine._State._open when it was seen (bits): what it did not add to
    groups: tuple[dict[str, Any], ...] = ()  # the named groups of each rule's match, in order
