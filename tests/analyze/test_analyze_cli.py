"""`offload-doctor analyze` end to end: formats, batches, exit codes, colour and redaction."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from shared_corpus import CORPUS, NOT_FOUND

from vllm_offload_doctor import cli, redact

needs_corpus = pytest.mark.skipif(not (CORPUS / "H-001.log").is_file(), reason=NOT_FOUND)

HEALTHY = "H-001.log"  # healthy, no offload requested
EFFECTIVE = "H-003.log"  # healthy, 0.51 GiB offloaded
PORT = "B-005.log"  # port_in_use
OOM = "A-012.log"  # oom_weights
ANSI = re.compile(r"\x1b\[")

HF_TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"  # hf_ + 34 characters
SK_KEY = "sk-abcdefghijklmnopqrstuvwx"
API_KEY_VALUE = "xsecretvalue1234567890"
HOST = "gpu-node-17"

SECRET_LOG = f"""\
$ vllm serve meta-llama/Llama-3.1-8B --api-key {SK_KEY} --port 8000
(APIServer pid=1) INFO 11-29 15:14:24 [api_utils.py:273] non-default args: {{'model_tag': \
'meta-llama/Llama-3.1-8B', 'api_key': '{API_KEY_VALUE}', 'model': 'meta-llama/Llama-3.1-8B'}}
(APIServer pid=1) ERROR 11-29 15:14:25 [api_server.py:1] Error on {HOST} reading \
/home/alice/.cache/huggingface with token {HF_TOKEN}
Traceback (most recent call last):
  File "/home/alice/venv/lib/python3.11/site-packages/huggingface_hub/utils/_errors.py", \
line 304, in hf_raise_for_status
    response.raise_for_status()
requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: \
https://huggingface.co/meta-llama/Llama-3.1-8B/resolve/main/config.json on {HOST} \
/home/alice token {HF_TOKEN} --api-key {SK_KEY} 'api_key': '{API_KEY_VALUE}'
"""


def run(
    *args: str,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("OFFLOAD_DOCTOR_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", "analyze", *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        cli.main(["analyze", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    code = exc.value.code
    assert isinstance(code, int)
    return code, out, err


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    if not (CORPUS / HEALTHY).is_file():
        pytest.skip(NOT_FOUND)
    for name in (HEALTHY, EFFECTIVE, PORT, OOM):
        shutil.copy(CORPUS / name, tmp_path / name)
    return tmp_path


# -- formats ----------------------------------------------------------------------------------
def test_text_format_names_verdict_and_offload(logs: Path) -> None:
    proc = run(EFFECTIVE, cwd=logs)
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0] == EFFECTIVE
    assert "verdict:  healthy" in proc.stdout
    assert "offload:  effective" in proc.stdout
    assert "0.51 GiB" in proc.stdout


def test_json_has_schema_version_results_and_counts(logs: Path) -> None:
    proc = run("--format", "json", PORT, cwd=logs)
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert data["schema_version"] == 1
    assert data["errors"] == []
    assert data["counts"] == {"port_in_use": 1}
    (result,) = data["results"]
    assert result["file"] == PORT
    assert result["verdict"]["category"] == "port_in_use"
    assert result["findings"][0]["evidence"]


def test_jsonl_one_object_per_input_with_file_as_given(logs: Path) -> None:
    given = [HEALTHY, f"./{PORT}", str(logs / OOM)]
    proc = run("--format", "jsonl", *given, cwd=logs)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert len(lines) == 3
    objs = [json.loads(line) for line in lines]
    assert [o["file"] for o in objs] == given
    assert [o["verdict"]["category"] for o in objs] == ["healthy", "port_in_use", "oom_weights"]
    assert all(o["schema_version"] == 1 for o in objs)


def test_markdown_has_verdict_evidence_remedy_links(logs: Path) -> None:
    proc = run("--format", "markdown", PORT, cwd=logs)
    assert proc.returncode == 1
    md = proc.stdout
    assert f"### `{PORT}`: **port_in_use**" in md
    block = re.search(r"```text\n(.*?)\n```", md, re.S)
    assert block is not None and "address already in use" in block.group(1)
    assert "**What to do:**" in md
    assert re.search(r"Links: <https://", md)
    assert "| category | logs |" not in md  # one input: no triage table


def test_text_triage_table_counts_categories(logs: Path) -> None:
    proc = run(HEALTHY, EFFECTIVE, PORT, OOM, cwd=logs)
    assert proc.returncode == 1
    out = proc.stdout
    header = next(line for line in out.splitlines() if line.startswith("file "))
    assert "category" in header and "offload" in header
    counts = next(line for line in out.splitlines() if line.startswith("counts: "))
    parts = dict(p.rsplit(" ", 1) for p in counts.removeprefix("counts: ").split(", "))
    assert parts == {"healthy": "2", "port_in_use": "1", "oom_weights": "1"}


def test_markdown_triage_table_counts_categories(logs: Path) -> None:
    proc = run("--format", "markdown", HEALTHY, EFFECTIVE, PORT, cwd=logs)
    out = proc.stdout
    assert out.count("### `") == 3
    assert "| file | category | offload | summary |" in out
    assert f"| `{PORT}` | port_in_use |" in out
    assert "| category | logs |" in out
    assert "| healthy | 2 |" in out
    assert "| port_in_use | 1 |" in out


def test_directory_input_analyses_every_log(logs: Path) -> None:
    (logs / "notes.md").write_text("not a log")
    proc = run("--format", "jsonl", str(logs))
    files = sorted(Path(json.loads(line)["file"]).name for line in proc.stdout.splitlines())
    assert files == sorted([HEALTHY, EFFECTIVE, PORT, OOM])


# -- exit codes ------------------------------------------------------------------------------
def test_exit_0_for_healthy_log(logs: Path) -> None:
    assert run(HEALTHY, cwd=logs).returncode == 0


def test_exit_1_for_failure_log(logs: Path) -> None:
    assert run(OOM, cwd=logs).returncode == 1


@pytest.mark.parametrize("fmt", ["text", "json", "jsonl", "markdown"])
def test_exit_2_for_missing_file_but_rest_of_batch_printed(logs: Path, fmt: str) -> None:
    proc = run("--format", fmt, HEALTHY, "missing.log", PORT, cwd=logs)
    assert proc.returncode == 2
    assert "missing.log" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    if fmt == "json":
        data = json.loads(proc.stdout)
        assert [r["file"] for r in data["results"]] == [HEALTHY, PORT]
        assert len(data["errors"]) == 1 and "missing.log" in data["errors"][0]
    elif fmt == "jsonl":
        assert [json.loads(x)["file"] for x in proc.stdout.splitlines()] == [HEALTHY, PORT]
    else:
        assert HEALTHY in proc.stdout and PORT in proc.stdout
        assert "port_in_use" in proc.stdout
        assert "1 input(s) could not be read" in proc.stdout


def test_exit_2_for_unknown_format(logs: Path) -> None:
    proc = run("--format", "yaml", HEALTHY, cwd=logs)
    assert proc.returncode == 2


def test_in_process_main_exit_codes(logs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(capsys, str(logs / HEALTHY))[0] == 0
    assert main(capsys, str(logs / OOM))[0] == 1
    code, _, err = main(capsys, str(logs / "nope.log"))
    assert code == 2 and err.startswith("offload-doctor: error:")


# -- colour ----------------------------------------------------------------------------------
def test_no_ansi_when_not_a_tty(logs: Path) -> None:
    proc = run(HEALTHY, PORT, cwd=logs)
    assert not ANSI.search(proc.stdout + proc.stderr)


def test_color_flag_wins_over_no_color_env(logs: Path) -> None:
    assert ANSI.search(run("--color", PORT, cwd=logs, env={"NO_COLOR": "1"}).stdout)
    assert not ANSI.search(run("--no-color", PORT, cwd=logs, env={"FORCE_COLOR": "1"}).stdout)


def test_force_color_colours_a_pipe_and_no_color_beats_it(logs: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    forced = subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", "analyze", PORT],
        capture_output=True, text=True, cwd=logs, env={**clean, "FORCE_COLOR": "1"}, timeout=120,
    )  # fmt: skip
    assert ANSI.search(forced.stdout)
    assert not ANSI.search(run(PORT, cwd=logs, env={"FORCE_COLOR": "1", "NO_COLOR": "1"}).stdout)


def test_color_flag_colours_text(logs: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", "analyze", "--color", PORT],
        capture_output=True,
        text=True,
        cwd=logs,
        env=env,
        timeout=120,
    )
    assert ANSI.search(proc.stdout)


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pty")
def test_no_color_env_on_a_tty(logs: Path) -> None:
    import pty

    parent, child = pty.openpty()
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm_offload_doctor", "analyze", PORT],
        stdout=child,
        stderr=subprocess.DEVNULL,
        cwd=logs,
        env=env,
    )
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(parent, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(parent)
    out = b"".join(chunks).decode()
    assert "port_in_use" in out
    assert "\x1b[" not in out


# -- redaction --------------------------------------------------------------------------------
@pytest.fixture
def secret_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(redact, "_host_names", lambda: [HOST])
    path = tmp_path / "secret.log"
    path.write_text(SECRET_LOG)
    return path


SECRETS = (HF_TOKEN, SK_KEY, API_KEY_VALUE)


@pytest.mark.parametrize("fmt", ["text", "markdown"])
@pytest.mark.parametrize("flag", [(), ("--redact",)])
def test_secrets_never_in_text_output(
    secret_log: Path, capsys: pytest.CaptureFixture[str], fmt: str, flag: tuple[str, ...]
) -> None:
    code, out, err = main(capsys, "--format", fmt, *flag, str(secret_log))
    assert code == 1
    assert "model_download" in out
    for secret in SECRETS:
        assert secret not in out + err


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
@pytest.mark.parametrize("flag", [(), ("--redact",)])
def test_secrets_never_in_json_output(
    secret_log: Path, capsys: pytest.CaptureFixture[str], fmt: str, flag: tuple[str, ...]
) -> None:
    code, out, err = main(capsys, "--format", fmt, *flag, str(secret_log))
    assert code == 1
    for secret in SECRETS:
        assert secret not in out + err


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_redact_hides_host_and_home_user(
    secret_log: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    _, plain, _ = main(capsys, "--format", fmt, str(secret_log))
    assert "/home/alice" in plain and HOST in plain  # only hidden when asked
    _, out, _ = main(capsys, "--format", fmt, "--redact", str(secret_log))
    assert HOST not in out
    assert "/home/alice" not in out
    assert "/home/<user-1>" in out


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_redact_hides_host_and_home_user_in_json(
    secret_log: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    _, out, _ = main(capsys, "--format", fmt, "--redact", str(secret_log))
    assert HOST not in out
    assert "/home/alice" not in out


@needs_corpus
def test_every_corpus_log_renders_in_every_format(tmp_path: Path) -> None:
    logs = sorted(str(p) for p in CORPUS.glob("*.log"))
    for fmt in ("text", "json", "jsonl", "markdown"):
        proc = run("--format", fmt, *logs)
        assert proc.returncode in (0, 1), proc.stderr
        assert proc.stderr == ""
        if fmt == "jsonl":
            assert len(proc.stdout.splitlines()) == len(logs)
        if fmt == "json":
            assert len(json.loads(proc.stdout)["results"]) == len(logs)
