"""`offload-doctor rules`: which rules the user asked for, and each one explained for a user.

The user view answers what a person holding a log wants to know (what it means, why vLLM says it,
what to do, what the lines look like, where vLLM prints them); `--verbose` keeps the rule author's
view (patterns, conditions, template syntax). The Markdown table is the README's rule table.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_offload_doctor.analyze import normalize
from vllm_offload_doctor.analyze.rules import MATCH_TIMEOUT_S, Rule, fields_outside_segments
from vllm_offload_doctor.errors import InputError
from vllm_offload_doctor.output.formats import shorten

WIDTH = 80
_SEGMENT = re.compile(r"\[\[(.*?)\]\]", re.S)
_EXAMPLES = 3
_EXAMPLE_WIDTH = 300  # four lines or so; a traceback-long message is cut, marked with …


def select(loaded: Sequence[Rule], wanted: Sequence[str]) -> list[Rule]:
    """The rules named by id, name or id prefix (`OOM`), in the order asked, each once."""
    out: list[Rule] = []
    for item in wanted:
        key = item.upper()
        found = [r for r in loaded if r.id == key or r.name == item]
        if not found:
            found = sorted((r for r in loaded if r.id.startswith(key)), key=lambda r: r.id)
        if not found:
            raise InputError(f"no rule {item!r}; `offload-doctor rules` lists them")
        out += [r for r in found if r not in out]
    return out


def meaning(rule: Rule) -> str:
    """The rule's message with the parts that need a log's facts left out."""
    text = _SEGMENT.sub("", rule.message)
    assert not fields_outside_segments(rule.message)
    return " ".join(text.split())


def _fill(text: str, indent: str = "  ") -> list[str]:
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=indent,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def _hang(text: str) -> list[str]:
    """A list item wrapped with a hanging indent."""
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent="  - ",
        subsequent_indent="    ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def examples(rule: Rule, root: Path | None = None) -> list[str]:
    """Messages the rule fires on, as its own `fire` cases log them (the vLLM prefix left out),
    else the cited vLLM templates."""
    out: list[str] = []
    base = rule.source.parent.parent if root is None else root
    patterns = rule.patterns or rule.vllm_messages
    for case in rule.cases:
        if case.expect != "fire" or len(out) >= _EXAMPLES:
            continue
        path = case.log if case.log.is_absolute() else base / case.log
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:  # an installed package ships the rules without their cases
            continue
        for no, raw in enumerate(lines, 1):
            msg = normalize.parse(no, raw).msg
            if any(_hit(p, msg) for p in patterns):
                if msg not in out:
                    out.append(msg)
                break
    if not out:
        out = [ref.example or ref.template for ref in rule.vllm_source][:_EXAMPLES]
    return out


def _hit(pattern: object, text: str) -> bool:
    try:
        return bool(pattern.search(text, timeout=MATCH_TIMEOUT_S))  # type: ignore[attr-defined]
    except TimeoutError:
        return False


@dataclass(frozen=True, slots=True)
class Source:
    """A vLLM message behind a rule, as the catalogue records it."""

    kind: str  # raise | log
    type: str
    template: str
    where: str
    span: str


def _why(rule: Rule, sources: Sequence[Source]) -> list[str]:
    """Why vLLM prints the lines: the messages it raises or logs, from the catalogue."""
    out, seen = [], set()
    for s in sources:
        if s.template in seen:
            continue
        seen.add(s.template)
        verb = f"raises {s.type}" if s.kind == "raise" else f"logs ({s.type})"
        out.append(f"vLLM {verb}: {' '.join(s.template.split())}")
    return out or [
        "No single vLLM message names this: the doctor reads it from the facts of the log "
        "(the phase the error came in, the lines vLLM printed or left out)."
    ]


def _source_lines(sources: Sequence[Source]) -> list[str]:
    return [f"{s.where}  {s.span}  ({s.kind} {s.type})" for s in sources]


def _library_lines(rule: Rule) -> list[str]:
    """Messages of the libraries under vLLM that lend this rule's category (the stack catalogue)."""
    from vllm_offload_doctor.analyze.stack import builtin_stack, describe

    return [f"{describe(m)} -> {m.category}" for m in builtin_stack().for_rule(rule.id)]


def user_text(rule: Rule, sources: Sequence[Source]) -> str:
    """The user view of one rule, wrapped at 80 columns."""
    head = f"{rule.id} ({rule.name}): {rule.title}"
    lines = [*textwrap.wrap(head, WIDTH, subsequent_indent="    ", break_on_hyphens=False), ""]
    lines.append("What it means")
    lines += _fill(meaning(rule))
    lines += ["", "Why vLLM says it"]
    for why in _why(rule, sources):
        lines += _hang(why)
    lines += ["", "What to do"]
    lines += _fill(" ".join(rule.remedy.split()))
    lines += [f"  {link}" for link in rule.links]
    shown = examples(rule)
    if shown:
        lines += ["", "Example log lines"]
        for line in shown:
            lines += _hang(shorten(line, _EXAMPLE_WIDTH))
    lines += ["", "Source (vLLM file and versions)"]
    for line in _source_lines(sources) or ["no vLLM message is catalogued"]:
        lines += textwrap.wrap(line, WIDTH, initial_indent="  ", subsequent_indent="      ")
    library = _library_lines(rule)
    if library:
        lines += ["", "Library messages it reads (library, file and versions)"]
        for line in library:
            lines += _hang(line)
    lines += ["", "--verbose: the rule file, its patterns and its conditions"]
    return "\n".join(lines)


def markdown_table(rules: Sequence[Rule]) -> str:
    """The rules as a Markdown table, highest precedence first (the order `analyze` ranks them)."""
    lines = [
        "| id | category | severity | precedence | title |",
        "|---|---|---|---:|---|",
    ]
    lines.extend(
        f"| `{r.id}` | `{r.category.value}` | {r.severity.value} | {r.precedence} "
        f"| {_cell(r.title)} |"
        for r in sorted(rules, key=lambda r: (-r.precedence, r.id))
    )
    return "\n".join(lines) + "\n"


def markdown_rule(rule: Rule, sources: Sequence[Source]) -> str:
    out = [f"### `{rule.id}`: {rule.title}", "", f"**What it means:** {meaning(rule)}", ""]
    out += ["**Why vLLM says it:**", "", *[f"- {w}" for w in _why(rule, sources)], ""]
    out += [f"**What to do:** {' '.join(rule.remedy.split())}", ""]
    if rule.links:
        out += ["Links: " + ", ".join(f"<{link}>" for link in rule.links), ""]
    shown = examples(rule)
    if shown:
        out += ["Example log lines:", "", "```text", *shown, "```", ""]
    if sources:
        out += ["Source (vLLM file and versions):", ""]
        out += [f"- `{s}`" for s in _source_lines(sources)]
    library = _library_lines(rule)
    if library:
        out += ["", "Library messages it reads (library, file and versions):", ""]
        out += [f"- {line}" for line in library]
    return "\n".join(out).rstrip() + "\n"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
