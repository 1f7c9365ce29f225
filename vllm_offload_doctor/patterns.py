"""Declared log patterns: a regex together with the literal words every match contains.

The words do two jobs. analyze's prefilter passes only lines that hold one of them, and the
pattern itself runs only on text that holds one. A missing word therefore breaks the fact on
every path (a test built on `analyze_lines` notices), not only when a big file is prefiltered.

Every declared pattern sees at most MAX_TEXT characters of a line, so even a pattern that
backtracks costs a bounded time per line; bench/bench_hostile.py measures the worst case.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# A vLLM record longer than this (a huge `non-default args` dict) is read from its start only.
MAX_TEXT = 16_384


class Declared:
    """A compiled pattern, gated by its words and bounded to MAX_TEXT characters."""

    __slots__ = ("icase", "rx", "until_served", "words")

    def __init__(self, rx: re.Pattern[str], words: tuple[str, ...], icase: bool, until_served: bool):
        self.rx = rx
        self.words = words
        self.icase = icase  # the words are matched ignoring case
        self.until_served = until_served  # the prefilter drops the words once a request was served

    def _gate(self, text: str) -> str | None:
        text = text[:MAX_TEXT]
        hay = text.lower() if self.icase else text
        for word in self.words:
            if word in hay:
                return text
        return None

    def search(self, text: str) -> re.Match[str] | None:
        t = self._gate(text)
        return None if t is None else self.rx.search(t)

    def match(self, text: str) -> re.Match[str] | None:
        t = self._gate(text)
        return None if t is None else self.rx.match(t)

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        t = self._gate(text)
        return iter(()) if t is None else self.rx.finditer(t)

    def __repr__(self) -> str:
        return f"Declared({self.rx.pattern!r}, words={self.words!r})"


_DECLARED: list[Declared] = []
_WORDS: list[tuple[str, bool, bool]] = []  # words needed by code that tests more than patterns


def declare(
    pattern: str, *words: str, icase: bool = False, until_served: bool = False, flags: int = 0
) -> Declared:
    """Compile `pattern`; `words` are literals of which every match contains at least one."""
    if not words or not all(words):
        raise ValueError(f"pattern {pattern!r} needs its literal words")
    kept = tuple(w.lower() for w in words) if icase else tuple(words)
    d = Declared(re.compile(pattern, flags), kept, icase, until_served)
    _DECLARED.append(d)
    return d


def declare_words(*words: str) -> None:
    """Words the engine needs for checks that are not patterns (a log level, a prefix)."""
    _WORDS.extend((w, False, False) for w in words)


def declared() -> tuple[Declared, ...]:
    return tuple(_DECLARED)


def prefilter_words(*, served: bool = False) -> list[tuple[str, bool]]:
    """(word, ignore case) for every declared word; `served`: leave out the until-served ones."""
    out = {(w, False) for w, _, _ in _WORDS}
    for d in _DECLARED:
        if served and d.until_served:
            continue
        out.update((w, d.icase) for w in d.words)
    return sorted(out, key=lambda wi: (-len(wi[0]), wi))
