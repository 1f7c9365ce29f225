"""Declared log patterns: a regex together with the literal words every match contains.

The words do two jobs. analyze's prefilter passes only lines that hold one of them, and the
pattern itself runs only on text that holds one. A missing word therefore breaks the fact on
every path (a test built on `analyze_lines` notices), not only when a big file is prefiltered.

Every declared pattern sees at most MAX_TEXT characters of a line, so even a pattern that
backtracks costs a bounded time per line; bench/bench_hostile.py measures the worst case.
"""

from __future__ import annotations

import bisect
import functools
import re
import sys
from collections import OrderedDict
from collections.abc import Callable, Container, Iterator, Sequence
from typing import Any, cast

# A vLLM record longer than this (a huge `non-default args` dict) is read from its start only.
MAX_TEXT = 16_384


class Declared:
    """A compiled pattern, gated by its words and bounded to MAX_TEXT characters."""

    __slots__ = ("icase", "owner", "rx", "until_served", "words")

    def __init__(
        self,
        rx: re.Pattern[str],
        words: tuple[str, ...],
        icase: bool,
        until_served: bool,
        owner: str = "",
    ):
        self.rx = rx
        self.words = words
        self.icase = icase  # the words are matched ignoring case
        self.until_served = until_served  # the prefilter drops the words once a request was served
        self.owner = owner  # the module that declared it (facts.py gates its feed by its own words)

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


# Bounded results per text, so a pattern that gave up on a text (its timeout) does not spend it
# again on a repeat: text -> {pattern: match}. A size-capped LRU, and pure.
_SEARCHED: OrderedDict[str, dict[Any, Any]] = OrderedDict()  # text -> {pattern: match or None}
_MATCHED: OrderedDict[str, dict[Any, Any]] = OrderedDict()
MEMO_TEXTS = 1024
MEMO_TEXT_LEN = 4096


def _results(memo: OrderedDict[str, dict[Any, Any]], text: str) -> dict[Any, Any]:
    """The results kept for a new text, making room by the least recently used one."""
    if len(memo) >= MEMO_TEXTS:
        memo.popitem(last=False)
    results: dict[Any, Any] = {}
    memo[text] = results
    return results


_DECLARED: list[Declared] = []
_WORDS: list[tuple[str, bool, bool]] = []  # words needed by code that tests more than patterns


def declare(
    pattern: str, *words: str, icase: bool = False, until_served: bool = False, flags: int = 0
) -> Declared:
    """Compile `pattern`; `words` are literals of which every match contains at least one."""
    if not words or not all(words):
        raise ValueError(f"pattern {pattern!r} needs its literal words")
    kept = tuple(w.lower() for w in words) if icase else tuple(words)
    owner = sys._getframe(1).f_globals.get("__name__", "")
    d = Declared(re.compile(pattern, flags), kept, icase, until_served, owner)
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


def literal_matcher(words: Sequence[tuple[str, bool]]) -> Any:
    """One pattern that finds any of the literal words (word, ignore case) in bytes.

    RE2 scans an alternation of ~150 literals with a DFA at a few hundred MB/s; Python's `re`
    tries every alternative at every position (a few MB/s), so it is only the fallback.
    Compiled once per word set: every input of a batch asks for the same ones.
    """
    return _literal_matcher(tuple(words))


@functools.lru_cache(maxsize=64)
def _literal_matcher(words: tuple[tuple[str, bool], ...]) -> Any:
    pattern = b"|".join(
        b"(?i:" + re.escape(w.encode()) + b")" if icase else re.escape(w.encode())
        for w, icase in words
    )
    try:
        import re2

        return re2.compile(pattern)
    except Exception:  # not installed on this platform, or a pattern RE2 refuses
        return re.compile(pattern)


