"""Load and validate the knowledge maps beside the rules (`rules/maps/*.toml`).

- exceptions.toml: library exception classes and stock messages, each lent to the rule whose
  category it implies (the rule's words explain it); wrappers that are never evidence; signs
  that the engine process died without any exception.
- frames.toml: the failing frame's subsystem and the category it implies, used when the
  exception line does not decide; with `raises`, the modules whose catalogued raise messages
  imply the category too (raises.py). An entry with `derive` takes its functions, and for a
  whole-module subsystem its paths, from data/vllm-frames.json: what scripts/vllm_frames.py read
  in vLLM's released source for the subsystems of subsystems.toml.

Problems are one-line RuleFileErrors naming the file and the key, as for rules.
"""

from __future__ import annotations

import importlib.resources
import json
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import regex

from vllm_offload_doctor.analyze.model import Category
from vllm_offload_doctor.analyze.patterns import Bounded
from vllm_offload_doctor.analyze.rules import Rule, builtin_rules_dir, load_rules
from vllm_offload_doctor.errors import RuleFileError


@dataclass(frozen=True, slots=True)
class ExceptionEntry:
    id: str
    rule: str
    category: Category
    keywords: tuple[str, ...]
    pattern: Any  # compiled regex.Pattern
    source: str
    fire: tuple[str, ...]
    quiet: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FrameEntry:
    id: str
    rule: str
    category: Category
    functions: frozenset[str]
    paths: tuple[str, ...]  # the frame's file path must contain one of these (none = any)
    calls: bool  # a call-site code line `fn(` also places the failure in the function
    source: str
    fire: tuple[str, ...]
    quiet: tuple[str, ...]
    raises: tuple[str, ...] = ()  # modules whose catalogued raise messages lend the category
    anywhere: frozenset[str] = frozenset()  # hand-kept names beside derived ones, in any file

    def named(self, fn: str) -> bool:
        return fn in self.functions or fn in self.anywhere

    def matches(self, fn: str, path: str) -> bool:
        if fn in self.anywhere:
            return True
        if self.functions and fn not in self.functions:
            return False
        path = path.replace("\\", "/")
        if "//" in path:  # a path pasted with its backslashes escaped
            path = regex.sub("/{2,}", "/", path)
        return not self.paths or any(p in path for p in self.paths)


@dataclass(frozen=True, slots=True)
class Knowledge:
    exceptions: tuple[ExceptionEntry, ...]
    wrappers: Any  # compiled regex.Pattern: lines that wrap a cause and are never evidence
    wrapper_keywords: tuple[str, ...]
    deaths: Any  # compiled regex.Pattern: the engine died without an exception
    death_keywords: tuple[str, ...]
    frames: tuple[FrameEntry, ...]
    call_pattern: Any  # compiled regex.Pattern naming the functions whose call site counts

    @property
    def keywords(self) -> tuple[str, ...]:
        calls = sorted({fn for f in self.frames if f.calls for fn in (*f.functions, *f.anywhere)})
        return (
            *self.wrapper_keywords,
            *self.death_keywords,
            *(f"{c}(" for c in calls),
        )

    def frame_entry(self, fn: str, path: str) -> FrameEntry | None:
        for entry in self.frames:
            if entry.matches(fn, path):
                return entry
        return None

    def call_entry(self, fn: str) -> FrameEntry | None:
        for entry in self.frames:
            if entry.calls and entry.named(fn):
                return entry
        return None


def maps_dir() -> Path:
    return builtin_rules_dir() / "maps"


