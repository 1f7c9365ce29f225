"""Each truth once: the verdict lives in analyze/verdict.py, and facts and figures have one source."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from vllm_offload_doctor.analyze import verdict

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_offload_doctor"
ENGINE = PACKAGE / "analyze" / "engine.py"


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def test_the_engine_makes_no_decision() -> None:
    # engine.py streams and hands what it saw to verdict.judge: it builds no verdict, finding or
    # offload status, and names no severity or offload status.
    tree = _tree(ENGINE)
    built = [
        f"line {n.lineno}: {n.func.id}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id in {"Verdict", "Finding", "Offload", "Analysis"}
    ]
    named = [
        f"line {n.lineno}: {n.id}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Name) and n.id in {"OffloadStatus", "Severity"}
    ]
    assert built == [] and named == []


def test_the_engine_defines_none_of_the_verdicts_steps() -> None:
    steps = {n for n, v in vars(verdict).items() if callable(v) and not isinstance(v, type)}
    defined = {
        n.name
        for n in ast.walk(_tree(ENGINE))
        if isinstance(n, ast.FunctionDef) and n.name.lstrip("_") in steps
    }
    assert defined == set()


def test_the_docstring_names_every_step_and_each_exists() -> None:
    doc = verdict.__doc__ or ""
    named = set(re.findall(r"`(\w+)`", doc)) - {"Observed", "Clues", "judge", "precedence"}
    assert {"rule_findings", "with_frame", "raise_finding", "choose", "offload_of"} <= named
    missing = [n for n in named if not hasattr(verdict, n)]
    assert missing == []
    # judge runs the numbered steps in the docstring's order
    order = re.findall(r"# (\d+)\n", Path(verdict.__file__).read_text(encoding="utf-8"))
    assert [int(n) for n in order] == sorted(int(n) for n in order) == list(range(1, 11))


def test_precedence_is_declared_only_in_verdict() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "verdict.py"
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id.endswith("PRECEDENCE") for t in node.targets)
    ]
    assert offenders == []


def _attrs_compared_with_strings(path: Path) -> list[str]:
    """Comparisons of a `.category`, `.severity` or `.offload_status` against string literals."""
    found = []
    for node in ast.walk(_tree(path)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        typed = any(
            isinstance(s, ast.Attribute) and s.attr in {"category", "severity", "offload_status"}
            for s in sides
        )
        literal = any(
            isinstance(c, ast.Constant) and isinstance(c.value, str)
            for s in sides
            for c in ([s] if not isinstance(s, ast.Tuple | ast.Set | ast.List) else s.elts)
        )
        if typed and literal:
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_compare_speaks_analyzes_types() -> None:
    offenders = [
        o for p in (PACKAGE / "compare").glob("*.py") for o in _attrs_compared_with_strings(p)
    ]
    assert offenders == []


def test_a_report_on_disk_loads_as_analyzes_types() -> None:
    import json

    from vllm_offload_doctor.analyze.model import Category, Facts, OffloadStatus, Severity
    from vllm_offload_doctor.compare.model import CompareReport

    path = PACKAGE.parent / "fixtures" / "h200-compare" / "needs-offload-v2-default" / "report.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    mode = CompareReport.from_dict(raw).modes[0]
    assert mode.analysis is not None and mode.log_facts is not None
    assert mode.analysis.category is Category.OOM_WEIGHTS
    assert isinstance(mode.analysis.severity, Severity)
    assert isinstance(mode.analysis.offload_status, OffloadStatus)
    assert isinstance(mode.log_facts, Facts) and mode.log_facts.oom_tried_gib == 0.902
    # a category this version does not know (a newer report) still loads
    raw["modes"][0]["analysis"]["category"] = "a_later_category"
    assert CompareReport.from_dict(raw).modes[0].analysis.category is Category.UNKNOWN  # type: ignore[union-attr]


def _sources_outside(folder: str) -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if folder not in p.relative_to(PACKAGE).parts]


def test_the_cuda_oom_line_is_parsed_only_in_analyze() -> None:
    # compare once re-read the raw log with a regex of its own; the figures are analyze's facts.
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in _sources_outside("analyze")
        if "Tried to allocate" in p.read_text(encoding="utf-8")
        or "KV cache is needed" in p.read_text(encoding="utf-8")
    ]
    assert offenders == []


def test_the_oom_figures_are_facts() -> None:
    from vllm_offload_doctor.analyze.engine import analyze_lines

    a = analyze_lines(
        [
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 bytes. GPU 0 has "
            "a total capacity of 79.15 GiB of which 924.00 MiB is free. Including non-PyTorch "
            "memory, this process has 78.23 GiB memory in use.",
            "ValueError: To serve at least one request with the models's max seq len (4096), "
            "(2.50 GiB KV cache is needed, which is larger than the available KV cache memory "
            "(-0.25 GiB).",
        ]
    )
    f = a.facts
    assert (f.oom_tried_gib, f.oom_total_gib, f.oom_free_gib, f.oom_in_use_gib) == (
        0.0,
        79.15,
        0.902,
        78.23,
    )
    assert (f.kv_needed_gib, f.kv_available_gib) == (2.5, -0.25)


def test_condition_facts_are_the_facts_and_the_values_the_verdict_derives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dataclasses import fields

    from vllm_offload_doctor.analyze.engine import Engine
    from vllm_offload_doctor.analyze.model import Facts
    from vllm_offload_doctor.analyze.rules import CONDITION_FACTS

    seen: list[set[str]] = []
    real = verdict.rule_values

    def spy(*args: Any) -> dict[str, Any]:
        values = real(*args)
        seen.append(set(values))
        return values

    monkeypatch.setattr(verdict, "rule_values", spy)
    Engine().analyze_lines(["INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version 0.25.1"])
    assert seen and all(keys == CONDITION_FACTS for keys in seen)
    assert {f.name for f in fields(Facts)} - CONDITION_FACTS == {"args", "ranks"}


def test_one_default_gpu_memory_utilization() -> None:
    from packaging.version import Version

    from vllm_offload_doctor import runner

    assert runner.default_gpu_memory_utilization(Version("0.19.1")) == 0.9
    assert runner.default_gpu_memory_utilization(Version("0.20.0")) == 0.92
    assert runner.default_gpu_memory_utilization(None) == 0.92
    offenders = [
        f"{p.relative_to(PACKAGE)}:{n.lineno}"
        for p in PACKAGE.rglob("*.py")
        if p.name != "runner.py"
        for n in ast.walk(_tree(p))
        if isinstance(n, ast.Constant) and n.value == 0.92
    ]
    assert offenders == []


def test_compare_reads_a_failed_engine_with_analyzes_patterns() -> None:
    from vllm_offload_doctor.compare import progress

    # Nor does any compare module keep its own copy of the engine's wrapper lines.
    for path in (PACKAGE / "compare").glob("*.py"):
        src = path.read_text(encoding="utf-8")
        assert "failed to start" not in src and "initialization failed" not in src, path.name
        assert "Failed core proc" not in src, path.name
    line = "(EngineCore_DP0 pid=9) ERROR 12-02 10:00:00 [core.py:1] EngineCore failed to start."
    assert verdict.FATAL_HINT.search(line)
    assert progress.phase_of(line, "loading weights") == "failed"
    assert progress.phase_of("RuntimeError: boom", "loading weights") == "failed"
    from vllm_offload_doctor.analyze.engine import analyze_lines

    wrapper = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
    assert analyze_lines([wrapper]).facts.engine_core_failed
    assert not analyze_lines(["RuntimeError: boom"]).facts.engine_core_failed


def test_command_exit_statuses_come_from_exitcodes() -> None:
    # A command's status is a name of exitcodes.py, never a bare number.
    files = [*PACKAGE.rglob("cli.py"), PACKAGE / "compare" / "run.py"]
    offenders = [
        f"{p.relative_to(PACKAGE)}:{n.lineno}"
        for p in files
        for fn in ast.walk(_tree(p))
        if isinstance(fn, ast.FunctionDef)
        and isinstance(fn.returns, ast.Name | ast.Constant)
        and getattr(fn.returns, "id", getattr(fn.returns, "value", None)) == "int"
        for n in ast.walk(fn)
        if isinstance(n, ast.Return)
        and any(
            isinstance(c, ast.Constant) and type(c.value) is int
            for c in ast.walk(n.value or ast.Constant(None))
        )
    ]
    assert offenders == []