def span_finder(rx: Any) -> Callable[[bytes, int], tuple[int, int] | None]:
    """`rx.search(data, pos)` reduced to the span of the match, or None.

    With RE2 this calls its matcher directly: the Python wrapper builds a Match object per call,
    which costs four times the scan of a log line when nearly every line is a candidate.
    """
    try:
        import re2

        match, anchor = rx._regexp.Match, re2._Anchor.UNANCHORED
        match(anchor, b"", 0, 0)
    except Exception:  # the `re` fallback, or a google-re2 without these internals

        def find(data: bytes, pos: int) -> tuple[int, int] | None:
            m = rx.search(data, pos)
            return None if m is None else m.span()

        return find

    def find_re2(data: bytes, pos: int) -> tuple[int, int] | None:
        span = match(anchor, data, pos, len(data))[0]
        return None if span[0] < 0 else span

    return find_re2


SEGMENT = 128 << 10  # bytes of a block scanned at once by block_scanner's finds
PIECE = 256 << 10  # bytes of a block scanned at once by a piece scan (ahead.py)

# (first offset, offset after the last, (end << 16 | word) of every match between, by their ends)
Piece = tuple[int, int, list[int]]
Find = Callable[[bytes, int], Any]


class BlockScan:
    """`block_scanner`'s scan: called as scan(block, keeps, pieces=()), a find over the block for
    each `keep` (the words it reports, None: all), called with growing positions. `pieces`: the
    block's scan from offset 0 on, done ahead by piece_scan's function (ahead.py); the finds
    scan the rest."""

    def __init__(self, db: Any, sizes: list[int]) -> None:
        self._db = db
        self._sizes = sizes

    def piece_scan(self) -> Callable[[bytes, int], Piece]:
        """A function (block, offset) -> the Piece from there, for one other thread: it scans
        with a scratch of its own (Hyperscan's may serve one scan at a time)."""
        import hyperscan

        scratch = hyperscan.Scratch(self._db)

        def scan(block: bytes, at: int) -> Piece:
            hi = _line_end_after(block, at + PIECE)
            return at, hi, self._found(memoryview(block)[at:hi], scratch)

        return scan

    def _found(self, part: memoryview, scratch: Any = None) -> list[int]:
        """(end << 16 | word) of every match in `part`, by their ends."""
        found: list[int] = []
        add = found.append
        self._db.scan(cast(bytes, part),  # any buffer: no copy (the stubs say str or bytes)
                      match_event_handler=lambda w, _f, to, _fl, _c: add(to << 16 | w),
                      scratch=scratch)  # fmt: skip
        return found

    def __call__(
        self, block: bytes, keeps: Sequence[Sequence[bool] | None], pieces: Sequence[Piece] = ()
    ) -> list[Find]:
        # The block is scanned a segment at a time, from where a find is asked first: the bytes
        # a caller skips (a crash loop's echoed restarts) are never scanned.
        sizes = self._sizes
        size = len(block)
        view = memoryview(block)
        starts = [lo for lo, _hi, _found in pieces]
        ahead = pieces[-1][1] if pieces else 0
        seg: list[Any] = [0, 0, 0, []]  # first offset, the one after the last, number, finds

        def segment(pos: int) -> None:
            if pos < ahead:
                lo, hi, found = pieces[bisect.bisect_right(starts, pos) - 1]
            else:
                lo, hi = pos, _line_end_after(block, pos + SEGMENT)
                found = self._found(view[lo:hi])
            seg[:] = lo, hi, seg[2] + 1, found

        def walk(keep: Sequence[bool] | None) -> Find:
            at = 0
            mine = -1  # the segment `at` points into

            def find(_data: bytes, pos: int) -> tuple[int, int] | None:
                nonlocal at, mine
                while pos < size:
                    if not seg[0] <= pos < seg[1]:
                        segment(pos)
                    lo, hi, number, found = seg
                    if mine != number:
                        at, mine = 0, number
                    rel = pos - lo
                    at = bisect.bisect_left(found, rel << 16, at)
                    for i in range(at, len(found)):
                        to, w = found[i] >> 16, found[i] & 0xFFFF
                        if to - sizes[w] >= rel and (keep is None or keep[w]):
                            at = i
                            return lo + to - 1, lo + to  # the match's last byte: its line
                    at = len(found)
                    pos = hi
                return None

            return find

        return [walk(keep) for keep in keeps]


