"""The package anyone can build: licence, sdist contents, pinned CI tools, lower bounds, skip reasons."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements() -> list[Requirement]:
    project = PYPROJECT["project"]
    return [
        Requirement(r)
        for r in [*project["dependencies"], *project["optional-dependencies"]["test"]]
    ]


def _pins(name: str) -> dict[str, Version]:
    pins = {}
    for line in (ROOT / ".ci" / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            package, version = line.split("==")
            pins[package.lower()] = Version(version)
    return pins


def test_license_is_the_apache_2_text_pyproject_declares() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_sdist_carries_what_its_tests_read() -> None:
    """An unpacked sdist runs its own tests (.ci/run does it): everything they open must be in it."""
    # hatchling always adds pyproject.toml
    include = {
        *PYPROJECT["tool"]["hatch"]["build"]["targets"]["sdist"]["include"],
        "pyproject.toml",
    }
    read = set()
    for test in ROOT.glob("tests/**/*.py"):
        # ROOT / "scripts" / ..., parents[2] / "fixtures" / ...: top-level paths the tests open
        read |= {
            path.split("/")[0]
            for path in re.findall(
                r'(?:ROOT|REPO|parents\[2\]|parent\.parent) / "([^"]+)"', test.read_text()
            )
        }
    assert read, "no repository path found in the tests: the pattern above is stale"
    assert read <= include, f"tests read {sorted(read - include)}, which the sdist lacks"
    assert {"LICENSE", "README.md", "rules", "tests", "vllm_offload_doctor"} <= include


def test_lowest_pins_are_pyprojects_lower_bounds() -> None:
    """.ci/run lints and type-checks with .ci/lowest.txt: it must be what pyproject allows at least."""
    lowest = _pins("lowest.txt")
    bounded = {}
    for req in _requirements():
        floors = [Version(s.version) for s in req.specifier if s.operator == ">="]
        if floors:
            bounded[req.name.lower()] = max(floors)
    assert lowest == bounded


def test_ci_tool_pins_satisfy_pyproject() -> None:
    pins = _pins("constraints.txt")
    for tool in ("ruff", "mypy", "import-linter", "pytest", "hypothesis"):
        assert tool in pins, f"{tool} is not pinned in .ci/constraints.txt"
    for req in _requirements():
        if req.name.lower() in pins:
            assert req.specifier.contains(pins[req.name.lower()]), (req, pins[req.name.lower()])


def test_every_skip_says_why(tmp_path: Path) -> None:
    """Without ../shared (an unpacked sdist) the corpus tests skip and name the path they looked at."""
    missing = tmp_path / "no-corpus"
    env = {**os.environ, "OFFLOAD_DOCTOR_CORPUS": str(missing)}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "tests/analyze/test_inputs.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert skipped, out
    for line in skipped:
        reason = line.split(": ", 1)[1]
        assert reason and reason != "unconditional skip", line
    assert any(f"labelled corpus not found at {missing}" in line for line in skipped)
