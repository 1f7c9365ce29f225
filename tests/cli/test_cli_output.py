"""The output conventions every command keeps: -q, -v, -o FILE, and errors in the format asked for."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import click
import pytest

from vllm_offload_doctor import common_cli, exitcodes, links
from vllm_offload_doctor.cli import asked, cli, main
from vllm_offload_doctor.errors import OutputError

ROOT = Path(__file__).resolve().parents[2]
LOG = str(ROOT / "fixtures" / "logs" / "offload-ignored-v2-0.25.1.log")
DIAGNOSING = ["check", "compare", "analyze", "rules", "inspect"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    assert isinstance(exc.value.code, int)
    return exc.value.code, out, err


def _options(name: str) -> set[str]:
    assert isinstance(cli, click.Group)
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    return {o for p in command.params for o in p.opts}


@pytest.mark.parametrize("name", DIAGNOSING)
def test_every_command_takes_quiet_verbose_and_output(name: str) -> None:
    assert {"-q", "--quiet", "-v", "--verbose", "-o", "--output", "--format"} <= _options(name)


def test_completion_writes_its_script_to_output(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "offload-doctor.fish"
    code, out, _ = run(capsys, "completion", "fish", "-o", str(target))
    assert code == 0 and out == ""
    assert "_OFFLOAD_DOCTOR_COMPLETE" in target.read_text()


# --- -o FILE and -q -----------------------------------------------------------------------


def test_output_gets_the_format_and_stdout_the_text_view(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "report.json"
    code, out, _ = run(capsys, "analyze", LOG, "--format", "json", "-o", str(target))
    assert code == exitcodes.FOUND
    doc = json.loads(target.read_text())
    assert doc["results"][0]["verdict"]["category"] == "offload_ignored"
    assert "verdict:  offload_ignored" in out and not out.lstrip().startswith("{")
    assert "\x1b[" not in target.read_text()


def test_quiet_leaves_stdout_empty_and_the_file_the_same(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    loud, quiet = tmp_path / "loud.json", tmp_path / "quiet.json"
    run(capsys, "analyze", LOG, "--format", "json", "-o", str(loud))
    code, out, err = run(capsys, "analyze", LOG, "--format", "json", "-o", str(quiet), "-q")
    assert (code, out, err) == (exitcodes.FOUND, "", "")
    assert json.loads(quiet.read_text()) == json.loads(loud.read_text())
    # Without -o, -q still answers through the exit status alone.
    assert run(capsys, "analyze", LOG, "-q") == (exitcodes.FOUND, "", "")


def test_without_output_stdout_is_the_chosen_format(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "analyze", LOG, "--format", "json")
    assert code == exitcodes.FOUND and json.loads(out)["results"]


@pytest.mark.parametrize(
    "args",
    [
        ["rules", "OFF001", "--format", "json"],
        ["rules", "--format", "markdown"],
        ["compare", "--dry-run", "--format", "json", "--vllm-cmd", sys.executable],
        ["analyze", LOG, LOG, "--format", "markdown"],
    ],
    ids=["rules-json", "rules-table", "compare-dry-run", "analyze-batch"],
)
def test_output_file_holds_what_stdout_would(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str]
) -> None:
    target = tmp_path / "out"
    code, printed, _ = run(capsys, *args)
    code_o, _, _ = run(capsys, *args, "-o", str(target), "-q")
    assert code_o == code
    assert target.read_text() == printed


def test_verbose_names_each_log_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, err = run(capsys, "analyze", str(ROOT / "fixtures" / "logs"), "-v")
    assert f"reading {LOG}" in err
    assert "reading" not in out


# --- where -o may write -------------------------------------------------------------------


def test_a_planted_symlink_is_refused_and_its_target_untouched(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    link = tmp_path / "report.md"
    link.symlink_to(victim)
    code, out, err = run(capsys, "rules", "-o", str(link))
    assert code == exitcodes.USAGE and out == ""
    assert err == f"offload-doctor: error: refusing to write {link}: it is a symbolic link\n"
    assert victim.read_text() == "keep me" and link.is_symlink()


@pytest.mark.parametrize("where", ["no-folder", "read-only"])
def test_an_unwritable_path_is_one_line_before_any_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, where: str
) -> None:
    folder = tmp_path / "ro"
    if where == "read-only":
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder")
        folder.mkdir()
        folder.chmod(0o500)
    code, out, err = run(capsys, "analyze", LOG, "-o", str(folder / "r.json"))
    assert code == exitcodes.USAGE and out == ""
    assert err.startswith("offload-doctor: error: cannot write ") and err.count("\n") == 1
    assert "Traceback" not in err


def test_the_file_is_replaced_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "report.json"
    target.write_text("old")
    target.chmod(0o640)
    common_cli.write_atomically(target, "new")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640

    def broken(_src: str, _dst: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OutputError, match="No space left on device"):
        common_cli.write_atomically(target, "newer")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no temporary left


def test_a_new_file_gets_the_umask_mode(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        common_cli.write_atomically(tmp_path / "r.md", "x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "r.md").stat().st_mode) == 0o644


# --- errors in JSON mode ------------------------------------------------------------------


def _error(out: str, fmt: str = "json") -> dict[str, object]:
    doc = json.loads(out)
    if fmt == "jsonl":
        assert out.count("\n") == 1
    assert doc["schema_version"] == 1 and set(doc) == {"schema_version", "error", "exit_code"}
    assert isinstance(doc["error"], dict) and set(doc["error"]) == {"kind", "message"}
    return doc


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (["check", "--port", "0"], "usage"),
        (["check", "--python", "/nonexistent/python"], "usage"),
        (["compare", "--model", "/nonexistent/model"], "error"),
        (["compare", "--repeats", "many"], "usage"),
        (["compare", "--no-such-option"], "usage"),
        (["analyze", "--bogus"], "usage"),
        (["rules", "NOSUCH"], "input"),
        (["inspect", "--port", "8000", "--pid", "1"], "usage"),
    ],
)
@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_an_error_in_json_mode_is_a_json_object_with_the_exit_code(
    capsys: pytest.CaptureFixture[str], args: list[str], kind: str, fmt: str
) -> None:
    # Only analyze offers jsonl: elsewhere asking for it is a usage error, answered in JSON too.
    code, out, err = run(capsys, *args, f"--format={fmt}")
    doc = _error(out, fmt)
    assert doc["exit_code"] == code == exitcodes.USAGE
    assert isinstance(doc["error"], dict)
    if fmt == "json" or args[0] == "analyze":
        assert doc["error"]["kind"] == kind
    assert err.strip()  # and a line for the person watching


def test_a_bug_in_json_mode_says_so_with_the_report_link(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_offload_doctor.analyze import rules

    def crash(*_args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(rules, "load_rules", crash)
    code, out, err = run(capsys, "rules", "--format", "json")
    doc = _error(out)
    assert code == doc["exit_code"] == exitcodes.INTERNAL
    assert isinstance(doc["error"], dict) and doc["error"]["kind"] == "internal"
    assert links.DOCTOR_ISSUES in str(doc["error"]["message"]) and links.DOCTOR_ISSUES in err
    assert err.count("\n") == 1


def test_an_interrupt_in_json_mode_is_json_with_130(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_offload_doctor.analyze import rules

    def interrupted(*_args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(rules, "load_rules", interrupted)
    code, out, err = run(capsys, "rules", "--format", "json")
    doc = _error(out)
    assert code == doc["exit_code"] == exitcodes.INTERRUPTED
    assert err.strip() == "offload-doctor: interrupted"  # click starts a new line after ^C


def test_text_mode_errors_stay_off_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "rules", "NOSUCH")
    assert (code, out) == (exitcodes.USAGE, "")
    assert err.startswith("offload-doctor: error: no rule 'NOSUCH'")


def test_the_output_request_is_read_as_click_would() -> None:
    assert asked(["analyze", "--format", "json", "x"]).json is not None
    assert asked(["analyze", "--format=jsonl"]).json is not None
    assert asked(["analyze", "--format", "json", "--format", "text"]).json is None
    assert asked(["compare", "--", "--format", "json"]).json is None
    assert asked(["analyze", "--format"]).json is None
    assert asked(["rules", "-o", "a.json"]).output == "a.json"
    assert asked(["rules", "--output=b.json", "-oc.json"]).output == "c.json"
    assert asked(["compare", "--", "-o", "x"]).output is None
    assert asked(["analyze", "-q", "x"]).quiet and asked(["analyze", "-vq"]).quiet
    assert not asked(["analyze", "-o", "q"]).quiet and not asked(["a", "--", "-q"]).quiet


def test_an_error_in_json_mode_replaces_the_output_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A script reading FILE finds this run's error, never an earlier run's report."""
    target = tmp_path / "rules.json"
    target.write_text('{"earlier": "report"}')
    code, out, err = run(capsys, "rules", "NOSUCH", "--format", "json", "-o", str(target), "-q")
    assert code == exitcodes.USAGE and out == ""  # -q: stdout stays empty, even for an error
    assert err.startswith("offload-doctor: error: no rule 'NOSUCH'")
    doc = json.loads(target.read_text())
    assert doc["error"]["kind"] == "input" and doc["exit_code"] == code