def _line_end_after(block: bytes, at: int) -> int:
    """The offset after the first line end from `at` on (the block's end without one)."""
    return block.find(b"\n", at) + 1 or len(block)


def block_scanner(words: Sequence[tuple[str, bool]]) -> BlockScan | None:
    """`span_finder`'s find over Hyperscan: one scan of a whole block instead of a search per line.

    RE2's DFA over ~350 literals runs at ~250 MB/s and costs a few microseconds a call; one
    Hyperscan scan (SIMD literal matching, over 1 GB/s) reports every match of the block, and
    find then walks them. None when Hyperscan is not installed (it is optional: wheels exist for
    x86-64 Linux, macOS and Windows) or refuses a word: the engine keeps RE2. The match that ends
    first among those starting at `pos` is on the first line holding a word, as RE2's leftmost
    match is, so both feed the same lines. A piece or segment ends at a line's end and no word
    holds one, so where the scan was cut never changes a find.
    """
    return _block_scanner(tuple(words))


@functools.lru_cache(maxsize=8)
def _block_scanner(words: tuple[tuple[str, bool], ...]) -> BlockScan | None:
    if not words or len(words) >= 1 << 16 or any("\n" in w for w, _ in words):
        return None
    try:
        import hyperscan

        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        db.compile(
            expressions=[w.encode() for w, _ in words],
            ids=list(range(len(words))),
            elements=len(words),
            flags=[hyperscan.HS_FLAG_CASELESS if icase else 0 for _, icase in words],
            literal=True,
        )
    except Exception:  # not installed, or a build that refuses the words
        return None
    return BlockScan(db, [len(w.encode()) for w, _ in words])


# (group, the indexes of the patterns to try in order, those of them sure to match)
Selected = list[tuple[int, Sequence[int], Container[int]]]


def rule_selector(
    groups: Sequence[tuple[Sequence[str], Sequence[Bounded]]],
) -> Callable[[bytes], Selected] | None:
    """For a text in UTF-8: the groups (a rule's keywords and patterns each) holding one of their
    keywords, in order, each with the indexes of the patterns that may match it, in order, and
    those sure to. One Hyperscan scan for every keyword and pattern instead of a RE2 search per
    pattern.

    A pattern left out matches nowhere in the text, so trying only the others (with RE2, for the
    groups) finds the same first match; one Hyperscan matched that has no named groups needs no
    RE2 at all. Hyperscan's regexes agree with RE2's on plain text only (ASCII without a newline
    or vertical tab: `\\s`, `$`, case folding and `.` differ beyond it), at most MAX_TEXT bytes
    long (the patterns see no more); for any other text every pattern of the groups holding a
    keyword is returned, none sure. A pattern Hyperscan cannot compile, one with non-ASCII
    characters, or one RE2 cannot run (it runs under a timeout: the reference tries it) is
    always returned, never sure. None without Hyperscan.
    """
    key = tuple(
        (tuple(words), tuple((p.pattern, p.linear, p.named) for p in patterns))
        for words, patterns in groups
    )
    return _rule_selector(key)


_GROUP_NAME = re.compile(r"(?<!\\)((?:\\\\)*)\(\?P<\w+>")  # Hyperscan refuses a repeated name
_NOT_PLAIN = re.compile(rb"[^\x00-\x09\x0c-\x7f]")  # non-ASCII, a newline or a vertical tab


def _plain(data: bytes) -> bool:
    """Whether Hyperscan's regexes find in `data` what RE2's find (see rule_selector)."""
    return len(data) <= MAX_TEXT and _NOT_PLAIN.search(data) is None


