"""Pasted reports (collect-env, pip list, nvidia-smi, shell prompts, our own check/compare/analyze
output) are never read as log lines; their facts fill what the log lacks (issue 8.7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_offload_doctor.analyze.engine import analyze_file, analyze_lines
from vllm_offload_doctor.analyze.model import Category

HERE = Path(__file__).parents[1] / "pasted"
FIXTURES = Path(__file__).parents[2] / "fixtures"


def _both(path: Path):  # type: ignore[no-untyped-def]
    """The prefiltered (file) and unfiltered (lines) analyses, which must agree."""
    a = analyze_file(path)
    b = analyze_lines(path.read_text(encoding="utf-8").splitlines())
    assert (a.verdict.category, a.facts) == (b.verdict.category, b.facts)
    return a


def test_collect_env_gives_facts_and_no_verdict_of_its_own() -> None:
    a = _both(HERE / "collect-env-then-oom.log")
    f = a.facts
    assert (f.torch_version, f.gpu_name, f.driver_version, f.cuda_version) == (
        "2.5.1+cu124",
        "NVIDIA L40S",
        "550.90.07",
        "12.4.131",
    )
    assert f.vllm_version == "0.6.6.post1"  # the log's own line
    assert f.cpu_offload_gb == 20.0  # from the `$ vllm serve` prompt line
    assert f.pasted_reports == ["vllm collect-env"]
    # The log ends in 'Killed' under a 20 GiB offload: the OOM killer (LABELING.md: oom_host).
    assert a.verdict.category.value == "oom_host" and "OOM killer" in a.verdict.title
    assert "2 x --cpu-offload-gb" in a.verdict.summary and "about 40 GiB" in a.verdict.summary
    assert "journalctl -k" in a.verdict.remedy


def test_check_output_after_a_log_does_not_change_its_verdict() -> None:
    a = _both(HERE / "oom-then-check.log")
    assert a.verdict.category is Category.OOM_WEIGHTS
    assert all("[✗]" not in e.text and "→" not in e.text for f in a.findings for e in f.evidence)
    assert a.facts.pasted_reports == ["offload-doctor check"]


def test_markdown_check_alone_is_not_a_failure_but_gives_versions() -> None:
    a = _both(HERE / "markdown-check-only.md.log")
    assert a.verdict.category is Category.UNKNOWN and not a.findings
    assert "offload-doctor check output" in a.verdict.summary
    assert (a.facts.vllm_version, a.facts.torch_version) == ("0.25.1", "2.11.0")


def test_pip_list_dates_an_undated_log() -> None:
    a = _both(HERE / "pip-list-then-healthy.log")
    assert a.verdict.category is Category.HEALTHY
    assert (a.facts.vllm_version, a.facts.torch_version) == ("0.11.0", "2.9.0")
    # vLLM 0.11 logs nothing about offloading: unknown, not ignored and not effective.
    assert a.offload.status.value == "unknown" and "0.17" in a.offload.explanation


@pytest.mark.parametrize(
    "name",
    [
        "check-h200.txt",
        "tp2-v2-default/check-tp2.txt",
        "v2-default/compare-v2.txt",
        "tp2-v1-runner/compare-tp2-v1.txt",
        "v1-runner/commands.txt",
        "v2-default/commands.txt",
        "v1-runner/report.md",
        "tp2-v1-runner/report.md",
    ],
)
def test_compare_out_folder_reports_give_no_false_verdict(name: str) -> None:
    a = _both(FIXTURES / "h200-compare" / name)
    assert a.verdict.category is Category.UNKNOWN
    assert not a.findings
    # The commands compare ran are not this input's arguments.
    assert a.offload.status.value == "not_requested"
    assert a.facts.pasted_reports


def test_our_analyze_output_pasted_alone_reads_its_quoted_evidence_only() -> None:
    text = [
        "fixtures/x.log",
        "  verdict:  python_env — Broken Python environment: missing module, wrong Python or ABI mismatch",
        "  The Python environment that runs vLLM is broken or incomplete (ModuleNotFoundError).",
        "  offload:  not_requested (no request seen) — no --cpu-offload-gb above 0 in the log",
        "  facts:    vLLM 0.8.5, runner unknown, never ready",
        "  remedy:   Install vLLM in a fresh virtual environment; ImportError: cannot import name 'x'",
    ]
    a = analyze_lines(text)
    assert a.verdict.category is Category.UNKNOWN and not a.findings
    assert a.facts.pasted_reports == ["offload-doctor analyze"]


def _anchored(pattern: str) -> bool:
    """Whether every top-level branch of a pattern begins with `^`."""
    import re._parser as sre_parse

    parsed = sre_parse.parse(pattern)
    branches = [parsed]
    if len(parsed) == 1 and parsed[0][0] is sre_parse.BRANCH:
        branches = parsed[0][1][1]
    at = sre_parse.AT, sre_parse.AT_BEGINNING
    return all(len(b) and tuple(b[0]) == at for b in branches)


def test_the_shapes_are_found_as_trying_them_in_turn_finds_them() -> None:
    # One match of their alternation stands for a search with each shape in order, which holds
    # while every shape is anchored at the start.
    from vllm_offload_doctor.analyze import reports

    assert all(_anchored(rx.pattern) for _, rx in reports._SHAPES)
    assert not _anchored(r"^a|b")
    corpus = Path(__file__).parents[3] / "shared" / "corpus"
    logs = [*HERE.glob("*.log"), *FIXTURES.glob("**/*.log"), *corpus.glob("*.log")]
    lines = [raw for log in logs for raw in log.read_text("utf-8", "replace").split("\n")]
    found = 0
    for text in lines:
        kind = next((k for k, rx in reports._SHAPES if rx.search(text)), None)
        assert reports.Reports()._kind(5, text) == kind, text
        found += kind is not None
    assert found > 30