def _fail(path: Path, key: str, why: str) -> RuleFileError:
    return RuleFileError(f"{path}: {key}: {why}")


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise RuleFileError(f"{path}: not valid TOML: {exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleFileError(f"{path}: cannot read: {exc}") from exc


def _strs(path: Path, data: dict[str, Any], key: str, *, required: bool = False) -> tuple[str, ...]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(path, key, "must be a list of non-empty strings")
    if required and not value:
        raise _fail(path, key, "must not be empty")
    return tuple(value)


def _str(path: Path, data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, key, "must be a non-empty string")
    return value


def _regex(path: Path, key: str, pattern: str) -> Any:
    try:
        return Bounded(pattern)  # linear (RE2) where it can be
    except regex.error as exc:
        raise _fail(path, key, f"bad regex: {exc}") from None


def _entry_head(
    path: Path, where: str, item: Any, allowed: set[str], rules: dict[str, Rule]
) -> tuple[str, str, Category]:
    if not isinstance(item, dict):
        raise _fail(path, where, "must be a table")
    for key in item:
        if key not in allowed:
            raise _fail(path, f"{where}.{key}", "unknown key")
    entry_id = _str(path, item, "id")
    rule_id = _str(path, item, "rule")
    try:
        category = Category(_str(path, item, "category"))
    except ValueError:
        raise _fail(path, f"{where}.category", f"must be one of {', '.join(Category)}") from None
    rule = rules.get(rule_id)
    if rule is None:
        raise _fail(path, f"{where}.rule", f"no rule {rule_id!r}")
    if rule.category is not category:
        raise _fail(
            path, f"{where}.category", f"{category} differs from {rule_id}'s {rule.category}"
        )
    _str(path, item, "source")
    return entry_id, rule_id, category


def _exceptions(path: Path, data: dict[str, Any], rules: dict[str, Rule]) -> list[ExceptionEntry]:
    out = []
    allowed = {"id", "rule", "category", "keywords", "pattern", "source", "fire", "quiet"}
    for i, item in enumerate(data.get("exception", [])):
        where = f"exception[{i}]"
        entry_id, rule_id, category = _entry_head(path, where, item, allowed, rules)
        keywords = _strs(path, item, "keywords", required=True)
        pattern = _regex(path, f"{where}.pattern", _str(path, item, "pattern"))
        fire = _strs(path, item, "fire", required=True)
        for line in fire:
            if not pattern.search(line):
                raise _fail(path, f"{where}.fire", f"pattern does not match {line[:80]!r}")
            if not any(k in line for k in keywords):
                raise _fail(path, f"{where}.keywords", f"none is in {line[:80]!r}")
        quiet = _strs(path, item, "quiet")
        for line in quiet:
            if pattern.search(line):
                raise _fail(path, f"{where}.quiet", f"pattern matches {line[:80]!r}")
        out.append(
            ExceptionEntry(
                entry_id, rule_id, category, keywords, pattern, item["source"], fire, quiet
            )
        )
    return out


def derived_path() -> Path:
    return Path(str(importlib.resources.files("vllm_offload_doctor"))) / "data" / "vllm-frames.json"


_DERIVED: dict[str, dict[str, Any]] | None = None


def derived_subsystems() -> dict[str, dict[str, Any]]:
    """The subsystems of data/vllm-frames.json by id (read once; {} when absent or damaged)."""
    global _DERIVED
    if _DERIVED is None:
        try:
            doc = json.loads(derived_path().read_text(encoding="utf-8"))
            _DERIVED = {str(s["id"]): s for s in doc["subsystems"]}
        except (OSError, ValueError, KeyError, TypeError):
            _DERIVED = {}
    return _DERIVED


def _derive(
    path: Path, where: str, item: dict[str, Any], category: Category
) -> tuple[frozenset[str], tuple[str, ...], tuple[str, ...]]:
    """An entry's functions, paths and raising modules from the derived subsystems it names."""
    if "path" in item:
        raise _fail(path, f"{where}.path", "not with derive: the source gives it")
    ids = item["derive"]
    ids = [ids] if isinstance(ids, str) else ids
    ids = _strs(path, {"derive": ids}, "derive", required=True)
    raises = item.get("raises", False)
    if not isinstance(raises, bool):
        raise _fail(path, f"{where}.raises", "must be true or false with derive")
    known = derived_subsystems()
    subs = []
    for sid in ids:
        sub = known.get(sid)
        if sub is None:
            raise _fail(path, f"{where}.derive", f"no subsystem {sid!r} in {derived_path().name}")
        if sub.get("category") != category:
            raise _fail(path, f"{where}.category", f"{category} differs from {sid}'s")
        subs.append(sub)
    whole = {sub.get("select") == "all" for sub in subs}
    if len(whole) != 1:
        raise _fail(path, f"{where}.derive", "mixes whole-module and selected subsystems")
    paths = tuple(dict.fromkeys(str(p) for sub in subs for p in sub["paths"]))
    functions = frozenset(
        () if whole == {True} else (str(f[0]) for sub in subs for f in sub["functions"])
    )
    if whole == {False} and not functions:
        raise _fail(path, f"{where}.derive", "the source gave no function")
    if whole == {True} and item.get("calls", False):
        raise _fail(path, f"{where}.calls", "a whole-module subsystem has no call sites")
    return functions, paths, paths if raises else ()


def _frames(path: Path, data: dict[str, Any], rules: dict[str, Rule]) -> list[FrameEntry]:
    out = []
    allowed = {
        "id",
        "derive",
        "why",
        "rule",
        "category",
        "functions",
        "path",
        "calls",
        "raises",
        "source",
        "fire",
        "quiet",
    }
    for i, item in enumerate(data.get("frame", [])):
        where = f"frame[{i}]"
        entry_id, rule_id, category = _entry_head(path, where, item, allowed, rules)
        anywhere: frozenset[str] = frozenset()
        if "derive" not in item or "functions" in item:  # written by hand: say why
            _str(path, item, "why")
        if "derive" in item:
            functions, paths, raises = _derive(path, where, item, category)
            anywhere = frozenset(_strs(path, item, "functions"))
        else:
            functions = frozenset(_strs(path, item, "functions"))
            sub = item.get("path", [])
            sub = [sub] if isinstance(sub, str) else sub
            paths = _strs(path, {"path": sub}, "path")
            raises = _strs(path, item, "raises")
        if not functions and not paths:
            raise _fail(path, where, "needs functions or path")
        calls = item.get("calls", False)
        if not isinstance(calls, bool):
            raise _fail(path, f"{where}.calls", "must be true or false")
        fire = _strs(path, item, "fire", required=True)
        out.append(
            FrameEntry(
                entry_id,
                rule_id,
                category,
                functions,
                paths,
                calls,
                item["source"],
                fire,
                _strs(path, item, "quiet"),
                raises,
                anywhere,
            )
        )
    return out


def _alternation(path: Path, key: str, data: dict[str, Any]) -> tuple[Any, tuple[str, ...]]:
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise _fail(path, key, "must be a table")
    for extra in sorted(set(table) - {"patterns", "keywords", "source"}):
        raise _fail(path, f"{key}.{extra}", "unknown key")
    patterns = _strs(path, table, "patterns", required=True)
    keywords = _strs(path, table, "keywords", required=True)
    _str(path, table, "source")
    for i, p in enumerate(patterns):
        _regex(path, f"{key}.patterns[{i}]", p)
    return Bounded("|".join(f"(?:{p})" for p in patterns)), keywords


def load_knowledge(rules: Sequence[Rule], directory: Path | None = None) -> Knowledge:
    directory = directory or maps_dir()
    by_id = {r.id: r for r in rules}
    exc_path, frame_path = directory / "exceptions.toml", directory / "frames.toml"
    exc_data, frame_data = _read(exc_path), _read(frame_path)
    exceptions = _exceptions(exc_path, exc_data, by_id)
    _unique(exc_path, [e.id for e in exceptions])
    wrappers, wrapper_kw = _alternation(exc_path, "wrappers", exc_data)
    deaths, death_kw = _alternation(exc_path, "deaths", exc_data)
    frames = _frames(frame_path, frame_data, by_id)
    _unique(frame_path, [f.id for f in frames])
    calls = sorted({fn for f in frames if f.calls for fn in (*f.functions, *f.anywhere)})
    call_rx = Bounded(
        r"^\s*+(?:[\w.\[\](), ]++=\s*)?(?:await\s+|return\s+|raise\s+|assert\s+(?:not\s+)?)?(?:\w++\.)*+(?P<fn>"
        + "|".join(regex.escape(c) for c in calls)
        + r")\("
    )
    return Knowledge(
        tuple(exceptions), wrappers, wrapper_kw, deaths, death_kw, tuple(frames), call_rx
    )


def _unique(path: Path, ids: Iterable[str]) -> None:
    seen: set[str] = set()
    for entry_id in ids:
        if entry_id in seen:
            raise _fail(path, "id", f"{entry_id!r} is defined twice")
        seen.add(entry_id)


def lend_exceptions(rules: Sequence[Rule], knowledge: Knowledge) -> list[Rule]:
    """Each rule gains the patterns of the exception entries that imply its category."""
    out = []
    for rule in rules:
        extra = [e for e in knowledge.exceptions if e.rule == rule.id]
        if extra:
            rule = replace(
                rule,
                patterns=(*rule.patterns, *(e.pattern for e in extra)),
                keywords=tuple(
                    dict.fromkeys((*rule.keywords, *(k for e in extra for k in e.keywords)))
                ),
            )
        out.append(rule)
    return out


_BUILTIN: Knowledge | None = None


def builtin_knowledge() -> Knowledge:
    """The maps shipped beside the built-in rules, validated against them (loaded once)."""
    global _BUILTIN
    if _BUILTIN is None:
        _BUILTIN = load_knowledge(load_rules())
    return _BUILTIN
