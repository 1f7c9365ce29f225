"""README's rule table is generated from the rule files (scripts/rule_table.py) and cannot drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from script_loader import load_script

from vllm_offload_doctor.analyze.rules import load_rules

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "rule_table.py"
README = ROOT / "README.md"


rule_table = load_script("rule_table")


def test_readme_section_matches_generated_table() -> None:
    text = README.read_text(encoding="utf-8")
    assert text.count(rule_table.START) == 1, "README needs exactly one rules:start marker"
    assert text.count(rule_table.END) == 1, "README needs exactly one rules:end marker"
    section = rule_table.section(text)
    assert section is not None, "README's rules markers are out of order"
    assert section.strip("\n") == rule_table.table().strip("\n"), (
        "README's rule table is stale: run `python scripts/rule_table.py --write README.md`"
    )


def test_table_lists_every_rule_once() -> None:
    body = rule_table.table()
    rows = [line for line in body.splitlines() if line.startswith("| `")]
    ids = [row.split("`")[1] for row in rows]
    assert sorted(ids) == sorted(r.id for r in load_rules())
    precedences = [int(row.split("|")[4]) for row in rows]
    assert precedences == sorted(precedences, reverse=True)


def test_replace_section_appends_markers_when_absent() -> None:
    new = rule_table.replace_section("# Title\n\nText.\n", "| a |\n")
    assert new == f"# Title\n\nText.\n\n{rule_table.START}\n| a |\n{rule_table.END}\n"


def test_replace_section_keeps_surroundings_and_is_idempotent() -> None:
    text = f"head\n{rule_table.START}\nold table\n{rule_table.END}\ntail\n"
    once = rule_table.replace_section(text, "| new |\n")
    assert once == f"head\n{rule_table.START}\n| new |\n{rule_table.END}\ntail\n"
    assert rule_table.replace_section(once, "| new |\n") == once


def test_replace_section_refuses_broken_markers() -> None:
    with pytest.raises(ValueError):
        rule_table.replace_section(f"{rule_table.END}\nx\n{rule_table.START}\n", "| a |\n")


def test_script_write(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# Doc\n", encoding="utf-8")
    run = [sys.executable, str(SCRIPT), "--write", str(readme)]
    subprocess.run(run, check=True, timeout=60)
    first = readme.read_text(encoding="utf-8")
    assert rule_table.section(first) is not None
    subprocess.run(run, check=True, timeout=60)
    assert readme.read_text(encoding="utf-8") == first
    printed = subprocess.run(
        [sys.executable, str(SCRIPT)], check=True, timeout=60, capture_output=True, text=True
    ).stdout
    assert printed.strip("\n") == rule_table.section(first).strip("\n")