@pytest.mark.parametrize("fmt", ["json", "markdown"])
def test_check_list_answers_in_the_format_asked(
    capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    from vllm_offload_doctor.checks import all_checks

    code, out, _ = run(capsys, "check", "--list", "--format", fmt)
    ids = [c.id for c in all_checks()]
    assert code == 0
    if fmt == "json":
        doc = json.loads(out)
        assert doc["schema_version"] == 1 and [c["id"] for c in doc["checks"]] == ids
    else:
        assert out.startswith("| id | check |") and all(f"| `{i}` |" in out for i in ids)


def test_every_json_document_carries_the_schema_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """inspect's JSON too, like check's, compare's, analyze's and the error object."""
    code, out, _ = run(capsys, "inspect", "--url", "http://127.0.0.1:9", "--format", "json")
    doc = json.loads(out)
    assert code == exitcodes.USAGE and doc["schema_version"] == 1 and len(doc["servers"]) == 1


# --- check finds vLLM's Python, not its own -------------------------------------------------


def _check_json(tmp_path: Path, path: str) -> dict[str, dict[str, object]]:
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "OFFLOAD_DOCTOR_DEBUG"} | {"PATH": path}
    done = subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", "check", "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    return {c["id"]: c for c in json.loads(done.stdout)["checks"]}