@functools.lru_cache(maxsize=8)
def _rule_selector(
    groups: tuple[tuple[tuple[str, ...], tuple[tuple[str, bool, bool], ...]], ...],
) -> Callable[[bytes], Selected] | None:
    words = sorted({w for ws, _ in groups for w in ws})
    if not words:
        return None
    try:
        import hyperscan
    except Exception:
        return None
    owners = [[g for g, (ws, _) in enumerate(groups) if w in ws] for w in words]
    # Every byte escaped: a keyword is a literal whatever it holds (a NUL ends a C string).
    exprs = [b"".join(b"\\x%02x" % c for c in w.encode()) for w in words]
    where: list[tuple[int, int, bool]] = []  # (group, pattern, named groups) of each pattern
    always: list[list[int]] = [[] for _ in groups]
    for g, (_, patterns) in enumerate(groups):
        for i, (pattern, linear, named) in enumerate(patterns):
            if linear and pattern.isascii():
                where.append((g, i, named))
                exprs.append(_GROUP_NAME.sub(r"\1(", pattern).encode())
            else:
                always[g].append(i)
    flags = [hyperscan.HS_FLAG_SINGLEMATCH] * len(exprs)
    db = _compile_each(hyperscan, exprs, flags, len(words))
    if db is None:
        return None
    db, refused = db
    for n in refused:
        g, i, _ = where[n - len(words)]
        always[g].append(i)
    for a in always:
        a.sort()
    every = [tuple(range(len(patterns))) for _, patterns in groups]
    n_words = len(words)
    seen: list[int] = []

    def on(found: int, _from: int, _to: int, _flags: int, _ctx: Any) -> None:
        seen.append(found)

    def choose(plain: bool, found: list[int]) -> Selected:
        hit = {g for w in found if w < n_words for g in owners[w]}
        if not hit:
            return []
        if not plain:
            return [(g, every[g], ()) for g in sorted(hit)]
        tried: dict[int, list[int]] = {g: list(always[g]) for g in hit}
        sure: dict[int, set[int]] = {g: set() for g in hit}
        for n in found:
            if n >= n_words:
                g, i, named = where[n - n_words]
                if g in tried:
                    tried[g].append(i)
                    if not named:
                        sure[g].add(i)
        return [(g, sorted(tried[g]), frozenset(sure[g])) for g in sorted(hit) if tried[g]]

    # The choice for each set of hits: lines of one shape (a million exception lines) hit the
    # same words and patterns. A few thousand shapes at most are kept.
    chosen: dict[tuple[Any, ...], Selected] = {}

    def select(data: bytes) -> Selected:
        seen.clear()
        db.scan(data, match_event_handler=on)
        if not seen:
            return []
        plain = _plain(data)
        shape = (plain, *seen)
        found = chosen.get(shape)
        if found is None:
            found = choose(plain, seen)
            if len(chosen) < 4096:
                chosen[shape] = found
        return found

    return select


def _compile_each(hs: Any, exprs: list[bytes], flags: list[int], fixed: int) -> Any:
    """(a Hyperscan database of the expressions, the indexes of those it refused), or None
    when it refuses one of the first `fixed` (literal keywords)."""

    def compiled(ids: list[int]) -> Any:
        db = hs.Database(mode=hs.HS_MODE_BLOCK)
        db.compile(
            expressions=[exprs[i] for i in ids],
            ids=ids,
            elements=len(ids),
            flags=[flags[i] for i in ids],
        )
        return db

    ids = list(range(len(exprs)))
    try:
        return compiled(ids), []
    except Exception:  # one the build refuses: find it, then compile the rest
        pass
    refused = []
    for i in ids[fixed:]:
        try:
            compiled([i])
        except Exception:
            refused.append(i)
    try:
        return compiled([i for i in ids if i not in refused]), refused
    except Exception:
        return None


# -- rule and knowledge patterns ---------------------------------------------------------------

DEFAULT_TIMEOUT_S = 0.05


_GAVE_UP = object()  # a remembered give-up: the same text would time out again


