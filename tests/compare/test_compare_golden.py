"""The typed compare report reads and writes report.json schema 1 byte for byte (real H200 runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_offload_doctor.compare.model import CompareReport, CompareStatus
from vllm_offload_doctor.compare.render import RENDERERS, render_markdown

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "h200-compare"
RUNS = sorted(p.parent for p in FIXTURES.glob("*/report.json"))


def test_there_are_golden_runs() -> None:
    assert len(RUNS) >= 4


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_round_trip_is_byte_identical(run: Path) -> None:
    text = (run / "report.json").read_text(encoding="utf-8")
    report = CompareReport.from_dict(json.loads(text))
    assert json.dumps(report.to_dict(), indent=2, ensure_ascii=False) == text


@pytest.mark.parametrize(
    "run", [r for r in RUNS if (r / "report.md").exists()], ids=lambda p: p.name
)
def test_markdown_matches_the_saved_report(run: Path) -> None:
    report = CompareReport.from_dict(json.loads((run / "report.json").read_text()))
    assert render_markdown(report) == (run / "report.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_typed_fields_carry_the_verdict(run: Path) -> None:
    raw = json.loads((run / "report.json").read_text())
    report = CompareReport.from_dict(raw)
    assert report.verdict.status == CompareStatus(raw["verdict"]["status"])
    assert [m.label for m in report.modes] == [m["label"] for m in raw["modes"]]
    base = report.modes[0]
    assert base.log_facts is not None
    assert base.log_facts.model_loading_gib == raw["modes"][0]["log_facts"]["model_loading_gib"]


def test_every_format_has_a_renderer_and_renders() -> None:
    from vllm_offload_doctor.compare.cli import compare

    fmt = next(p for p in compare.params if p.name == "fmt")
    assert set(fmt.type.choices) == set(RENDERERS)  # type: ignore[attr-defined]
    report = CompareReport.from_dict(json.loads((RUNS[0] / "report.json").read_text()))
    for name, render in RENDERERS.items():
        out = render(report, "/out")
        assert report.verdict.finding.title in out, name
    assert json.loads(RENDERERS["json"](report, None)) == report.to_dict()


@pytest.mark.parametrize(
    "run", [r for r in RUNS if (r / "report.md").exists()], ids=lambda p: p.name
)
def test_the_saved_files_are_the_renderers_output(run: Path) -> None:
    from vllm_offload_doctor.compare.html import render_compare_html
    from vllm_offload_doctor.compare.render import report_files

    report = CompareReport.from_dict(json.loads((run / "report.json").read_text()))
    files = report_files(report)
    assert list(files) == ["report.json", "report.md", "report.html"]  # the order they are saved
    assert files["report.json"] == (run / "report.json").read_text(encoding="utf-8")
    assert files["report.md"] == (run / "report.md").read_text(encoding="utf-8")
    assert files["report.html"] == render_compare_html(report)