def test_check_from_its_own_environment_finds_vllm_on_path(tmp_path: Path) -> None:
    """As from pipx or uv tool: the doctor's interpreter has no vLLM, `vllm` on PATH points to one."""
    bin_dir = tmp_path / "vllm-env" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "vllm"
    script.write_text(f"#!{sys.executable}\n")
    script.chmod(0o755)
    found = _check_json(tmp_path, str(bin_dir))
    assert "(behind `vllm` on PATH)" in str(found["python"]["message"])
    assert f"shebang of {script}" in str(found["python"]["details"])


def test_check_without_vllm_on_path_never_takes_its_own_python(tmp_path: Path) -> None:
    found = _check_json(tmp_path, str(tmp_path))
    python, vllm = found["python"], found["vllm"]
    if vllm["status"] != "fail":
        pytest.skip("this interpreter has vLLM installed: it is vLLM's own")
    assert python["status"] == "skip" and "no `vllm` on PATH" in str(python["message"])
    assert "pip install" not in str(vllm["remedy"])


# --- compare: -q silences the progress, -o keeps the report, -v shows the commands -----------


def test_compare_quiet_with_output_prints_nothing_and_saves_the_report(tmp_path: Path) -> None:
    from test_compare_e2e import run_compare

    target = tmp_path / "ab.json"
    proc, report = run_compare(tmp_path, "effective", "-q", "--format", "json", "-o", str(target))
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""
    saved = json.loads(target.read_text())
    assert saved["verdict"]["status"] == report["verdict"]["status"] == "effective"


def test_compare_verbose_shows_the_commands_first(tmp_path: Path) -> None:
    from test_compare_e2e import run_compare

    proc, _ = run_compare(tmp_path, "effective", "-v")
    assert proc.returncode == 0
    assert proc.stderr.startswith("# offload-doctor compare: the exact commands")
    assert "\nVerdict: " in proc.stdout and "exact commands" not in proc.stdout
