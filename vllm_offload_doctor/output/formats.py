"""The output formats every command chooses from, their schema version, and the text helpers their renderers share.

Each command keeps one registry `RENDERERS: dict[OutputFormat, ...]` beside its renderers; its
`--format` choices are that registry's keys (`common_cli.format_option`), so a format exists for a
command exactly when it has a renderer there, and a test per command checks each one renders.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

ELLIPSIS = "…"

# The version of every machine-readable output (check --format json, analyze json/jsonl,
# report.json). Raise it only for a change a consumer must adapt to (a key removed or renamed, a
# meaning changed); new keys keep it.
SCHEMA_VERSION = 1


class OutputFormat(StrEnum):
    TEXT = "text"
    JSON = "json"
    JSONL = "jsonl"
    MARKDOWN = "markdown"
    HTML = "html"


def ordered(formats: Iterable[OutputFormat]) -> list[OutputFormat]:
    """The formats in the enum's order (text first: the default)."""
    wanted = set(formats)
    return [f for f in OutputFormat if f in wanted]


def shorten(text: str, limit: int) -> str:
    """Cut `text` to at most `limit` characters at a word boundary, marking the cut with '…'."""
    if len(text) <= limit:
        return text
    cut = text[: limit - len(ELLIPSIS)]
    space = cut.rfind(" ")
    if space >= limit // 2:  # a very long word is cut inside rather than losing half the text
        cut = cut[:space]
    return cut.rstrip(" ,;:") + ELLIPSIS


def error_document(kind: str, message: str, exit_code: int) -> dict[str, object]:
    """What a command prints instead of its report when it fails in a JSON format."""
    return {
        "schema_version": SCHEMA_VERSION,
        "error": {"kind": kind, "message": message},
        "exit_code": exit_code,
    }
