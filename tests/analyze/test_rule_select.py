"""The rules a line matches, found by the fast path (Hyperscan's selection of the patterns to try,
RE2 on bytes) and by the reference (every keyword rule's patterns in turn, `Rule.attempt`), are
the same: rules, order and named groups, on every corpus and fixture line and on crafted ones
where Hyperscan's regexes and RE2's part (a vertical tab, Unicode case folding, a newline, a
line longer than the patterns see)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vllm_offload_doctor.analyze import patterns
from vllm_offload_doctor.analyze.engine import Engine, _State
from vllm_offload_doctor.analyze.normalize import Line, parse
from vllm_offload_doctor.analyze.patterns import MAX_TEXT, Bounded, rule_selector

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT.parent / "shared" / "corpus"
LOGS = sorted(
    [
        *ROOT.glob("fixtures/**/*.log"),
        *ROOT.glob("tests/pasted/*.log"),
        *ROOT.glob("tests/unseen/*.log"),
        *(CORPUS.glob("*.log") if CORPUS.is_dir() else ()),
    ]
)


def _state(selectors: bool) -> _State:
    engine = Engine()
    state = _State(engine.rules, engine.knowledge, engine.visible, fast=True)
    made = state._make_selectors()
    if selectors and not made:
        pytest.skip("hyperscan is not installed here (an optional dependency): RE2 only")
    state._selectors = made if selectors else ()
    return state


def _found(state: _State, line: Line, fast: bool) -> list[tuple[str, dict[str, Any]]]:
    found = state._selected(line) if fast else state._attempted(line)
    return [(rule.id, groups) for rule, groups in found]


def _lines() -> Iterator[str]:
    for log in LOGS:
        yield from log.read_bytes().decode("utf-8", "replace").split("\n")


_SPACE = re.compile(" ")


def _crafted(text: str) -> Iterator[str]:
    """Where Hyperscan and RE2 part: a vertical tab (in RE2's \\S, not in Hyperscan's), Unicode
    case folding (RE2 folds 'k' to the Kelvin sign, 's' to the long s), a newline (Hyperscan's
    `$` matches before a last one), a line longer than MAX_TEXT, and plain case changes."""
    yield text.replace(" ", "\x0b")
    yield _SPACE.sub("\x0b", text, count=3)
    yield text.replace("k", "\u212a").replace("s", "\u017f")
    yield text.replace("K", "\u212a").replace("S", "\u017f")
    yield text + "\n"
    yield text + "\nmore"
    yield "usage: vllm serve\n" + text
    yield text.upper()
    yield text.lower()
    yield "x" * MAX_TEXT + " " + text
    yield text[:40] + " " * MAX_TEXT + text[40:]
    yield "x" * (MAX_TEXT - len(text)) + text + " and more"


def _matched_texts(state: _State) -> list[str]:
    """The corpus messages that match a rule (the crafted lines are made from them)."""
    out = []
    for raw in _lines():
        line = parse(1, raw)
        if state._attempted(line):
            out.append(line.msg)
    return sorted(set(out))


@pytest.fixture(scope="module")
def matched() -> list[str]:
    return _matched_texts(_state(selectors=False))


@pytest.mark.parametrize("selectors", [True, False], ids=["hyperscan", "re2"])
def test_every_log_line_matches_the_rules_the_reference_matches(selectors: bool) -> None:
    state = _state(selectors)
    hits = 0
    for n, raw in enumerate(_lines(), start=1):
        line = parse(n, raw)
        expected = _found(state, line, fast=False)
        assert _found(state, line, fast=True) == expected, raw
        hits += bool(expected)
    assert hits > 500


@pytest.mark.parametrize("selectors", [True, False], ids=["hyperscan", "re2"])
def test_crafted_lines_match_the_rules_the_reference_matches(
    selectors: bool, matched: list[str]
) -> None:
    state = _state(selectors)
    for text in matched:
        for crafted in _crafted(text):
            line = Line(1, None, None, None, crafted, crafted)
            assert _found(state, line, fast=True) == _found(state, line, fast=False), crafted


# Lines where Hyperscan's regexes and RE2's part: a vertical tab in RE2's \S (OFF008), the
# Kelvin sign RE2's case folding makes a 'k' (OOM005), a match that ends where the patterns' cut
# does (OFF004's `$`); Hyperscan's `$` before a last newline, its \s holding a vertical tab
# (CRASH003, OFF004: patterns without groups, taken on Hyperscan's word).
PARTING = (
    "CPU storage for \x0b is not pinned",
    "Killed: Out of memory: \u212ailled process 7",
    "x" * (MAX_TEXT - 9) + ".FooError and more",
    "FooError\n",
    "FooError\x0b",
)


def test_the_crafted_lines_catch_a_selector_that_trusts_hyperscan_everywhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The checks above are worth something only if a selection made on any text would show.
    state = _state(selectors=True)
    lines = [Line(1, None, None, None, t, t) for t in PARTING]
    assert all(_found(state, line, fast=True) == _found(state, line, fast=False) for line in lines)
    monkeypatch.setattr(patterns, "_plain", lambda data: True)
    for line in lines:
        assert _found(state, line, fast=True) != _found(state, line, fast=False), line.msg[-40:]


def test_a_pattern_hyperscan_refuses_is_always_tried() -> None:
    # A back-reference: RE2 and Hyperscan refuse it, `regex` runs it (under its timeout).
    group = (("boom",), (Bounded(r"(a)\1 boom"), Bounded(r"boom (?P<n>\d+)"), Bounded("bo+m")))
    select = rule_selector([group])
    if select is None:
        pytest.skip("hyperscan is not installed here (an optional dependency)")
    assert select(b"boom 12") == [(0, [0, 1, 2], {2})]  # sure: matched, and no named group
    assert select(b"aa boom") == [(0, [0, 2], {2})]
    assert select(b"boom\xc3\xa9") == [(0, (0, 1, 2), ())]  # not plain: all, none sure
    assert select(b"nothing") == []


def test_groups_reads_what_groupdict_reads() -> None:
    # Named groups as the wrapper's groupdict: empty and unmatched ones left out, a repeated name
    # by the group the wrapper's index names, non-ASCII text by characters.
    for pattern, text in [
        (r"(?P<a>x)?(?P<b>y*)z", "z"),
        (r"(?P<a>é+)(?P<b>\d+)", "ééé42"),
        (
            r"No module named '(?P<m>[\w.]+)'|cannot import name '(?P<m2>\w+)'",
            "cannot import name 'q'",
        ),
        (r"(?P<m>a)|(?P<m>b)", "b"),
    ]:
        bounded = Bounded(pattern)
        m = bounded.search(text)
        expected = None if m is None else {k: v for k, v in m.groupdict().items() if v}
        assert bounded.groups(text, text.encode()) == (expected, False), pattern
