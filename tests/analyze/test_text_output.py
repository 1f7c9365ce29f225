"""analyze's text output at 80 columns: wrapped with a hanging indent, cuts marked, evidence
that tells, once each; the triage table keeps names' starts; `analyze -` on a terminal says so."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from click.testing import CliRunner

from vllm_offload_doctor.analyze.engine import analyze_file
from vllm_offload_doctor.analyze.model import Evidence
from vllm_offload_doctor.analyze.render import FILE_WIDTH, Renderer
from vllm_offload_doctor.cli import cli
from vllm_offload_doctor.output.formats import ELLIPSIS

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "fixtures" / "logs"


def analyze(*args: str, stdin: object = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["analyze", *args], input=stdin, standalone_mode=False)
    assert result.exception is None, result.output
    return result.return_value, result.stdout, result.stderr


def test_every_line_fits_80_columns_unless_one_word_is_longer() -> None:
    for log in sorted(LOGS.glob("*.log")):
        out = analyze(str(log))[1]
        for line in out.splitlines():
            if len(line) > 80:
                # Only a word with no break in it (a path, a URL) may run past.
                assert max(len(w) for w in line.split()) > 80 - len(line.split()[0]) - 13, line
        # Continuation lines hang under the text of their label, never at column 0.
        assert all(line[:1] == " " for line in out.splitlines()[1:] if line), log


def test_runner_evidence_is_the_v2_banner_and_comes_first() -> None:
    out = analyze(str(LOGS / "offload-ignored-v2-0.25.1.log"))[1]
    evidence = out.split("  evidence:\n")[1].split("  remedy:")[0]
    assert "Using V2 Model Runner" in evidence.splitlines()[0]
    assert "Loading model from scratch" not in evidence


def test_the_same_oom_line_is_shown_once_and_no_contradicting_also() -> None:
    out = analyze(str(LOGS / "oom-weights-0.25.1.log"))[1]
    assert out.count("torch.OutOfMemoryError: CUDA out of memory.") == 1
    assert "no known root cause matched" not in out


def test_duplicate_evidence_from_two_processes_is_one_line() -> None:
    analysis = analyze_file(LOGS / "oom-weights-0.25.1.log")
    msg = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB."
    ev = (
        Evidence(3, f"(EngineCore pid=1) ERROR 11-29 15:50:42 [core.py:1] {msg}"),
        Evidence(9, msg),
    )
    top = replace(analysis.findings[0], evidence=ev)
    text = Renderer().text(replace(analysis, findings=(top,)))
    assert text.count("Tried to allocate 1 GiB.") == 1


def test_triage_table_cuts_names_in_the_middle_and_keeps_columns_apart(tmp_path: Path) -> None:
    deep = tmp_path / ("a-very-long-directory-name-" * 3) / "sub"
    deep.mkdir(parents=True)
    (deep / "healthy-run.log").write_bytes((LOGS / "healthy-0.25.1.log").read_bytes())
    (deep / "ignored-run.log").write_bytes((LOGS / "offload-ignored-v2-0.25.1.log").read_bytes())
    out = analyze(str(deep))[1]
    rows = [line for line in out.splitlines() if ELLIPSIS in line.split("  ")[0]]
    assert len(rows) == 2
    for row in rows:
        name = row.split("  ")[0]
        assert len(name) <= FILE_WIDTH
        assert str(deep).startswith(name.split(ELLIPSIS)[0])  # the start is kept
        assert name.endswith(".log")
    # Every column is separated by at least two spaces, however wide its longest cell.
    header = next(line for line in out.splitlines() if line.startswith("file"))
    assert "  category" in header and "  offload" in header and "  summary" in header
    for row in rows:
        assert " ignored  " in row or " not_requested  " in row or "effective  " in row


def test_stdin_on_a_terminal_prints_a_hint_and_a_pipe_does_not() -> None:
    master, slave = pty.openpty()
    cmd = [sys.executable, "-m", "vllm_offload_doctor", "analyze", "-"]
    proc = subprocess.Popen(cmd, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(slave)
    # A terminal's end-of-file is not sticky: a reader that reads again needs another ^D.
    os.write(master, b"INFO hello\n" + b"\x04" * 4)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    os.close(master)
    assert b"Ctrl+D" in err
    piped = subprocess.run(cmd, input=b"INFO hello\n", capture_output=True, timeout=120)
    assert b"Ctrl+D" not in piped.stderr
