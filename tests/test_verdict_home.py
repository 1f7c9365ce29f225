"""Each truth once: the verdict lives in analyze/verdict.py, and facts and figures have one source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from vllm_offload_doctor.analyze import verdict

PACKAGE = Path(__file__).resolve().parents[1] / "vllm_offload_doctor"
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
