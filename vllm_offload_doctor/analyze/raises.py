"""vLLM's own `raise` messages as verdicts: a message only one subsystem raises lends its category.

A frame-map entry (rules/maps/frames.toml) with `raises` names the vLLM modules whose catalogued
`raise` messages (data/vllm-messages.json) imply its category: config and argument validation
give bad_args. An exception line whose message is one of those templates, placeholders filled by
anything, then places the failure in that subsystem even without a traceback.

Kept only when safe: a template needs MIN_LITERAL characters of literal text (no short, generic
shapes), every module that raises it must lend the same category, and no catalogued message of
another module may read as it. The templates become one RE2 set, full-matched against the text
after `Class: ` of exception lines only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regex

from vllm_offload_doctor.analyze import catalogue, knowledge
from vllm_offload_doctor.analyze.knowledge import FrameEntry, Knowledge, builtin_knowledge
from vllm_offload_doctor.analyze.patterns import MAX_TEXT
from vllm_offload_doctor.analyze.rules import builtin_rules_dir

MIN_LITERAL = 20  # literal characters a template needs to lend its category
_FIELD = regex.compile(r"\{\{|\}\}|\{([^{}]*)\}")
# A placeholder: lazy, never across lines. RE2 runs it in linear time over text cut to MAX_TEXT;
# a counted bound ({1,400}) would multiply the size of the set's automaton by the bound.
_HOLE = r".+?"


@dataclass(frozen=True, slots=True)
class Raised:
    """A catalogued message that lends its subsystem's category."""

    template: str
    type: str
    file: str  # the newest release's file that raises it
    first: str
    last: str
    entry: FrameEntry

    def span(self) -> str:
        return self.first if self.first == self.last else f"{self.first}–{self.last}"


def template_regex(template: str) -> tuple[str, int]:
    """The first line of `template` as a regex (literal text escaped, placeholders bounded
    wildcards), and how many literal characters it holds."""
    head = template.split("\n", 1)[0].rstrip()
    parts, literal, last = [], 0, 0
    for m in _FIELD.finditer(head):
        text = head[last : m.start()]
        parts.append(regex.escape(text))
        literal += len(text.strip())
        if m.group(0) in ("{{", "}}"):
            parts.append(regex.escape(m.group(0)[0]))
            literal += 1
        else:
            parts.append(_HOLE)
        last = m.end()
    tail = head[last:]
    parts.append(regex.escape(tail))
    literal += len(tail.strip())
    return "".join(parts), literal


class RaiseMap:
    """The lending templates, compiled once; `find` names the one a message is."""

    def __init__(self, raised: Sequence[Raised], patterns: Sequence[str]) -> None:
        self.raised = tuple(raised)
        self.patterns = tuple(patterns)
        self._set = _re2_set(self.patterns)
        self._fallback: list[Any] | None = None

    def find(self, message: str) -> Raised | None:
        text = message.strip()[:MAX_TEXT]
        if len(text) < MIN_LITERAL:
            return None
        hits = self._matches(text)
        return self.raised[min(hits)] if hits else None

    def _matches(self, text: str) -> list[int]:
        if self._set is not None:
            return list(self._set.Match(text) or ())
        if self._fallback is None:
            self._fallback = [regex.compile(p) for p in self.patterns]
        out = []
        for i, rx in enumerate(self._fallback):
            try:
                if rx.fullmatch(text, timeout=0.05):
                    out.append(i)
            except TimeoutError:
                continue
        return out


def _re2_set(patterns: Sequence[str]) -> Any:
    try:
        import re2

        options = re2.Options()
        options.log_errors = False
        options.max_mem = (
            8 << 20
        )  # RE2's default budget; a test checks every template still matches
        rx_set = re2.Set.FullMatchSet(options)
        for p in patterns:
            rx_set.Add(p)
        rx_set.Compile()
        return rx_set
    except Exception:  # no RE2 here, or a set it refuses: `regex` under a timeout instead
        return None


def _lender(file: str, lenders: Sequence[FrameEntry]) -> FrameEntry | None:
    return next((e for e in lenders if any(p in file for p in e.raises)), None)