class Bounded:
    """A rule or knowledge pattern that costs linear time: RE2 when it can express the pattern,
    else `regex` under a timeout. Either way it sees at most MAX_TEXT characters of a line.

    RE2 has no look-around or back-references; the few patterns that need them keep `regex`.
    A timeout is never raised: `search`/`match` then find nothing, and `attempt` says it gave up,
    so the caller can tell its user (per analysis) which pattern was skipped on which line.
    """

    __slots__ = ("_match", "_names", "_re2", "_rx", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._re2 = _re2_compile(pattern)
        # `regex` runs only what RE2 cannot, so it compiles only those at once (raising
        # regex.error for the rule file's message); RE2 checked the others. ~0.2 ms a pattern.
        self._rx = None if self._re2 is not None else _regex_compile(pattern)
        # RE2's matcher on UTF-8 bytes, and its named groups as the wrapper's groupdict reads them.
        self._match, self._names = _re2_parts(self._re2)

    @property
    def rx(self) -> Any:
        """The pattern in `regex`, compiled on first use."""
        if self._rx is None:
            self._rx = _regex_compile(self.pattern)
        return self._rx

    @property
    def linear(self) -> bool:
        return self._re2 is not None

    @property
    def named(self) -> bool:
        """Whether the pattern has named groups."""
        return bool((self._re2 if self._re2 is not None else self.rx).groupindex)

    def search(self, text: str, timeout: float | None = DEFAULT_TIMEOUT_S) -> Any:
        return self.attempt(text, timeout)[0]

    def match(self, text: str, timeout: float | None = DEFAULT_TIMEOUT_S) -> Any:
        found = self._run(False, text, timeout)
        return None if found is _GAVE_UP else found

    def attempt(self, text: str, timeout: float | None = DEFAULT_TIMEOUT_S) -> tuple[Any, bool]:
        """(`search`'s match or None, True when it gave up at the timeout)."""
        found = self._run(True, text, timeout)
        return (None, True) if found is _GAVE_UP else (found, False)

    def _run(self, search: bool, text: str, timeout: float | None) -> Any:
        text = text[:MAX_TEXT]
        memo = _SEARCHED if search else _MATCHED
        results = memo.get(text)
        if results is not None:
            memo.move_to_end(text)
            if self in results:
                return results[self]
        found = self._run_once(search, text, timeout)
        if len(text) <= MEMO_TEXT_LEN:
            if results is None:
                results = _results(memo, text)
            results[self] = found
        return found

    def _run_once(self, search: bool, text: str, timeout: float | None) -> Any:
        if self._re2 is not None:
            return self._re2.search(text) if search else self._re2.match(text)
        try:
            run = self.rx.search if search else self.rx.match
            return run(text, timeout=timeout)
        except TimeoutError:
            return _GAVE_UP  # a clue or rule is then missing, not the run

    def groups(self, text: str, data: bytes) -> tuple[dict[str, Any] | None, bool]:
        """`attempt` on `text` (at most MAX_TEXT characters; `data`: it in UTF-8) reduced to the
        match's non-empty named groups: (None when it does not match, True when it gave up).

        RE2 runs on the bytes through its matcher: the wrapper's Match object converts every
        offset between bytes and characters and builds the group index on each call. RE2's
        answer is not memoised (the engine keeps a line's plan); `regex`'s is, as `search`'s.
        """
        if self._match is None:
            found, gave_up = self.attempt(text)
            return (
                None if found is None else {k: v for k, v in found.groupdict().items() if v}
            ), gave_up
        spans = self._match(data, 0, len(data))
        if spans[0][0] < 0:
            return None, False
        out = {}
        for name, i in self._names:
            start, end = spans[i]
            if end > start:  # matched, and not empty
                out[name] = data[start:end].decode()
        return out, False

    def __repr__(self) -> str:
        return f"Bounded({self.pattern!r}, re2={self.linear})"


def _re2_parts(rx: Any) -> tuple[Any, tuple[tuple[str, int], ...]]:
    """(RE2's unanchored matcher, (name, group) of its named groups as `groupdict` reads them),
    or (None, ()) where the pattern is not RE2's or this google-re2 lacks these internals."""
    if rx is None:
        return None, ()
    try:
        import re2

        match = functools.partial(rx._regexp.Match, re2._Anchor.UNANCHORED)
        match(b"", 0, 0)
        return match, tuple(rx.groupindex.items())
    except Exception:
        return None, ()


def _regex_compile(pattern: str) -> Any:
    import regex

    return regex.compile(pattern)


def _re2_compile(pattern: str) -> Any:
    try:
        import re2

        options = re2.Options()
        options.log_errors = False
        return re2.compile(pattern, options)
    except Exception:  # no RE2 here, or a look-around / back-reference it cannot express
        return None
