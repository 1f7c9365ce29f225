"""Server starts in one log (runs.py): each start judged on its own lines, the result the last's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from vllm_offload_doctor.analyze import engine as analyze
from vllm_offload_doctor.analyze.model import Category

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
OOM = (LOGS / "oom-weights-0.25.1.log").read_bytes()
HEALTHY = (LOGS / "healthy-0.25.1.log").read_bytes()


def _cli(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", "analyze", *args, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


def _restart(log: bytes, r: int) -> bytes:
    """The log as restart `r` prints it: other pids."""
    return re.sub(rb"pid=(\d+)", lambda m: b"pid=%d" % (int(m.group(1)) + 7 * r), log)


def test_a_failed_start_then_a_healthy_one_are_two_runs(tmp_path: Path) -> None:
    path = tmp_path / "two.log"
    path.write_bytes(OOM + HEALTHY)
    proc = _cli(path, "--format", "json")
    result = json.loads(proc.stdout)["results"][0]
    runs = result["runs"]
    assert [r["verdict"]["category"] for r in runs] == ["oom_weights", "healthy"]
    assert runs[0]["facts"]["reached_ready"] is False  # the OOM start never claims readiness
    assert runs[1]["facts"]["reached_ready"] is True
    # The new start begins at its banner's version line (the blank art lines above carry nothing).
    end = OOM.count(b"\n")
    assert end <= runs[0]["last_line"] < runs[1]["first_line"] <= end + 3
    assert result["verdict"]["category"] == "healthy"  # the last start's
    assert result["facts"]["reached_ready"] is True
    text = _cli(path).stdout
    assert re.search(r"earlier: lines 1-\d+: oom_weights", text), text


def test_one_start_gets_one_run_and_keeps_its_fields(tmp_path: Path) -> None:
    path = tmp_path / "oom.log"
    path.write_bytes(OOM)
    result = json.loads(_cli(path, "--format", "json").stdout)["results"][0]
    assert list(result)[-2:] == ["runs", "schema_version"]  # only `runs` is new
    (run,) = result["runs"]
    assert run["verdict"] == result["verdict"] and run["facts"] == result["facts"]
    assert run["starts"] == 1
    assert "starts:" not in _cli(path).stdout


def test_a_crash_loop_is_one_line_with_its_count(tmp_path: Path) -> None:
    path = tmp_path / "loop.log"
    path.write_bytes(b"".join(_restart(OOM, r) for r in range(5)))
    result = json.loads(_cli(path, "--format", "json").stdout)["results"][0]
    (run,) = result["runs"]
    assert run["starts"] == 5 and run["verdict"]["category"] == "oom_weights"
    assert run["last_line"] == 5 * OOM.count(b"\n")
    text = _cli(path).stdout
    assert "the same failure, 5 times" in text
    assert text.count("oom_weights —") == 2  # the verdict line and the one runs line


def test_a_nul_hole_between_writers_splits(tmp_path: Path) -> None:
    path = tmp_path / "hole.log"
    path.write_bytes(HEALTHY + b"\0" * 5000 + OOM)
    result = json.loads(_cli(path, "--format", "json").stdout)["results"][0]
    assert [r["verdict"]["category"] for r in result["runs"]] == ["healthy", "oom_weights"]
    assert result["verdict"]["category"] == "oom_weights"


def test_a_new_command_line_splits_without_a_banner() -> None:
    lines = [
        "$ vllm serve m --cpu-offload 4",
        "vllm serve: error: ambiguous option: --cpu-offload could match --cpu-offload-gb, --cpu-offload-params",
        "$ vllm serve m --cpu-offload-gb 4",
        "INFO:     Application startup complete.",
    ]
    a = analyze.analyze_lines(lines)
    assert len(a.runs) == 2
    assert a.runs[0].last_line == 2 and a.runs[1].first_line == 3
    assert a.runs[1].facts.reached_ready and not a.runs[0].facts.reached_ready


def test_a_message_quoting_vllm_serve_is_no_new_start() -> None:
    lines = [
        "$ vllm serve --model mistralai/Mistral-7B-Instruct-v0.3",
        "Traceback (most recent call last):",
        '  File "/x/vllm/entrypoints/cli/main.py", line 48, in main',
        "ValueError: With `vllm serve`, you should provide the model as a positional argument",
    ]
    assert len(analyze.analyze_lines(lines).runs) == 1


def test_a_start_cut_off_after_its_banner_leaves_the_verdict_to_the_one_before(
    tmp_path: Path,
) -> None:
    cut = b"".join(HEALTHY.splitlines(keepends=True)[:6])  # banner only, then the log ends
    path = tmp_path / "cut.log"
    path.write_bytes(OOM + _restart(cut, 1))
    a = analyze.analyze_file(path)
    assert [r.verdict.category for r in a.runs] == [Category.OOM_WEIGHTS, Category.UNKNOWN]
    assert a.verdict.category is Category.OOM_WEIGHTS


def test_args_before_the_banner_is_one_start() -> None:
    # vLLM 0.33 prints `non-default args` before its version banner; 0.25 the other way round.
    log = Path(__file__).resolve().parents[1] / "unseen" / "healthy-v2-offload-0.33.log"
    a = analyze.analyze_file(log)
    assert len(a.runs) == 1
    assert a.facts.cpu_offload_gb == 10.0  # the args line stays with the start it belongs to


def test_command_lines_inside_pasted_compare_commands_start_nothing() -> None:
    # compare's commands.txt lists one `vllm serve` line per mode: a pasted report, not restarts.
    commands = Path(__file__).resolve().parents[2] / "fixtures" / "h200-compare" / "v1-runner"
    a = analyze.analyze_file(commands / "commands.txt")
    assert (commands / "commands.txt").read_text().count("\nvllm serve ") >= 2
    assert len(a.runs) == 1


def test_a_new_pid_after_the_start_died_splits_without_a_banner(tmp_path: Path) -> None:
    lines = OOM.splitlines(keepends=True)
    body = b"".join(
        line for line in lines if b"non-default args" not in line and b"version" not in line
    )
    path = tmp_path / "restart.log"
    path.write_bytes(OOM + _restart(body, 1))
    a = analyze.analyze_file(path)
    (run,) = a.runs  # the same failure twice: one entry
    assert run.starts == 2 and run.verdict.category is Category.OOM_WEIGHTS


def test_a_new_pid_while_the_start_runs_is_no_new_start() -> None:
    log = (LOGS / "healthy-0.25.1.log").read_text().splitlines()
    up = log[: next(i for i, line in enumerate(log) if "Shutting down" in line)]
    other = (
        "(APIServer pid=1) INFO 11-29 15:20:00 [api_server.py:100] Supported tasks: ['generate']"
    )
    a = analyze.analyze_lines([*up, other])
    assert len(a.runs) == 1 and a.verdict.category is Category.HEALTHY


def test_a_new_pid_after_a_shutdown_is_a_new_start() -> None:
    log = (LOGS / "healthy-0.25.1.log").read_text().splitlines()
    other = "(APIServer pid=1) ERROR 11-29 15:20:00 [core.py:100] EngineCore failed to start."
    a = analyze.analyze_lines([*log, other])
    assert [r.verdict.category for r in a.runs] == [Category.HEALTHY, Category.UNKNOWN]
    assert a.verdict.category is Category.UNKNOWN  # the last start failed: never the healthy one


def test_args_printed_twice_before_start_up_is_one_start() -> None:
    # A launcher that echoes the args, then vLLM's own line: no phase between them, no restart.
    lines = OOM.decode().splitlines()
    args = next(i for i, line in enumerate(lines) if "non-default args" in line)
    a = analyze.analyze_lines([*lines[: args + 1], *lines[args:]])
    assert len(a.runs) == 1 and a.runs[0].starts == 1
    assert a.verdict.category is Category.OOM_WEIGHTS


def test_markdown_and_html_list_the_earlier_failed_start(tmp_path: Path) -> None:
    path = tmp_path / "two.log"
    path.write_bytes(OOM + HEALTHY)
    markdown = _cli(path, "--format", "markdown").stdout
    assert "**2 server starts in this log:**" in markdown
    assert re.search(r"^- earlier: lines 1-\d+: oom_weights", markdown, re.M), markdown
    html = _cli(path, "--format", "html").stdout
    assert re.search(r"<small>earlier: lines 1-\d+: oom_weights", html), html[-2000:]
