"""`offload-doctor rules ID`: the user's view, prefixes and several ids, --verbose, markdown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from vllm_offload_doctor.analyze.rules import load_rules
from vllm_offload_doctor.cli import cli
from vllm_offload_doctor.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = (
    "What it means",
    "Why vLLM says it",
    "What to do",
    "Example log lines",
    "Source (vLLM file and versions)",
)


def run(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), standalone_mode=False)
    assert result.exception is None, result.output
    assert result.return_value == 0
    return result.output


def test_user_view_has_the_sections_and_no_author_syntax() -> None:
    out = run("rules", "OFF001")
    positions = [out.index(s) for s in SECTIONS]
    assert positions == sorted(positions)
    for author in ("[[", "when all", "pattern:", "site-packages", "{cpu_offload_gb}"):
        assert author not in out
    # A real line from the rule's own case, and the vLLM file that prints it with its releases.
    assert "  - Using V2 Model Runner" in out
    assert "vllm/v1/worker/gpu_worker.py:" in out and "0.33.0" in out
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in out


def test_user_view_fits_80_columns_for_every_rule() -> None:
    for rule in load_rules():
        out = run("rules", rule.id)
        wide = [line for line in out.splitlines() if len(line) > 80 and " " in line.strip()[:78]]
        assert not wide, (rule.id, wide)
        assert all(s in out for s in SECTIONS[:3]), rule.id


def test_verbose_keeps_the_author_view() -> None:
    out = run("rules", "OFF001", "--verbose")
    assert "when all: offload_requested" in out
    assert "[[ of {cpu_offload_gb} GiB per GPU]]" in out
    assert "What it means" not in out


def test_prefix_and_several_ids() -> None:
    oom = [r.id for r in load_rules() if r.id.startswith("OOM")]
    out = run("rules", "oom")
    heads = [line.split()[0] for line in out.splitlines() if line[:3] == "OOM" and "(" in line]
    assert heads == sorted(oom)
    out = run("rules", "OFF001", "OOM003")
    assert out.index("OFF001 (") < out.index("OOM003 (")
    docs = json.loads(run("rules", "OFF001", "OOM003", "--format", "json"))
    assert [d["id"] for d in docs] == ["OFF001", "OOM003"]


def test_unknown_id_is_an_input_error_even_beside_a_good_one() -> None:
    result = CliRunner().invoke(cli, ["rules", "OFF001", "NOPE9"], standalone_mode=False)
    assert isinstance(result.exception, InputError)
    assert "NOPE9" in str(result.exception)


def test_markdown_table_is_the_readme_table() -> None:
    out = run("rules", "--format", "markdown")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    body = readme.split("<!-- rules:start -->")[1].split("<!-- rules:end -->")[0]
    assert out.strip() == body.strip()


@pytest.mark.parametrize("rule_id", ["OFF001", "OOM003"])
def test_markdown_rule(rule_id: str) -> None:
    out = run("rules", rule_id, "--format", "markdown")
    assert out.startswith(f"### `{rule_id}`")
    assert "**What to do:**" in out and "```text" in out
