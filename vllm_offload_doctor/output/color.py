"""Whether to colour, and the one way every command colours text (ANSI SGR codes).

The decision is the same for every command: an explicit `--color`/`--no-color` wins; otherwise
`NO_COLOR` (non-empty) turns colour off, `FORCE_COLOR` or `CLICOLOR_FORCE` (non-empty, not "0")
turn it on, `TERM=dumb` turns it off, and a terminal on stdout turns it on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TextIO

_CODES = {
    "red": "31", "green": "32", "yellow": "33", "blue": "34", "magenta": "35", "cyan": "36",
    "bold": "1", "dim": "2",
}  # fmt: skip


def use_color(flag: bool | None, env: Mapping[str, str], stream: TextIO) -> bool:
    """Decide once per command run; see the module docstring for the order."""
    if flag is not None:
        return flag
    if env.get("NO_COLOR"):
        return False
    if any(env.get(name, "0") not in ("", "0") for name in ("FORCE_COLOR", "CLICOLOR_FORCE")):
        return True
    if env.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def paint(text: str, *styles: str, color: bool = True) -> str:
    """`text` wrapped in the SGR codes of `styles` (names in `_CODES`), or unchanged."""
    if not color or not styles:
        return text
    codes = ";".join(_CODES[s] for s in styles)
    return f"\x1b[{codes}m{text}\x1b[0m"
