"""Load, validate and compile rule files (TOML, one rule per file).

A rule names a root cause: patterns matched against log messages (compiled
with `regex`, each match under a timeout), conditions on the facts, a
precedence, and the words shown to the user. Every problem in a rule file is
a one-line RuleFileError naming the file and the key.
"""

from __future__ import annotations

import functools
import importlib.resources
import os
import re
import stat
import string
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import re2
import regex
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from vllm_offload_doctor.analyze.model import Category, Facts, Severity
from vllm_offload_doctor.analyze.patterns import Bounded
from vllm_offload_doctor.errors import RuleFileError

MATCH_TIMEOUT_S = 0.05
# A pattern that keeps hitting its timeout (a user's backtracking pattern meets every distinct
# line at 50 ms) is not tried again in that log after this many give-ups; the note says so.
MAX_GIVE_UPS = 3
# A rule file is a few hundred bytes; a directory of rules a few dozen files.
MAX_RULE_FILE_BYTES = 256 << 10
MAX_RULE_FILES = 1000

_REQUIRED = ("id", "title", "severity", "category", "message", "remedy")
_OPTIONAL = (
    "name",
    "precedence",
    "keywords",
    "patterns",
    "where",
    "when",
    "links",
    "cases",
    "vllm_messages",
    "vllm_source",
)  # `aliases` and `summary` were accepted and then dropped: now they are unknown keys
_WHEN_KEYS = ("all", "any", "absent")
_CASE_KEYS = ("log", "expect", "note")
_WHERE = ("message", "line")
# A format spec with a width or precision of 4+ digits (rule messages never need one).
_WIDE = regex.compile(r"\{[^{}:]*:[^{}]*?\d{4}")
_SPEC = regex.compile(r"\{([^{}:!]*)[:!][^{}]*\}")
_ID = regex.compile(r"^[A-Z]{2,5}\d{3}$")

# Facts a condition may name: every field of Facts but the nested ones, and the values the
# verdict derives beside them (verdict.condition_values, verdict.rule_values).
FACT_CONDITIONS = tuple(f.name for f in fields(Facts) if f.name not in ("args", "ranks"))
DERIVED_CONDITIONS = frozenset(
    {
        "phase",
        "error_phase",
        "offload_requested",
        "progressed",
        "gpu_free_fraction",
        "fatal_after_ready",
        "engine_dead_after_ready",
        "copy_offload",
        "serving_setup",
        "kv_tokens",
        "kv_short",
        "kv_numbers",
        "undated_v2_unfixed",
    }
)
CONDITION_FACTS = frozenset(FACT_CONDITIONS) | DERIVED_CONDITIONS


@dataclass(frozen=True, slots=True)
class Condition:
    fact: str
    op: str  # truthy, falsy, ==, !=, >, >=, <, <=, ~, in, none, notnone
    value: Any
    text: str

    def holds(self, facts: Mapping[str, Any]) -> bool:
        have = facts.get(self.fact)
        op, want = self.op, self.value
        if op == "truthy":
            return bool(have)
        if op == "falsy":
            return not have
        if op == "none":
            return have is None
        if op == "notnone":
            return have is not None
        if have is None:
            return False
        if op == "~":
            try:
                return Version(str(have)) in want
            except InvalidVersion:
                return False
        if op == "in":
            return str(have) in want
        if isinstance(want, float):
            try:
                have = float(have)
            except (TypeError, ValueError):
                return False
        else:
            have = str(have)
        return bool(
            {
                "==": have == want,
                "!=": have != want,
                ">": have > want,
                ">=": have >= want,
                "<": have < want,
                "<=": have <= want,
            }[op]
        )


@dataclass(frozen=True, slots=True)
class Case:
    log: Path
    expect: str  # fire | quiet


