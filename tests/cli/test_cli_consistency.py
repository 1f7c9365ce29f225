"""The commands behave like one tool: help, --format registries, colour, cuts, rule ids, columns."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from fake_probe import FakeProbe

from vllm_offload_doctor.analyze.cli import analyze
from vllm_offload_doctor.analyze.render import RENDERERS, Renderer
from vllm_offload_doctor.analyze.rules import load_rules
from vllm_offload_doctor.cli import cli
from vllm_offload_doctor.errors import RuleFileError
from vllm_offload_doctor.machine import probes
from vllm_offload_doctor.output.color import paint, use_color
from vllm_offload_doctor.output.formats import ELLIPSIS, FORMATS, OutputFormat, shorten

ROOT = Path(__file__).resolve().parents[2]
IGNORED_LOG = ROOT / "fixtures/logs/offload-ignored-v2-0.25.1.log"
ANSI = re.compile(r"\x1b\[")
ANSI_CODES = re.compile(r"\x1b\[[0-9;]*m")


def invoke(*args: str) -> tuple[int, str]:
    """Run the CLI in-process; the exit status the commands return, and stdout."""
    result = CliRunner().invoke(cli, list(args), standalone_mode=False)
    assert result.exception is None, result.output
    return result.return_value, result.output


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


# --- help -----------------------------------------------------------------------------


def test_top_level_help_lists_each_command_once() -> None:
    out = CliRunner().invoke(cli, ["--help"]).output
    for name in ("check", "compare", "analyze", "rules"):
        assert len(re.findall(rf"^\s+{name}\s", out, re.MULTILINE)) == 1, out


# --- colour ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "env", "tty", "expected"),
    [
        (None, {}, True, True),
        (None, {}, False, False),
        (None, {"NO_COLOR": "1"}, True, False),
        (None, {"NO_COLOR": ""}, True, True),  # empty NO_COLOR does not count (no-color.org)
        (None, {"FORCE_COLOR": "1"}, False, True),
        (None, {"CLICOLOR_FORCE": "1"}, False, True),
        (None, {"FORCE_COLOR": "0"}, False, False),
        (None, {"FORCE_COLOR": "1", "NO_COLOR": "1"}, False, False),
        (None, {"TERM": "dumb"}, True, False),
        (None, {"TERM": "dumb", "FORCE_COLOR": "1"}, True, True),
        (True, {"NO_COLOR": "1", "TERM": "dumb"}, False, True),
        (False, {"FORCE_COLOR": "1"}, True, False),
    ],
)
def test_colour_decision(flag: bool | None, env: dict[str, str], tty: bool, expected: bool) -> None:
    stream = _Tty() if tty else io.StringIO()
    assert use_color(flag, env, stream) is expected


def test_paint_is_the_one_ansi_path() -> None:
    assert paint("x", "red", "bold") == "\x1b[31;1mx\x1b[0m"
    assert paint("x", "red", color=False) == "x"


@pytest.mark.parametrize(
    ("args", "env", "coloured"),
    [
        (["--color"], {"NO_COLOR": "1"}, True),
        (["--no-color"], {"FORCE_COLOR": "1"}, False),
        ([], {"FORCE_COLOR": "1"}, True),
        ([], {"TERM": "dumb"}, False),
    ],
)
def test_check_colour_follows_the_same_rules(
    args: list[str], env: dict[str, str], coloured: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probes, "RealProbe", lambda: FakeProbe())
    for name in ("NO_COLOR", "FORCE_COLOR", "CLICOLOR_FORCE", "TERM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert bool(ANSI.search(invoke("check", *args)[1])) is coloured


# --- formats --------------------------------------------------------------------------


def test_analyze_format_choices_are_its_renderer_registry() -> None:
    option = next(p for p in analyze.params if p.name == "fmt")
    assert isinstance(option.type, click.Choice)
    choices = [OutputFormat(c) for c in option.type.choices]
    assert list(FORMATS["analyze"]) == list(RENDERERS) == choices


@pytest.mark.parametrize("fmt", list(RENDERERS))
def test_every_analyze_format_renders_one_and_several_logs(fmt: OutputFormat) -> None:
    for paths in ([IGNORED_LOG], [IGNORED_LOG, IGNORED_LOG]):
        code, out = invoke("analyze", "--format", fmt.value, *map(str, paths))
        assert code == 1, out  # a failure diagnosed
        assert "offload_ignored" in out


def test_compare_format_choices_are_its_renderer_registry() -> None:
    from vllm_offload_doctor.compare.cli import compare
    from vllm_offload_doctor.compare.render import RENDERERS as COMPARE_RENDERERS

    option = next(p for p in compare.params if p.name == "fmt")
    assert isinstance(option.type, click.Choice)
    assert list(COMPARE_RENDERERS) == [OutputFormat(c) for c in option.type.choices]


class _FinishedRun:
    """compare's run replaced by a finished one (a real H200 report): the CLI alone is tested."""

    def __init__(self, cfg: object, progress: object = None, **_: object) -> None:
        from vllm_offload_doctor.compare.model import CompareReport

        self.cfg = cfg
        self.report = CompareReport.from_dict(json.loads(GOLDEN_COMPARE.read_text()))

    def execute(self) -> int:
        return 0


