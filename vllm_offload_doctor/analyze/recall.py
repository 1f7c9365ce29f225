"""Starts seen before: a log that holds the same start again, byte for byte, further on.

A start's analysis depends on its own bytes, on where it begins (line numbers in evidence, in a
summary, in `model_runner_evidence`) and on a little state it finds (engine.Recalled.key). So
when the bytes of a start and what it finds repeat, its analysis is the earlier one with every
number that came from a line number moved by the distance between the two. Which numbers those
are is not guessed: the second time a start is judged, its analysis is compared with the
first's, field by field, and a number is a line number's only where the two differ by exactly
that distance; anything else that differs (a pid, a time, a note only one of them has) makes
the start one that is always fed in full. From the third time on, the engine skips the start's
bytes and adds the analysis this module rebuilds (engine.Engine._echo).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_offload_doctor.analyze.model import Analysis

_DIGITS = re.compile(r"([0-9]+)")

# A template: a value with no line number in it (kept as it is), or a rebuilder of one.
Build = Callable[[int], Any]


class Differs(Exception):
    """The two analyses differ otherwise than by line numbers."""


def template(first: Any, second: Any, delta: int) -> Any:
    """A template of `first`: `build(template, shift)` gives it as the same start would have it
    `shift` lines further on. `second` is what it was `delta` (not 0) lines further on.
    Raises Differs."""
    if first is second:
        return _Const(first)
    if type(first) is not type(second):
        raise Differs
    kind = type(first)
    if kind is bool or first is None or isinstance(first, Enum | float | bytes):
        if first != second:
            raise Differs
        return _Const(first)
    if kind is int:
        if first == second:
            return _Const(first)
        if second - first != delta:
            raise Differs
        value: int = first
        return _Slot(lambda shift: value + shift)
    if kind is str:
        return _text(first, second, delta)
    if kind is tuple or kind is list:
        if len(first) != len(second):
            raise Differs
        parts = [template(a, b, delta) for a, b in zip(first, second, strict=True)]
        if not any(isinstance(p, _Slot) for p in parts):
            return _Const(first)
        return _Slot(lambda shift: kind(_built(p, shift) for p in parts))
    if kind is dict:
        if list(first) != list(second):
            raise Differs
        items = [(k, template(first[k], second[k], delta)) for k in first]
        if not any(isinstance(p, _Slot) for _, p in items):
            return _Const(first)
        return _Slot(lambda shift: {k: _built(p, shift) for k, p in items})
    if dataclasses.is_dataclass(first):
        values, changed = {}, {}
        for f in dataclasses.fields(first):
            if not f.init:
                raise Differs
            values[f.name] = getattr(first, f.name)
            part = template(values[f.name], getattr(second, f.name), delta)
            if isinstance(part, _Slot):
                changed[f.name] = part
        if not changed:
            return _Const(first)
        for name in changed:
            del values[name]
        return _Slot(
            lambda shift: kind(**values, **{k: p.build(shift) for k, p in changed.items()})
        )
    raise Differs  # a type this module does not know: never guess


def build(part: Any, shift: int) -> Any:
    """The value a template gives for a start `shift` lines after the first one."""
    return _built(part, shift)


class _Slot:
    __slots__ = ("build",)

    def __init__(self, build: Build) -> None:
        self.build = build


class _Const:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _built(part: Any, shift: int) -> Any:
    return part.build(shift) if isinstance(part, _Slot) else part.value


def _text(first: str, second: str, delta: int) -> Any:
    if first == second:
        return _Const(first)
    a, b = _DIGITS.split(first), _DIGITS.split(second)
    if len(a) != len(b):
        raise Differs
    slots = []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x == y:
            continue
        # Digit runs sit at the odd places; a line number has no leading zero.
        if i % 2 == 0 or int(y) - int(x) != delta or str(int(x)) != x:
            raise Differs
        slots.append(i)
    if not slots:
        return _Const(first)

    def rebuilt(shift: int) -> str:
        parts = list(a)
        for i in slots:
            parts[i] = str(int(a[i]) + shift)
        return "".join(parts)

    return _Slot(rebuilt)


@dataclasses.dataclass(slots=True)
class Entry:
    """A start's window (its bytes up to and with the next start's first line) and its judgement."""

    window: bytes
    key: Any  # what the start found: engine._State.recall_key after its first line
    lines: int  # lines from its first line to the next start's first line
    last_at: int  # the offset of that line in the window
    splitter: Any  # the Splitter's state after that line
    sig: int  # the start's fingerprint and visibility (engine._State.run_sig, run_visible)
    visible: bool
    base: int  # the first line of its first sighting
    analysis: Any  # its analysis then, until a second sighting makes the template
    decides: bool
    template: Learned | None = None  # once learned from a second sighting
    dead: bool = False  # the second sighting differed otherwise than by line numbers


class Learned:
    """The templates of a start's analysis: the parts a run keeps, and the whole."""

    __slots__ = ("analysis", "facts", "offload", "verdict")

    def __init__(self, first: Any, second: Any, delta: int) -> None:
        self.analysis = template(first, second, delta)
        self.verdict = template(first.verdict, second.verdict, delta)
        self.offload = template(first.offload, second.offload, delta)
        self.facts = template(first.facts, second.facts, delta)