@dataclass(frozen=True, slots=True)
class SourceRef:
    """A vLLM message a rule recognises: its template in the catalogue, verbatim, and optionally
    a line as a log shows it, for templates whose placeholders hold the words a pattern reads."""

    template: str
    example: str | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    name: str
    title: str
    severity: Severity
    category: Category
    precedence: int
    keywords: tuple[str, ...]
    patterns: tuple[Any, ...]  # compiled regex.Pattern
    where: str
    all: tuple[Condition, ...]
    any: tuple[Condition, ...]
    absent: tuple[Condition, ...]
    message: str
    remedy: str
    links: tuple[str, ...]
    cases: tuple[Case, ...]
    source: Path
    # Regexes naming vLLM messages (in the catalogue) a rule reads through its conditions.
    vllm_messages: tuple[Any, ...] = ()
    # The vLLM messages (catalogue templates) this rule was written from.
    vllm_source: tuple[SourceRef, ...] = ()

    def conditions_hold(self, facts: Mapping[str, Any]) -> bool:
        if not all(c.holds(facts) for c in self.all):
            return False
        if self.any and not any(c.holds(facts) for c in self.any):
            return False
        return not any(c.holds(facts) for c in self.absent)

    def search(self, text: str) -> Any | None:
        return self.attempt(text)[0]

    def attempt(self, text: str) -> tuple[Any | None, bool]:
        """(the first pattern's match or None, True when a pattern gave up at its timeout)."""
        gave_up = False
        for pattern in self.patterns:
            m, timed_out = pattern.attempt(text, timeout=MATCH_TIMEOUT_S)
            gave_up = gave_up or timed_out
            if m:
                return m, gave_up
        return None, gave_up


def builtin_rules_dir() -> Path:
    """`rules/` inside the installed package, or beside it in a source checkout."""
    packaged = Path(str(importlib.resources.files("vllm_offload_doctor"))) / "rules"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "rules"


def load_rules(extra_dirs: Iterable[Path] = ()) -> list[Rule]:
    rules: list[Rule] = []
    seen: dict[str, Path] = {}
    for directory, loaded in (
        (builtin_rules_dir(), _builtin_rules()),
        *((d, None) for d in extra_dirs),
    ):
        for path, rule in loaded if loaded is not None else _load_dir(directory):
            if rule.id in seen:
                raise RuleFileError(f"{path}: id: {rule.id} is already defined in {seen[rule.id]}")
            seen[rule.id] = path
            rules.append(rule)
    return rules


@functools.cache
def _builtin_rules() -> tuple[tuple[Path, Rule], ...]:
    # Rules are immutable: the built-in ones are compiled once a process, however many engines ask.
    return tuple(_load_dir(builtin_rules_dir()))


def _load_dir(directory: Path) -> list[tuple[Path, Rule]]:
    if not directory.is_dir():
        raise RuleFileError(f"{directory}: not a directory of rule files")
    paths = sorted(directory.glob("*.toml"))
    if len(paths) > MAX_RULE_FILES:
        raise RuleFileError(f"{directory}: over {MAX_RULE_FILES} rule files")
    return [(path, load_rule(path)) for path in paths]


