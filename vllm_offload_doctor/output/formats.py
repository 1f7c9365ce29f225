"""The output formats, the ones each command offers, their schema version, and the text helpers
their renderers share.

`FORMATS` is the one list of what each command offers: its `--format` choices
(`common_cli.format_option`). Each command keeps a registry `RENDERERS: dict[OutputFormat, P]`
beside its renderers, `P` the command's renderer Protocol; tests/cli/test_formats.py fails while a
declared format has no renderer there, or a renderer has not the Protocol's signature.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

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


_TEXT, _JSON, _JSONL, _MARKDOWN, _HTML = OutputFormat

# What each command offers, in --format's order; text first, the default. A format is added
# here, then its renderer in the registry of each command that offers it.
FORMATS: Mapping[str, tuple[OutputFormat, ...]] = MappingProxyType(
    {
        "analyze": (_TEXT, _JSON, _JSONL, _MARKDOWN, _HTML),
        "check": (_TEXT, _JSON, _MARKDOWN),
        "compare": (_TEXT, _JSON, _MARKDOWN),
        "inspect": (_TEXT, _JSON, _MARKDOWN),
        "rules": (_TEXT, _JSON, _MARKDOWN),
    }
)


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
