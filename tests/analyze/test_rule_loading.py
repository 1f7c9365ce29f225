"""Rule files: every kind of mistake is a one-line RuleFileError naming the file and the key;
the `rules` command and `analyze --rules` with user rule directories."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_offload_doctor.analyze import patterns
from vllm_offload_doctor.analyze import rules as rules_module
from vllm_offload_doctor.analyze.engine import Engine
from vllm_offload_doctor.analyze.rules import load_rule, load_rules
from vllm_offload_doctor.cli import main
from vllm_offload_doctor.errors import RuleFileError

ROOT = Path(__file__).resolve().parents[2]
HEALTHY_LOG = ROOT / "fixtures" / "logs" / "healthy-0.25.1.log"

USER_RULE = """\
id = "USR001"
name = "sidecar-refused"
title = "The auth sidecar refused the engine"
severity = "error"
category = "crash_other"
precedence = 99
keywords = ["sidecar"]
patterns = ['auth sidecar refused connection from (?P<host>\\S+)']
message = "The company auth sidecar refused {host}."
remedy = "Restart the sidecar."
links = ["https://example.com/runbook"]
"""

USER_LOG = """\
(APIServer pid=17) INFO 11-29 15:14:24 [api_utils.py:273] non-default args: {'model': 'Qwen3'}
(APIServer pid=17) ERROR 11-29 15:14:25 [proxy.py:41] auth sidecar refused connection from 10.0.0.9
"""


def _toml_value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value) + "'"  # TOML literal string: no escapes, so regexes stay as written


def _rule_text(**changes: Any) -> str:
    """A valid rule file, with keys replaced (value) or removed (None); `when` is a table."""
    data: dict[str, Any] = {
        "id": "TST001",
        "title": "A test rule",
        "severity": "error",
        "category": "crash_other",
        "precedence": 5,
        "keywords": ["boom"],
        "patterns": [r"boom happened \d+"],
        "message": "Boom.",
        "remedy": "Stop the boom.",
        "links": ["https://example.com/boom"],
    }
    when = changes.pop("when", None)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items()]
    if when is not None:
        lines.append("[when]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in when.items()]
    return "\n".join(lines) + "\n"


def _write(directory: Path, text: str, name: str = "TST001-test.toml") -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def test_valid_rule_loads(tmp_path: Path) -> None:
    rule = load_rule(_write(tmp_path, _rule_text()))
    assert rule.id == "TST001"
    assert rule.name == "tst001"
    assert rule.search("boom happened 42")


BAD_RULES = [
    pytest.param({"colour": "red"}, "colour", id="unknown-key"),
    pytest.param({"title": None}, "title", id="missing-title"),
    pytest.param({"patterns": ["boom (unclosed"]}, "patterns[0]", id="bad-regex"),
    pytest.param({"severity": "fatal"}, "severity", id="bad-severity"),
    pytest.param({"category": "oom_everything"}, "category", id="bad-category"),
    pytest.param({"when": {"all": ["gpu_colour == red"]}}, "when.all", id="unknown-fact"),
    pytest.param({"when": {"any": ["vllm_version ~ >=x"]}}, "when.any", id="bad-version-range"),
    pytest.param({"links": ["http://example.com/boom"]}, "links", id="non-https-link"),
    pytest.param({"keywords": None}, "keywords", id="patterns-without-keywords"),
    pytest.param({"id": "tst-1"}, "id", id="bad-id"),
    pytest.param({"precedence": "high"}, "precedence", id="bad-precedence"),
    pytest.param({"when": {"sometimes": ["wsl"]}}, "when.sometimes", id="unknown-when-key"),
    pytest.param({"patterns": None, "keywords": None}, "patterns", id="no-patterns-no-conditions"),
]


@pytest.mark.parametrize(("changes", "key"), BAD_RULES)
def test_bad_rule_names_file_and_key(tmp_path: Path, changes: dict[str, Any], key: str) -> None:
    path = _write(tmp_path, _rule_text(**changes))
    with pytest.raises(RuleFileError) as exc:
        load_rule(path)
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {key}: "), message
    # The same through load_rules, as `--rules DIR` does it.
    with pytest.raises(RuleFileError) as exc2:
        load_rules([tmp_path])
    assert str(exc2.value) == message


def test_not_toml(tmp_path: Path) -> None:
    path = _write(tmp_path, 'id = "TST001\n')
    with pytest.raises(RuleFileError) as exc:
        load_rule(path)
    assert str(path) in str(exc.value)
    assert "TOML" in str(exc.value)


def test_duplicate_of_builtin_id(tmp_path: Path) -> None:
    path = _write(tmp_path, _rule_text(id="OFF001"), name="my-off001.toml")
    with pytest.raises(RuleFileError) as exc:
        load_rules([tmp_path])
    message = str(exc.value)
    assert message.startswith(f"{path}: id: OFF001 is already defined in "), message
    assert "OFF001-offload-ignored-mrv2.toml" in message


def test_rules_dir_that_is_not_a_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(RuleFileError) as exc:
        load_rules([missing])
    assert str(missing) in str(exc.value)


def test_user_rule_fires(tmp_path: Path) -> None:
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    _write(rules_dir, USER_RULE, name="USR001-sidecar.toml")
    log = tmp_path / "server.log"
    log.write_text(USER_LOG, encoding="utf-8")
    engine = Engine(extra_rule_dirs=[rules_dir])
    analysis = engine.analyze_file(log)
    assert analysis.findings[0].rule_id == "USR001"
    assert analysis.verdict.rule_id == "USR001"
    assert analysis.verdict.summary == "The company auth sidecar refused 10.0.0.9."
    # ... and stays quiet on a log without the line.
    assert "USR001" not in [f.rule_id for f in engine.analyze_file(HEALTHY_LOG).findings]


# -- the CLI ----------------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    code = exc.value.code
    assert isinstance(code, int)
    return code, out, err


def test_cli_analyze_bad_rules_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "BADDIR"
    bad.mkdir()
    path = _write(bad, _rule_text(severity="fatal"))
    code, out, err = _cli(capsys, "analyze", "--rules", str(bad), str(HEALTHY_LOG))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("offload-doctor: error: ")
    assert str(path) in err and "severity" in err
    assert "Traceback" not in err


def test_cli_analyze_bad_rules_dir_subprocess(tmp_path: Path) -> None:
    """The real entry point: one line on stderr, no traceback, exit 2."""
    bad = tmp_path / "BADDIR"
    bad.mkdir()
    _write(bad, _rule_text(patterns=["(unclosed"]))
    log = tmp_path / "x.log"
    log.write_text(USER_LOG, encoding="utf-8")
    exe = shutil.which("offload-doctor")
    cmd = [exe] if exe else [sys.executable, "-m", "vllm_offload_doctor"]
    proc = subprocess.run(
        [*cmd, "analyze", "--rules", str(bad), str(log)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "patterns[0]" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_analyze_missing_rules_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "analyze", "--rules", str(tmp_path / "nope"), str(HEALTHY_LOG))
    assert code == 2
    assert err.count("\n") == 1 and "nope" in err


def test_cli_analyze_with_user_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    _write(rules_dir, USER_RULE, name="USR001-sidecar.toml")
    log = tmp_path / "server.log"
    log.write_text(USER_LOG, encoding="utf-8")
    code, out, _ = _cli(capsys, "analyze", "--rules", str(rules_dir), "--format", "json", str(log))
    assert code == 1
    result = json.loads(out)["results"][0]
    assert result["verdict"]["rule_id"] == "USR001"


def test_cli_rules_lists_ids(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "rules")
    assert code == 0
    listed = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert listed == {r.id for r in load_rules()}


def test_cli_rules_lists_user_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, USER_RULE, name="USR001-sidecar.toml")
    code, out, _ = _cli(capsys, "rules", "--rules", str(tmp_path))
    assert code == 0
    assert "USR001" in out.split()


def test_cli_rules_explains_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "rules", "OFF001", "-v")
    assert code == 0
    assert out.startswith("OFF001 (offload-ignored-model-runner-v2): ")
    assert "offload_ignored" in out
    assert "https://github.com/vllm-project/vllm/issues/51396" in out
    assert "when all:" in out


def test_cli_rules_explains_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "rules", "port-in-use")
    assert code == 0
    assert out.startswith("PORT001 ")


def test_cli_rules_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "rules", "--format", "json")
    assert code == 0
    assert {r["id"] for r in json.loads(out)} == {r.id for r in load_rules()}


def test_cli_rules_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "rules", "NOPE")
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and "NOPE" in err


# -- hostile rule directories: only regular files of bounded size are read -----------------
def _analyze_with_rules(rules: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    log = tmp_path / "x.log"
    log.write_text(USER_LOG, encoding="utf-8")
    # timeout: a hang guard (a FIFO read would block forever), not a timing.
    return subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", "analyze", "--rules", str(rules), str(log)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _one_line_rule_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("offload-doctor: error: "), proc.stderr
    for word in words:
        assert word in lines[0]


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_rule_file_linked_to_dev_zero_is_refused(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "ZERO001.toml").symlink_to("/dev/zero")
    _one_line_rule_error(_analyze_with_rules(rules, tmp_path), "ZERO001.toml", "a device")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_rule_file_that_is_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    os.mkfifo(rules / "PIPE001.toml")
    _one_line_rule_error(_analyze_with_rules(rules, tmp_path), "PIPE001.toml", "a FIFO")


def test_rule_file_over_the_size_cap_is_refused(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    big = _rule_text() + "# " + "x" * (rules_module.MAX_RULE_FILE_BYTES) + "\n"
    _write(rules, big)
    _one_line_rule_error(_analyze_with_rules(rules, tmp_path), "TST001-test.toml", "larger than")


def test_rule_directory_named_like_a_rule_is_refused(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    (rules / "DIR001.toml").mkdir(parents=True)
    with pytest.raises(RuleFileError, match="a directory"):
        load_rules([rules])


def test_rule_file_that_is_not_utf8(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "TST001-test.toml").write_bytes(_rule_text().encode("utf-16"))
    with pytest.raises(RuleFileError, match="not UTF-8"):
        load_rules([rules])


def test_symlink_to_a_regular_rule_file_loads(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    target = _write(real, USER_RULE, "USR001.toml")
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "USR001.toml").symlink_to(target)
    assert "USR001" in {r.id for r in load_rules([rules])}


# A back-reference RE2 cannot take: `regex` runs it under the match timeout, and on a long line
# (cubic here) it gives up. The analysis must say so instead of silently not matching.
SLOW_RULE = _rule_text(
    id="SLOW001", keywords=["slowrule"], patterns=[r"slowrule (.*)(.*)\1\2Z"], precedence=99
)


def _slow_log(tmp_path: Path, words: int) -> Path:
    log = tmp_path / "slow.log"
    log.write_text(
        HEALTHY_LOG.read_text()
        + "(APIServer pid=17) ERROR 11-29 15:14:25 [x.py:1] slowrule "
        + "word " * words
        + "end\n"
    )
    return log


@pytest.mark.parametrize("fmt", ["text", "json", "jsonl", "markdown"])
def test_a_rule_that_times_out_is_named_in_every_format(tmp_path: Path, fmt: str) -> None:
    from click.testing import CliRunner

    from vllm_offload_doctor.cli import cli

    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    _write(rules_dir, SLOW_RULE, "SLOW001-slow.toml")
    log = _slow_log(tmp_path, 20_000)
    result = CliRunner().invoke(
        cli, ["analyze", "--rules", str(rules_dir), "--format", fmt, str(log)]
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    n = HEALTHY_LOG.read_text().count("\n") + 1
    note = f"rule SLOW001 gave up on line {n} ("
    assert note in result.output and "its verdict may be missing" in result.output
    if fmt in ("json", "jsonl"):
        record = json.loads(result.output.splitlines()[0] if fmt == "jsonl" else result.output)
        analysis = record.get("results", [record])[0]
        assert analysis["notes"][0].startswith(note)


def test_a_pattern_that_keeps_timing_out_is_dropped_for_the_rest_of_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 20: a backtracking user pattern cost 50 ms on every distinct line (200 lines: 10 s).
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    _write(rules_dir, SLOW_RULE, "SLOW001-slow.toml")
    log = tmp_path / "slow.log"
    log.write_text(
        HEALTHY_LOG.read_text()
        + "".join(
            f"(APIServer pid=17) ERROR 11-29 15:14:25 [x.py:1] slowrule {i} {'word ' * 600}end\n"
            for i in range(40)
        )
    )
    tries: list[str] = []
    run_once = patterns.Bounded._run_once  # what both rule paths (fast and reference) run

    def counted(self: patterns.Bounded, search: bool, text: str, timeout: float | None) -> Any:
        if "slowrule" in self.pattern:
            tries.append(text)
        return run_once(self, search, text, timeout)

    monkeypatch.setattr(patterns.Bounded, "_run_once", counted)
    analysis = Engine(extra_rule_dirs=[rules_dir]).analyze_file(log)
    assert len(tries) == rules_module.MAX_GIVE_UPS  # fefc042: one 50 ms give-up per line, 40
    n = HEALTHY_LOG.read_text().count("\n") + 1
    assert analysis.notes == (
        f"rule SLOW001 gave up on line {n} (3,014 characters) after 50 ms; its verdict may be "
        f"missing; after {rules_module.MAX_GIVE_UPS} give-ups it was not tried on the rest of "
        "the log",
    )


def test_timeouts_are_counted_per_analysis(tmp_path: Path) -> None:
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    _write(rules_dir, SLOW_RULE, "SLOW001-slow.toml")
    engine = Engine(extra_rule_dirs=[rules_dir])
    log = _slow_log(tmp_path, 600)  # short enough to be remembered between analyses
    first, second = engine.analyze_file(log), engine.analyze_file(log)
    assert len(first.notes) == 1 and first.notes == second.notes
    assert "SLOW001" in first.notes[0]
    assert engine.analyze_file(HEALTHY_LOG).notes == ()