GOLDEN_COMPARE = ROOT / "fixtures/h200-compare/v1-runner/report.json"


def invoke_compare(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[int, str]:
    import vllm_offload_doctor.compare.run as compare_run

    monkeypatch.setattr(compare_run, "CompareRun", _FinishedRun)
    for name in ("NO_COLOR", "FORCE_COLOR", "CLICOLOR_FORCE", "TERM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    return invoke("compare", "--vllm-cmd", sys.executable, "--out", str(tmp_path / "run"), *args)


@pytest.mark.parametrize("fmt", ["text", "json", "markdown"])
def test_every_compare_format_renders_through_the_cli(
    fmt: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code, out = invoke_compare(monkeypatch, tmp_path, "--format", fmt)
    assert code == 0
    title = json.loads(GOLDEN_COMPARE.read_text())["verdict"]["title"]
    assert title in (json.loads(out)["verdict"]["title"] if fmt == "json" else out)


@pytest.mark.parametrize(
    ("args", "env", "coloured"),
    [
        (["--color"], {"NO_COLOR": "1"}, True),
        (["--no-color"], {"FORCE_COLOR": "1"}, False),
        ([], {"FORCE_COLOR": "1"}, True),
        ([], {"CLICOLOR_FORCE": "1"}, True),
        ([], {"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),
        ([], {"TERM": "dumb"}, False),
        ([], {}, False),  # not a terminal
        (["--color", "--format", "json"], {}, False),  # only text is coloured
    ],
)
def test_compare_colour_follows_the_same_rules(
    args: list[str],
    env: dict[str, str],
    coloured: bool,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    out = invoke_compare(monkeypatch, tmp_path, *args, env=env)[1]
    assert bool(ANSI.search(out)) is coloured
    if coloured:  # the verdict line, through the one painting path
        verdict = next(line for line in out.splitlines() if "Verdict:" in line)
        assert verdict == paint(ANSI_CODES.sub("", verdict), "green", "bold")


def test_compare_takes_tensor_parallel_size_like_vllm(tmp_path: Path) -> None:
    out = tmp_path / "run"
    base = ["compare", "--vllm-cmd", sys.executable, "--out", str(out), "--dry-run"]
    code, text = invoke(*base, "-tp", "2")
    assert code == 0 and "--tensor-parallel-size 2" in text
    code, text = invoke(*base, "--tensor-parallel-size", "2", "--", "-tp", "2")
    assert code == 0 and " -tp 2" in text and "--tensor-parallel-size" not in text  # given once
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", *base, "-tp", "2", "--", "-tp", "4"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "-tp 4 after `--` contradicts" in proc.stderr


def test_analyze_has_no_dead_format_enum() -> None:
    import vllm_offload_doctor.analyze.render as render

    assert not hasattr(render, "OutputFormat") or render.OutputFormat is OutputFormat


# --- text cuts, verdict line, rules columns -------------------------------------------------


def test_shorten_cuts_at_a_word_with_an_ellipsis() -> None:
    text = "CUDA out of memory. Tried to allocate 924.00 MiB. GPU 0 has a total capacity"
    cut = shorten(text, 40)
    assert len(cut) <= 40 and cut.endswith(ELLIPSIS)
    assert text.startswith(cut[:-1]) and cut[-2] != " "
    assert text[len(cut) - 1] == " "  # the cut fell between words
    assert shorten(text, len(text)) == text
    assert shorten("x" * 50, 10) == "x" * 9 + ELLIPSIS  # one long word is cut inside


def test_long_evidence_and_summaries_end_in_an_ellipsis() -> None:
    from dataclasses import replace

    from vllm_offload_doctor.analyze.engine import analyze_file
    from vllm_offload_doctor.analyze.model import Evidence

    analysis = analyze_file(IGNORED_LOG)
    long_line = "ERROR " + " ".join(f"word{i}" for i in range(120))
    top = replace(analysis.findings[0], evidence=(Evidence(7, long_line),))
    analysis = replace(analysis, findings=(top, *analysis.findings[1:]))
    r = Renderer()
    lines = r.text(analysis).splitlines()
    first = next(i for i, line in enumerate(lines) if "word1 " in line)
    # The evidence wraps under its text: the lines after the first hang at its column.
    end = next(i for i, line in enumerate(lines) if line.startswith("  remedy:"))
    block = lines[first:end]
    assert all(ln.startswith(" " * 12) and len(ln) <= 80 for ln in block[1:])
    assert block[-1].endswith(ELLIPSIS)
    shown = " ".join([block[0].split(": ", 1)[1], *(ln.strip() for ln in block[1:])])
    assert (
        len(shown) <= 300 and long_line.startswith(shown[:-1]) and long_line[len(shown) - 1] == " "
    )
    rows = r.triage_table([analysis], [], markdown=False).splitlines()[1:2]
    assert len(analysis.verdict.summary) > 100 and rows[0].endswith(ELLIPSIS)


def test_verdict_line_names_its_rule() -> None:
    out = invoke("analyze", str(IGNORED_LOG))[1]
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("verdict:"))
    assert lines[at].endswith("[OFF001]") or lines[at + 1].endswith("[OFF001]")


def test_rules_columns_line_up_for_every_id_length(tmp_path: Path) -> None:
    src = (ROOT / "rules" / "PORT001-address-in-use.toml").read_text()
    (tmp_path / "LONGX123-x.toml").write_text(
        src.replace('id = "PORT001"', 'id = "LONGX123"')
        .replace("port-in-use", "long-x")
        .split("[[cases]]")[0]
    )
    out = invoke("rules", "--rules", str(tmp_path))[1]
    lines = out.splitlines()
    assert any(line.startswith("PY001 ") for line in lines)
    assert any(line.startswith("LONGX123") for line in lines)
    starts = {re.search(r"\s{2}(\S)", line).start(1) for line in lines}  # type: ignore[union-attr]
    assert len(starts) == 1, out


@pytest.mark.parametrize("key", ["aliases", "summary"])
def test_dropped_rule_keys_are_rejected(tmp_path: Path, key: str) -> None:
    src = (ROOT / "rules" / "PORT001-address-in-use.toml").read_text().split("[[cases]]")[0]
    (tmp_path / "PORT901-x.toml").write_text(
        f'{key} = ["x"]\n' + src.replace("PORT001", "PORT901").replace("port-in-use", "x")
    )
    with pytest.raises(RuleFileError, match=key):
        load_rules([tmp_path])


def test_renderer_colours_only_text_through_paint() -> None:
    r = Renderer(color=True)
    assert r._style("x", "red") == paint("x", "red")


def test_no_ansi_in_a_pipe_by_default() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")}
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", "analyze", str(IGNORED_LOG)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert "offload_ignored" in proc.stdout and not ANSI.search(proc.stdout)


# vLLM's spelling and ours, accepted together wherever either is.
SAME_OPTION = (
    {"--offload-gb", "--cpu-offload-gb"},
    {"--tensor-parallel-size", "-tp"},
    {"--color", "--no-color"},
)


@pytest.mark.parametrize("name", ["check", "compare", "analyze", "rules"])
def test_vllms_option_names_are_accepted_wherever_ours_are(name: str) -> None:
    assert isinstance(cli, click.Group)
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    for param in command.params:
        names = {*param.opts, *param.secondary_opts}
        for same in SAME_OPTION:
            if names & same:
                assert same <= names, f"{name}: {sorted(names)} lacks {sorted(same - names)}"


def test_check_takes_vllms_option_names() -> None:
    check = cli.get_command(click.Context(cli), "check")
    assert check is not None
    params = {o for p in check.params for o in (*p.opts, *p.secondary_opts)}
    assert {"--cpu-offload-gb", "-tp", "--tensor-parallel-size", "--offload-gb"} <= params
