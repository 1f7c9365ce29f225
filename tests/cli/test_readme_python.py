"""README's Python requirement is pyproject's, and its recipe for a Python 3.10 vLLM works."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import click

from vllm_offload_doctor.cli import cli

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_states_the_python_pyproject_requires() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    minimum = re.fullmatch(r">=(\d+\.\d+)", project["requires-python"])
    assert minimum, project["requires-python"]
    assert f"needs Python {minimum.group(1)}+" in README


def test_readme_recipe_for_a_python_310_vllm_uses_real_options() -> None:
    assert "uv tool install --python 3.12 ." in README
    assert "offload-doctor check --python /path/to/vllm-venv/bin/python" in README
    assert "`compare` starts `vllm serve` as a process: `--vllm-cmd" in README
    ctx = click.Context(cli)
    commands = {c: cli.get_command(ctx, c) for c in ("check", "compare")}
    names = {c: {o for p in cmd.params for o in p.opts} for c, cmd in commands.items() if cmd}
    assert "--python" in names["check"] and "--vllm-cmd" in names["compare"]