def build(knowledge: Knowledge, cat: catalogue.Catalogue) -> RaiseMap:
    """The catalogue's raise messages that lend a category, checked for safety (module doc)."""
    lenders = [e for e in knowledge.frames if e.raises]
    rank = {v: i for i, v in enumerate(cat.versions)}
    by_rx: dict[str, list[tuple[catalogue.Message, FrameEntry | None]]] = {}
    raised: list[tuple[catalogue.Message, FrameEntry | None]] = []
    for m in cat.messages:
        if m.kind != "raise":
            continue
        entry = _lender(m.file, lenders)
        raised.append((m, entry))
        rx, literal = template_regex(m.template)
        if literal >= MIN_LITERAL:
            by_rx.setdefault(rx, []).append((m, entry))
    kept: list[tuple[str, Raised]] = []
    for rx, found in by_rx.items():
        categories = {e.category if e is not None else None for _, e in found}
        if len(categories) != 1 or None in categories:
            continue  # raised by modules of different subsystems, or of none that lends
        newest = max(found, key=lambda me: rank.get(me[0].last, -1))[0]
        first = min((me[0].first for me in found), key=lambda v: rank.get(v, -1))
        entry = found[0][1]
        assert entry is not None
        kept.append(
            (rx, Raised(newest.template, newest.type, newest.file, first, newest.last, entry))
        )
    # No message of a module lending another category, or none, may read as a kept one (two
    # templates of one shape): sample each and drop the kept templates it matches.
    probe = RaiseMap([r for _, r in kept], [rx for rx, _ in kept])
    shared: set[int] = set()
    for m, entry in raised:
        category = entry.category if entry is not None else None
        for text in catalogue.samples(m):
            if text.startswith(f"{m.type}: "):
                continue
            hits = probe._matches(text.split("\n", 1)[0].strip()[:MAX_TEXT])
            shared.update(i for i in hits if probe.raised[i].entry.category != category)
    kept = [k for i, k in enumerate(kept) if i not in shared]
    return RaiseMap([r for _, r in kept], [rx for rx, _ in kept])


CACHE_FORMAT = "offload-doctor-lending/1"


def cache_path() -> Path:
    return catalogue.data_path().with_name("vllm-lending.json")


def inputs_digest() -> str:
    """What the built-in lending set is derived from: the catalogue and the frame map (with its
    derived subsystems), byte for byte."""
    h = hashlib.sha256()
    maps = builtin_rules_dir() / "maps"
    for path in (catalogue.data_path(), maps / "frames.toml", knowledge.derived_path()):
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(b"<absent>")
    return h.hexdigest()


def dump(rmap: RaiseMap) -> dict[str, Any]:
    """The lending set as data (scripts/build_lending.py writes it beside the catalogue)."""
    return {
        "format": CACHE_FORMAT,
        "inputs_sha256": inputs_digest(),
        "kept": [
            [rx, r.template, r.type, r.file, r.first, r.last, r.entry.id]
            for rx, r in zip(rmap.patterns, rmap.raised, strict=True)
        ],
    }


def _cached(knowledge: Knowledge) -> RaiseMap | None:
    """The shipped lending set, when it was derived from the files installed beside it."""
    try:
        doc = json.loads(cache_path().read_text(encoding="utf-8"))
        if doc.get("format") != CACHE_FORMAT or doc.get("inputs_sha256") != inputs_digest():
            return None
        entries = {e.id: e for e in knowledge.frames}
        kept = [
            (str(rx), Raised(str(t), str(ty), str(f), str(a), str(b), entries[str(eid)]))
            for rx, t, ty, f, a, b, eid in doc["kept"]
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # absent, stale or damaged: derive it again
    return RaiseMap([r for _, r in kept], [rx for rx, _ in kept])


_BUILTIN: RaiseMap | None = None


def builtin_raises() -> RaiseMap:
    """The built-in catalogue's lending messages: the shipped set (deriving it costs ~0.6 s a
    process), else derived from the catalogue once."""
    global _BUILTIN
    if _BUILTIN is None:
        knowledge = builtin_knowledge()
        _BUILTIN = _cached(knowledge)
        if _BUILTIN is None:
            _BUILTIN = derive_builtin(knowledge)
    return _BUILTIN


def derive_builtin(knowledge: Knowledge | None = None) -> RaiseMap:
    try:
        cat = catalogue.load()
    except catalogue.CatalogueError:  # an install without its data: nothing is lent
        cat = catalogue.Catalogue((), "none", ())
    return build(builtin_knowledge() if knowledge is None else knowledge, cat)
