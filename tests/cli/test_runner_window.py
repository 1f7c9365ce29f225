"""The Model Runner V2 window: one definition, and every command reads it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from packaging.version import Version

from vllm_offload_doctor import runner

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_offload_doctor"


@pytest.mark.parametrize(
    ("version", "ignores", "hatch"),
    [
        ("0.11.2", False, False),
        ("0.12.0", True, False),
        ("0.21.9", True, False),
        ("0.22.0", True, True),
        ("0.25.1", True, True),
        ("0.27.1", True, True),
        ("0.28.0", False, False),
        ("0.33.0", False, False),
    ],
)
def test_the_window_edges(version: str, ignores: bool, hatch: bool) -> None:
    v = Version(version)
    assert runner.ignores_under_v2(v) is ignores
    assert runner.has_escape_hatch(v) is hatch


def test_no_module_compares_against_the_window_by_hand() -> None:
    # Version("0.12...") / Version("0.22") / Version("0.28...") literals belong in runner.py alone.
    edges = {"0.12", "0.12.0", "0.22", "0.22.0", "0.28", "0.28.0"}
    offenders = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "runner.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "Version"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value in edges
    ]
    assert offenders == []
