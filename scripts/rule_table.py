#!/usr/bin/env python3
"""Print the Markdown table of the built-in rules, or write it into README.md between the markers.

    python scripts/rule_table.py                    # print the table
    python scripts/rule_table.py --write README.md  # replace the section between the markers

The section is everything between `<!-- rules:start -->` and `<!-- rules:end -->`; the markers are
appended to the end of the file when it has none. tests/analyze/test_readme_rules.py keeps it from drifting.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from vllm_offload_doctor.analyze import rule_view
from vllm_offload_doctor.analyze.rules import Rule, load_rules

START = "<!-- rules:start -->"
END = "<!-- rules:end -->"


def table(rules: Sequence[Rule] | None = None) -> str:
    """The rules as a Markdown table: `offload-doctor rules --format markdown`."""
    return rule_view.markdown_table(load_rules() if rules is None else rules)


def section(text: str) -> str | None:
    """What lies between the markers (None when they are missing or out of order)."""
    start = text.find(START)
    end = text.find(END, start + len(START)) if start >= 0 else -1
    if start < 0 or end < 0:
        return None
    return text[start + len(START) : end]


def replace_section(text: str, body: str) -> str:
    """`text` with the section between the markers set to `body`; markers appended if absent."""
    inner = "\n" + body.rstrip("\n") + "\n"
    if section(text) is None:
        if START in text or END in text:
            raise ValueError(f"the markers {START} / {END} are incomplete or out of order")
        sep = "" if text.endswith("\n") or not text else "\n"
        return f"{text}{sep}\n{START}{inner}{END}\n"
    start = text.index(START) + len(START)
    end = text.index(END, start)
    return text[:start] + inner + text[end:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write", metavar="README", type=Path, help="replace the rules section in this file"
    )
    args = parser.parse_args(argv)
    body = table()
    if args.write is None:
        sys.stdout.write(body)
        return 0
    path: Path = args.write
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    try:
        new = replace_section(old, body)
    except ValueError as exc:
        print(f"rule_table: {path}: {exc}", file=sys.stderr)
        return 2
    if new != old:
        path.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
