"""Render `offload-doctor rules`: the rule list, or the chosen rules explained, one renderer per
format in `RENDERERS` (its keys are `output.formats.FORMATS["rules"]`, a test keeps them equal).

The explanations themselves are `rule_view`'s (the user's view) and `catalogue`'s (the vLLM
messages behind a rule); this module picks them per format.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol

from vllm_offload_doctor.analyze import catalogue, rule_view
from vllm_offload_doctor.analyze.rules import Rule
from vllm_offload_doctor.output.formats import OutputFormat


class RulesRenderer(Protocol):
    """A `rules` format: every rule loaded, those asked for (None: list them all), -v."""

    def __call__(
        self, loaded: Sequence[Rule], chosen: Sequence[Rule] | None, *, verbose: bool
    ) -> str: ...


def render_text(loaded: Sequence[Rule], chosen: Sequence[Rule] | None, *, verbose: bool) -> str:
    if chosen is None:
        return _rule_table(loaded) + "\n"
    cat = _catalogue()
    parts = [
        _author_view(r, cat) if verbose else rule_view.user_text(r, _user_sources(r, cat))
        for r in chosen
    ]
    return _joined(parts)


def render_json(loaded: Sequence[Rule], chosen: Sequence[Rule] | None, *, verbose: bool) -> str:
    cat = _catalogue()
    docs = [_rule_dict(r) | _sources(r, None, cat) for r in (loaded if chosen is None else chosen)]
    doc: object = docs[0] if chosen is not None and len(docs) == 1 else docs
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def render_markdown(loaded: Sequence[Rule], chosen: Sequence[Rule] | None, *, verbose: bool) -> str:
    if chosen is None:
        return rule_view.markdown_table(loaded)
    cat = _catalogue()
    return _joined([rule_view.markdown_rule(r, _user_sources(r, cat)) for r in chosen])


RENDERERS: dict[OutputFormat, RulesRenderer] = {
    OutputFormat.TEXT: render_text,
    OutputFormat.JSON: render_json,
    OutputFormat.MARKDOWN: render_markdown,
}


def _joined(parts: Sequence[str]) -> str:
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"


def _author_view(r: Rule, cat: catalogue.Catalogue | catalogue.CatalogueError) -> str:
    lines = [
        f"{r.id} ({r.name}): {r.title}",
        f"  category:   {r.category.value}    severity: {r.severity.value}    precedence: {r.precedence}",
        f"  message:    {r.message}",
        f"  remedy:     {r.remedy}",
    ]
    lines += [f"  pattern:    {p.pattern}" for p in r.patterns]
    for kind, conds in (("all", r.all), ("any", r.any), ("absent", r.absent)):
        if conds:
            lines.append(f"  when {kind}: " + "; ".join(c.text for c in conds))
    lines += [f"  link:       {link}" for link in r.links]
    lines.append(f"  file:       {r.source}")
    _sources(r, lines, cat)
    return "\n".join(lines)


def _user_sources(
    r: Rule, cat: catalogue.Catalogue | catalogue.CatalogueError, limit: int = 6
) -> list[rule_view.Source]:
    """The vLLM messages behind a rule: those it cites, else those its patterns match."""
    if not isinstance(cat, catalogue.Catalogue):
        return []
    found = [m for c in catalogue.cited(r, cat) for m, _ in c.found]
    if not found:
        found = [m for m, _ in catalogue.cite(r, cat).messages]
    return [
        rule_view.Source(m.kind, m.type, m.template, m.where(), m.span()) for m in found[:limit]
    ]


def _catalogue() -> catalogue.Catalogue | catalogue.CatalogueError:
    """The catalogue, or the error that names why it cannot be read."""
    try:
        return catalogue.load()
    except catalogue.CatalogueError as exc:
        return exc


def _sources(
    r: Rule, lines: list[str] | None, cat: catalogue.Catalogue | catalogue.CatalogueError
) -> dict[str, object]:
    """The catalogued vLLM messages a rule matches: appended to `lines`, or as a JSON entry."""
    if not isinstance(cat, catalogue.Catalogue):
        if lines is not None:
            lines.append(f"  vLLM source: unavailable ({cat})")
        return {"vllm_source": None}
    cited = catalogue.cite(r, cat)
    if lines is not None:
        lines += catalogue.text_lines(r, cited, cat)
    return {"vllm_source": catalogue.as_dict(r, cited, cat)}


def _rule_table(loaded: Sequence[Rule]) -> str:
    """One line per rule, highest precedence first, every column as wide as its longest cell."""
    rows = [
        (r.id, r.category.value, r.severity.value, r.title)
        for r in sorted(loaded, key=lambda r: (-r.precedence, r.id))
    ]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)) + "  " + row[3]
        for row in rows
    )


def _rule_dict(r: Rule) -> dict[str, object]:
    return {
        "id": r.id,
        "name": r.name,
        "title": r.title,
        "category": r.category.value,
        "severity": r.severity.value,
        "precedence": r.precedence,
        "patterns": [p.pattern for p in r.patterns],
        "when": {k: [c.text for c in getattr(r, k)] for k in ("all", "any", "absent")},
        "message": r.message,
        "remedy": r.remedy,
        "links": list(r.links),
    }