def load_rule(path: Path) -> Rule:
    try:
        data = tomllib.loads(_read_rule_file(path).decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise RuleFileError(f"{path}: not valid TOML: {exc}") from exc
    except RecursionError:
        raise RuleFileError(f"{path}: not valid TOML: nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise RuleFileError(f"{path}: not UTF-8 text: {exc}") from exc
    return _build(path, data)


def _read_rule_file(path: Path) -> bytes:
    """The bytes of a rule file that is a regular file (symlinks followed) of bounded size.

    Opened without blocking (a FIFO would wait for a writer forever), checked on the open
    descriptor (no swap between check and read), and read up to the cap only: a link to
    /dev/zero or a device is refused, never read until memory runs out.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise RuleFileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a directory"
                if stat.S_ISDIR(mode)
                else "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a device"
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket"
                if stat.S_ISSOCK(mode)
                else "something else"
            )
            raise RuleFileError(f"{path}: not a regular file ({kind}); rule files must be")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_RULE_FILE_BYTES + 1)
    except OSError as exc:
        raise RuleFileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(data) > MAX_RULE_FILE_BYTES:
        raise RuleFileError(f"{path}: larger than {MAX_RULE_FILE_BYTES >> 10} KiB; not a rule file")
    return data


def _fail(path: Path, key: str, why: str) -> RuleFileError:
    return RuleFileError(f"{path}: {key}: {why}")


def _build(path: Path, data: dict[str, Any]) -> Rule:
    for key in data:
        if key not in _REQUIRED and key not in _OPTIONAL:
            raise _fail(path, key, "unknown key")
    for key in _REQUIRED:
        if key not in data:
            raise _fail(path, key, "missing")
        if not isinstance(data[key], str) or not data[key].strip():
            raise _fail(path, key, "must be a non-empty string")
    rule_id = data["id"]
    if not _ID.match(rule_id):
        raise _fail(path, "id", f"{rule_id!r} must look like LOG001 (2-5 capitals, 3 digits)")
    try:
        severity = Severity(data["severity"])
    except ValueError:
        raise _fail(path, "severity", f"must be one of {', '.join(Severity)}") from None
    try:
        category = Category(data["category"])
    except ValueError:
        raise _fail(path, "category", f"must be one of {', '.join(Category)}") from None
    precedence = data.get("precedence", 0)
    if not isinstance(precedence, int) or isinstance(precedence, bool):
        raise _fail(path, "precedence", "must be an integer")
    patterns = _strings(path, data, "patterns")
    compiled = []
    for i, pattern in enumerate(patterns):
        costly = _too_costly(pattern)
        if costly:
            raise _fail(path, f"patterns[{i}]", f"bad regex: {costly}")
        try:
            compiled.append(Bounded(pattern))  # linear (RE2) where it can be
        except regex.error as exc:
            raise _fail(path, f"patterns[{i}]", f"bad regex: {exc}") from None
    cited = _compile(path, "vllm_messages", _strings(path, data, "vllm_messages"))
    keywords = _strings(path, data, "keywords")
    if patterns and not keywords:
        raise _fail(path, "keywords", "required with patterns: literal words every match contains")
    where = data.get("where", "message")
    if where not in _WHERE:
        raise _fail(path, "where", f"must be one of {', '.join(_WHERE)}")
    when = data.get("when", {})
    if not isinstance(when, dict):
        raise _fail(path, "when", "must be a table")
    for key in when:
        if key not in _WHEN_KEYS:
            raise _fail(path, f"when.{key}", "unknown key")
    conds = {
        k: tuple(_condition(path, f"when.{k}", c) for c in _strings(path, when, k))
        for k in _WHEN_KEYS
    }
    if not patterns and not conds["all"] and not conds["any"]:
        raise _fail(path, "patterns", "a rule needs patterns or when.all/when.any conditions")
    links = _strings(path, data, "links")
    for link in links:
        if not link.startswith("https://"):
            raise _fail(path, "links", f"{link!r} is not an https link")
    for key in ("message", "remedy"):
        try:
            list(string.Formatter().parse(data[key]))
        except ValueError as exc:
            raise _fail(path, key, f"bad placeholder: {exc}") from None
    return Rule(
        id=rule_id,
        name=str(data.get("name", rule_id.lower())),
        title=data["title"].strip(),
        severity=severity,
        category=category,
        precedence=precedence,
        keywords=tuple(keywords),
        patterns=tuple(compiled),
        where=where,
        all=conds["all"],
        any=conds["any"],
        absent=conds["absent"],
        message=" ".join(data["message"].split()),
        remedy=" ".join(data["remedy"].split()),
        links=tuple(links),
        cases=_cases(path, data.get("cases", [])),
        source=path,
        vllm_messages=tuple(cited),
        vllm_source=_source_refs(path, data.get("vllm_source", [])),
    )


def _source_refs(path: Path, value: Any) -> tuple[SourceRef, ...]:
    if not isinstance(value, list):
        raise _fail(
            path, "vllm_source", "must be a list of templates or {template, example} tables"
        )
    refs = []
    for i, item in enumerate(value):
        if isinstance(item, str) and item:
            refs.append(SourceRef(item))
            continue
        if not isinstance(item, dict):
            raise _fail(
                path, f"vllm_source[{i}]", "must be a template or a {template, example} table"
            )
        for key in item:
            if key not in ("template", "example"):
                raise _fail(path, f"vllm_source[{i}].{key}", "unknown key")
        template, example = item.get("template"), item.get("example")
        if not isinstance(template, str) or not template:
            raise _fail(path, f"vllm_source[{i}].template", "must be a non-empty string")
        if example is not None and (not isinstance(example, str) or not example):
            raise _fail(path, f"vllm_source[{i}].example", "must be a non-empty string")
        refs.append(SourceRef(template, example))
    return tuple(refs)


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
# RE2 refuses these in microseconds; `regex.compile` would build them for minutes and gigabytes.
_TOO_BIG = ("repetition", "too large", "too big", "nesting depth", "out of memory")


def _too_costly(pattern: str) -> str | None:
    """Why a user pattern is refused before any backtracking engine compiles it, or None."""
    if len(pattern) > 4096:
        return "longer than 4096 characters"
    try:
        re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        why = str(exc.args[0] if exc.args else exc)
        why = why[2:-1] if why.startswith(("b'", 'b"')) else why
        if any(w in why for w in _TOO_BIG):
            return f"too costly to compile ({why})"
    return None  # RE2 lacks look-arounds and back-references: those are left to `regex`


def _compile(path: Path, key: str, patterns: list[str]) -> list[Any]:
    compiled = []
    for i, pattern in enumerate(patterns):
        costly = _too_costly(pattern)
        if costly:
            raise _fail(path, f"{key}[{i}]", f"bad regex: {costly}")
        try:
            compiled.append(regex.compile(pattern))
        except regex.error as exc:
            raise _fail(path, f"{key}[{i}]", f"bad regex: {exc}") from None
    return compiled


def _strings(path: Path, data: Mapping[str, Any], key: str) -> list[str]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(path, key, "must be a list of non-empty strings")
    return value


_COND = regex.compile(
    r"^(?P<fact>\w+)\s*(?:(?P<op>==|!=|>=|<=|>|<|~|\bin\b)\s*(?P<value>.+)|\s+is\s+(?P<not>not\s+)?(?P<none>none))?$"
)


def _condition(path: Path, key: str, text: str) -> Condition:
    raw = text.strip()
    negate = raw.startswith("not ")
    m = _COND.match(raw[4:].strip() if negate else raw)
    if not m:
        raise _fail(path, key, f"cannot read condition {raw!r} (fact op value)")
    fact = m.group("fact")
    op = m.group("op")
    parsed: Any = None
    if m.group("none"):
        kind = "notnone" if m.group("not") else "none"
    elif op is None:
        kind = "falsy" if negate else "truthy"
    else:
        value = m.group("value").strip()
        kind = op
        if op == "~":
            try:
                parsed = SpecifierSet(value)
            except InvalidSpecifier:
                raise _fail(path, key, f"bad version range {value!r} in {raw!r}") from None
        elif op == "in":
            parsed = frozenset(v.strip() for v in value.split(","))
        else:
            try:
                parsed = float(value)
            except ValueError:
                parsed = value
    if fact not in CONDITION_FACTS:
        raise _fail(path, key, f"unknown fact {fact!r} in {raw!r}")
    return Condition(fact, kind, parsed, raw)


def _cases(path: Path, raw: Any) -> tuple[Case, ...]:
    if not isinstance(raw, list):
        raise _fail(path, "cases", "must be an array of tables")
    cases = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise _fail(path, f"cases[{i}]", "must be a table")
        for key in item:
            if key not in _CASE_KEYS:
                raise _fail(path, f"cases[{i}].{key}", "unknown key")
        if item.get("expect") not in ("fire", "quiet"):
            raise _fail(path, f"cases[{i}].expect", "must be 'fire' or 'quiet'")
        if not isinstance(item.get("log"), str):
            raise _fail(path, f"cases[{i}].log", "missing")
        cases.append(Case(Path(item["log"]), item["expect"]))
    return tuple(cases)


_SEGMENT = re.compile(r"\[\[(.*?)\]\]", re.S)
_FIELD = re.compile(r"(?<!\{)\{(\w+)[^{}]*\}(?!\})")


def render_message(template: str, groups: Mapping[str, Any], facts: Mapping[str, Any]) -> str:
    """Fill `{fact}` fields; a `[[...]]` segment appears only when every field in it is known.

    A field outside any segment that the log does not give is left out with its word gap, never
    shown as a placeholder (messages are written so that each such field sits in a segment).
    """
    values = {k: v for k, v in facts.items() if v is not None and v != ""}
    values.update({k: v for k, v in groups.items() if v is not None and v != ""})

    def known(text: str) -> bool:
        return all(f in values for f in _FIELD.findall(text))

    text = _SEGMENT.sub(lambda m: m.group(1) if known(m.group(1)) else "", template)
    text = _FIELD.sub(lambda m: m.group(0) if m.group(1) in values else "", text)
    if _WIDE.search(text):
        text = _SPEC.sub(r"{\1}", text)  # `{phase:>100000000}` would print 100 MB: drop the spec
    try:
        return string.Formatter().vformat(text, (), values)
    except (KeyError, IndexError, ValueError, AttributeError):
        return _FIELD.sub("", text)


def fields_outside_segments(template: str) -> list[str]:
    """Fields that would vanish without a segment around them (rule files must have none)."""
    return _FIELD.findall(_SEGMENT.sub("", template))
