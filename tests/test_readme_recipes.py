"""The README's "in five minutes" recipes work as written."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest
from test_checks import FakeProbe

from vllm_offload_doctor import checks
from vllm_offload_doctor.checks import Options, Status, run_checks
from vllm_offload_doctor.checks import registry as check_registry

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_every_repo_path_the_readme_names_exists() -> None:
    paths = set(re.findall(r"`((?:rules|fixtures|tests|scripts|bench)/[^`<\s]+)`", README))
    assert "fixtures/h200-compare/needs-offload-README.md" in paths
    assert [p for p in sorted(paths) if not (ROOT / p).exists()] == []


def test_readme_shows_compare_for_a_model_that_does_not_fit() -> None:
    section = README.split("**`offload-doctor compare`**", 1)[1].split("**`offload-doctor analyze", 1)[0]
    for words in ("needs offload", "--verify-fix", "`ignored`", "`effective`", "needs-offload"):
        assert words in section, words
    # the fake-vllm recipe uses scenarios the fake knows
    fake = (ROOT / "tests" / "fake-vllm").read_text()
    for scenario in set(re.findall(r"FAKE_VLLM_SCENARIO=([\w-]+)", section)):
        assert f"    {scenario}" in fake, scenario


def test_where_things_live_names_files_that_exist() -> None:
    table = README.split("### Where things live", 1)[1].split("###", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    # the header, then a rule, a fact, a check, an output format, a compare measurement
    assert len(rows) == 6
    paths = set(re.findall(r"`((?:rules|fixtures|tests|vllm_offload_doctor)/[^`<]+)`", table))
    modules = set(re.findall(r"`(\w+)\.\w+`", table))  # `facts.FactCollector`, `render.py`
    assert paths and modules
    for path in paths:
        assert (ROOT / path).exists(), path
    package = ROOT / "vllm_offload_doctor"
    for module in modules:
        assert (package / f"{module}.py").exists() or (package / module).is_dir(), module


def test_the_check_template_joins_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fill the README's check template in, add it to MODULES: it runs, in that place."""
    block = README.split("**A check.**", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    source = (
        block.replace("<id>", "example")
        .replace("<Title>", "Example")
        .replace("<name>", "example")
        .replace("if ... else", "if ctx.options.port == 8000 else")
    )
    name = "vllm_offload_doctor.checks.example"
    module = types.ModuleType(name)
    module.__file__ = f"<README: {name}>"
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(check_registry, "REGISTERED", list(check_registry.REGISTERED))
    checks.all_checks.cache_clear()
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    monkeypatch.setattr(checks, "MODULES", (*checks.MODULES[:-1], "example", checks.MODULES[-1]))
    try:
        results = run_checks(FakeProbe(), Options()).checks
    finally:
        checks.all_checks.cache_clear()
    assert [c.id for c in results][-2:] == ["example", "env"]
    example = results[-2]
    assert example.status is Status.OK and example.title == "Example"
    assert module.__doc__ and "check --list -v" in module.__doc__