class Recalled:
    """A recalled start's analysis: what runs.Runs keeps of every start, built at once, and the
    whole analysis, built only if it is asked for (the last start that decides, if no later)."""

    __slots__ = ("_learned", "_shift", "facts", "offload", "verdict")

    def __init__(self, learned: Learned, shift: int) -> None:
        self._learned, self._shift = learned, shift
        self.verdict = build(learned.verdict, shift)
        self.offload = build(learned.offload, shift)
        self.facts = build(learned.facts, shift)

    def analysis(self) -> Analysis:
        built: Analysis = build(self._learned.analysis, self._shift)
        return built


class Seen:
    """Windows of starts judged once or twice, the least recently used going first past
    MAX_BYTES of windows or MAX_ENTRIES starts (bounded whatever the log)."""

    MAX_BYTES = 4 << 20
    MAX_ENTRIES = 128  # a first sighting keeps its analysis until the second
    PER_LINE = 8  # windows kept per first line (many starts begin with the same banner)

    def __init__(self) -> None:
        self.by_window: dict[bytes, Entry] = {}  # insertion order: least recently used first
        self.by_first: dict[bytes, list[Entry]] = {}
        self.size = 0

    def learn(self, entry: Entry) -> None:
        """A start judged in full: remember its first sighting, or learn from its second."""
        known = self.by_window.get(entry.window)
        if known is None:
            self._add(entry)
            return
        analysis, decides, base = entry.analysis, entry.decides, entry.base
        if known.dead or known.template is not None:
            return
        if known.key != entry.key or known.decides != decides or base == known.base:
            known.dead = True
        else:
            try:
                known.template = Learned(known.analysis, analysis, base - known.base)
            except Differs:
                known.dead = True
        known.analysis = None

    def recall(self, block: bytes, at: int, first: bytes, key: Any) -> tuple[Entry, Learned] | None:
        """The learned window the bytes from `at` repeat, found by their first line `first`."""
        for entry in self.by_first.get(first, ()):
            learned = entry.template
            if learned is not None and entry.key == key and block.startswith(entry.window, at):
                self.by_window[entry.window] = self.by_window.pop(entry.window)  # used now
                return entry, learned
        return None

    def longest(self, first: bytes) -> int:
        """The longest learned window that begins with this first line (0: none)."""
        return max((len(e.window) for e in self.by_first.get(first, ()) if e.template), default=0)

    def _add(self, entry: Entry) -> None:
        same = self.by_first.setdefault(_first(entry.window), [])
        if len(same) >= self.PER_LINE:
            self._drop(same[-1])
        same.insert(0, entry)
        self.by_window[entry.window] = entry
        self.size += len(entry.window)
        while (
            self.size > self.MAX_BYTES or len(self.by_window) > self.MAX_ENTRIES
        ) and self.by_window:
            self._drop(next(iter(self.by_window.values())))

    def _drop(self, entry: Entry) -> None:
        del self.by_window[entry.window]
        self.size -= len(entry.window)
        first = _first(entry.window)
        same = self.by_first[first]
        same.remove(entry)
        if not same:
            del self.by_first[first]


def _first(window: bytes) -> bytes:
    return window[: window.find(b"\n") + 1]
