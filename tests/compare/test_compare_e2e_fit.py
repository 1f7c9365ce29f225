"""End-to-end against tests/fake-vllm: models that need offload, --verify-fix, API keys, secrets,
the run folder, and a doctor killed with SIGKILL."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from planted_secrets import PLACES, SELF_EVIDENT, leaks, planted_line
from planted_secrets import SECRETS as PLANTED
from test_compare_e2e import (
    _argv,
    _env,
    free_port,
    kill_marked,
    marked,
    mode,
    offload_server_up,
    run_compare,
)

pytest.importorskip("vllm_offload_doctor.analyze.engine")


# ---------------------------------------------------------------------------- needs offload


def test_baseline_oom_then_offload_makes_it_fit(tmp_path: Path) -> None:
    proc, report = run_compare(tmp_path, "needs-offload", "--offload-gb", "1")
    assert proc.returncode == 0, proc.stderr
    base, off = mode(report, "0"), mode(report, "1")
    assert base["status"] == "exited" and base["analysis"]["category"] == "oom_weights"
    assert off["status"] == "ok" and off["log_facts"]["offloaded_gib"] == pytest.approx(1.02)
    v = report["verdict"]
    assert v["status"] == "effective" and v["title"] == "offload 1 GiB makes the model fit"
    assert "Without offload the model does not load" in v["summary"]
    assert "ms per output token" in v["summary"]
    assert "the model needs offload; running the offload mode" in proc.stderr
    assert not any("nvidia-smi" in n for n in v["notes"])  # one mode served: nothing compared


def test_not_enough_offload_estimates_what_is_needed(tmp_path: Path) -> None:
    proc, report = run_compare(
        tmp_path, "needs-offload", "--offload-gb", "0.5", FAKE_VLLM_MIN_OFFLOAD_GB="1"
    )
    assert proc.returncode == 1, proc.stderr
    c = report["comparisons"][0]
    assert c["status"] == "failed" and c["title"] == "not enough offload"
    # 0.51 GiB offloaded leaves 0.21 of the 0.7 GiB one request needs: 0.49 short
    assert c["needed_gib"] == pytest.approx(0.99)
    assert "Try --offload-gb 1." in c["summary"]
    assert mode(report, "0.5")["log_facts"]["oom"]["kv_needed_gib"] == 0.7


def test_offload_ignored_when_the_model_needs_it(tmp_path: Path) -> None:
    proc, report = run_compare(tmp_path, "needs-offload-ignored", "--offload-gb", "1")
    assert proc.returncode == 1, proc.stderr
    v = report["verdict"]
    assert v["status"] == "ignored", v
    assert "and its log has no offloader line" in v["summary"]
    assert "Model Runner V2" in v["summary"]
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in v["remedy"] and "0.25.1" in v["remedy"]
    assert [m["label"] for m in report["modes"]] == ["0", "1"]


def test_verify_fix_runs_the_escape_hatch_as_a_third_column(tmp_path: Path) -> None:
    # The lead's H200 command line, against the fake (min offload 27 like the section-6 model).
    proc, report = run_compare(
        tmp_path,
        "needs-offload-ignored",
        "--model",
        "big-model",
        "--served-model-name",
        "big",
        "--offload-gb",
        "32",
        "--verify-fix",
        "--max-tokens",
        "8",
        "--repeats",
        "1",
        "--",
        "--load-format",
        "dummy",
        "--enforce-eager",
        "--max-model-len",
        "2048",
        "--attention-backend",
        "TRITON_ATTN",
        FAKE_VLLM_MIN_OFFLOAD_GB="27",
    )
    assert proc.returncode == 1, proc.stderr
    assert [m["label"] for m in report["modes"]] == ["0", "32", "32-fix"]
    fix = mode(report, "32-fix")
    assert fix["role"] == "verify_fix" and fix["env"] == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert fix["status"] == "ok" and fix["log_facts"]["model_runner"] == "v1"
    c = report["comparisons"][0]
    assert c["status"] == "ignored" and c["fix_verified"] is True
    assert "Verified: with VLLM_USE_V2_MODEL_RUNNER=0" in report["verdict"]["summary"]
    assert report["config"]["max_model_len"] == 2048
    assert mode(report, "0")["command"].count("--max-model-len") == 1
    assert "offload 32 GiB + VLLM_USE_V2_MODEL_RUNNER=0" in proc.stdout  # the third column
    assert "too few" in proc.stdout  # --repeats 1


def test_verify_fix_with_the_fix_already_set_is_effective(tmp_path: Path) -> None:
    proc, report = run_compare(
        tmp_path,
        "needs-offload-ignored",
        "--offload-gb",
        "1",
        "--verify-fix",
        VLLM_USE_V2_MODEL_RUNNER="0",
    )
    assert proc.returncode == 0, proc.stderr
    assert report["verdict"]["status"] == "effective"
    assert mode(report, "0")["status"] == "exited"
    assert any("already set" in n for n in report["verdict"]["notes"])
    assert [m["label"] for m in report["modes"]] == ["0", "1"]


def test_a_baseline_failure_offload_cannot_change_stops_early(tmp_path: Path) -> None:
    proc, report = run_compare(tmp_path, "needs-offload", "--", "--no-such-flag")
    assert proc.returncode == 1
    assert [m["label"] for m in report["modes"]] == ["0"]
    assert mode(report, "0")["analysis"]["category"] == "bad_args"
    assert report["verdict"]["status"] == "failed"
    assert "offload cannot change that" in proc.stderr


def test_several_offload_values_each_on_its_own_line(tmp_path: Path) -> None:
    proc, report = run_compare(
        tmp_path, "needs-offload", "--offload-gb", "0.5", "--cpu-offload-gb", "1"
    )
    assert proc.returncode == 1, proc.stderr  # the worst value is the verdict
    v = report["verdict"]
    assert v["per_offload"] == {"0.5": "failed", "1.0": "effective"}
    lines = v["summary"].splitlines()
    assert lines[0].startswith("[offload 0.5 GiB: failed]")
    assert lines[1].startswith("[offload 1 GiB: effective]")


# ---------------------------------------------------------------------------- API keys, secrets

SECRETS = {
    "api_key": "sk-plantedapikey0123456789abcdef",
    "hf_token": "hf_PlantedHfToken0123456789abcdefXYZ",
    "url_password": "Pl4ntedUrlPassw0rd",
    "env_token": "hf_PlantedEnvToken0123456789abcdefXY",
}


def _planted_log() -> str:
    """What a server may echo: every planted kind in a place, the self-evident ones bare too,
    a PEM block over several lines and an Authorization header."""
    lines = [
        f"WARNING 11-29 15:14:25 [hub.py:1] retrying: {planted_line(kind, PLACES[i % len(PLACES)])}"
        for i, kind in enumerate(PLANTED)
    ]
    lines += [
        f"INFO 11-29 15:14:25 [hub.py:2] cached {planted_line(k, None)}" for k in SELF_EVIDENT
    ]
    lines += [
        "INFO 11-29 15:14:25 [hub.py:3] key file:",
        "-----BEGIN PRIVATE KEY-----",
        PLANTED["pem_body"],
        "-----END PRIVATE KEY-----",
        f"DEBUG 11-29 15:14:25 [hub.py:4] headers: Authorization: Bearer {PLANTED['bearer']}",
    ]
    return "\n".join(lines) + "\n"


_PEM = f"-----BEGIN PRIVATE KEY-----\n{PLANTED['pem_body']}\n-----END PRIVATE KEY-----"
PLANTED_ARGV = [
    "--api-key", PLANTED["api_key_arg"],
    f"--hf-token={PLANTED['hf_token']}",
    "--github-token", PLANTED["github_classic"],
    "--model-loader-extra-config",
    json.dumps({
        "aws_access_key_id": PLANTED["aws_access_key_id"],
        "aws_secret_access_key": PLANTED["aws_secret_key"],
        "private_key": _PEM,
        "id_token": PLANTED["jwt"],
        "mirror": f"https://mirror-user:{PLANTED['url_password']}@mirror.example/hf",
        "headers": f"Authorization: Bearer {PLANTED['bearer']}",
        "note": f"{PLANTED['jwt']} {PLANTED['github_oauth']} {PLANTED['high_entropy_bare']}",
    }),
]  # fmt: skip
PLANTED_ENV = {
    "HF_TOKEN": PLANTED["hf_token"],
    "HF_ENDPOINT": f"https://mirror-user:{PLANTED['url_password']}@mirror.example/hf",
    # Names that say nothing secret: only the shape of the value can give it away.
    "VLLM_DEBUG_TAG": PLANTED["github_classic"],
    "NCCL_DEBUG_NOTE": f"id {PLANTED['aws_access_key_id']} jwt {PLANTED['jwt']}",
    "TORCH_EXTRA_HEADERS": f"Authorization: Bearer {PLANTED['bearer']}",
    "TRANSFORMERS_NOTE": _PEM,
    "CUDA_NOTE": f"password: {PLANTED['json_password']}",
}


@pytest.mark.parametrize("fmt", ["text", "json", "markdown"])
def test_planted_secrets_never_reach_an_artifact(tmp_path: Path, fmt: str) -> None:
    extra_log = tmp_path / "server-says.txt"
    extra_log.write_text(_planted_log())
    proc, report = run_compare(
        tmp_path,
        "effective",
        "--format",
        fmt,
        "--model",
        f"https://u:{PLANTED['url_password']}@mirror.example.com/m",
        "--",
        *PLANTED_ARGV,
        FAKE_VLLM_EXTRA_LOG=str(extra_log),
        **PLANTED_ENV,
    )
    assert proc.returncode == 0, proc.stderr  # the key was sent as Authorization: Bearer
    out = tmp_path / "run"
    names = sorted(p.name for p in out.iterdir())
    assert {"report.json", "report.md", "commands.txt", "mode-0.log", "mode-0.5.log"} <= set(names)
    # The server really logged them (as vLLM does): the saved copies must not.
    assert "api_key" in (out / "mode-0.log").read_text()
    assert "retrying:" in (out / "mode-0.log").read_text()
    texts = {p.name: p.read_text(errors="replace") for p in out.iterdir() if p.is_file()}
    texts["stdout"], texts["stderr"] = proc.stdout, proc.stderr
    from vllm_offload_doctor.compare.model import CompareReport
    from vllm_offload_doctor.compare.render import RENDERERS

    typed = CompareReport.from_dict(report)
    texts.update({f"--format {name}": r(typed, str(out)) for name, r in RENDERERS.items()})
    found = {name: leaks(text) for name, text in texts.items() if leaks(text)}
    assert found == {}, f"secrets leaked: {found}"
    assert "mirror.example" in texts["commands.txt"]  # the value is kept, only the password masked
    assert "VLLM_DEBUG_TAG=***" in texts["commands.txt"]


def test_dry_run_prints_no_planted_secret(tmp_path: Path) -> None:
    argv = [
        *_argv(tmp_path / "run", free_port()), "--dry-run", "--verify-fix",
        "--model", f"https://u:{PLANTED['url_password']}@mirror.example.com/m",
        "--", *PLANTED_ARGV,
    ]  # fmt: skip
    env = _env("effective", uuid.uuid4().hex, **PLANTED_ENV)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--model-loader-extra-config" in proc.stdout
    assert leaks(proc.stdout + proc.stderr) == []


def test_api_key_from_the_environment_is_sent(tmp_path: Path) -> None:
    proc, report = run_compare(tmp_path, "effective", VLLM_API_KEY=SECRETS["api_key"])
    assert proc.returncode == 0, proc.stderr
    assert mode(report, "0.5")["latency"]["ok"] == 2
    assert "Bearer ***" in (tmp_path / "run" / "commands.txt").read_text()


def test_unknown_api_key_is_a_401_not_a_timeout(tmp_path: Path) -> None:
    proc, report = run_compare(
        tmp_path, "effective", "--timeout", "300", FAKE_VLLM_API_KEY="sk-nobodyknowsthis0123456789"
    )
    assert proc.returncode == 1
    base = mode(report, "0")
    assert base["status"] == "unauthorized"  # it stopped at the 401, not at --timeout
    assert base["reason"].startswith("401: the server wants an API key")
    assert "401: the server wants an API key" in report["verdict"]["summary"]
    assert "--timeout" not in report["verdict"]["summary"]


# ---------------------------------------------------------------------------- the run folder


def test_out_holding_a_report_is_refused_then_forced_clean(tmp_path: Path) -> None:
    proc, _ = run_compare(tmp_path, "effective", "--offload-gb", "0.5", "--offload-gb", "1")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "run"
    assert (out / "mode-1.log").exists()
    assert not (out / ".offload-doctor.lock").exists()  # a finished run leaves no lock behind
    marker = uuid.uuid4().hex
    again = subprocess.run(
        _argv(out, free_port()),
        env=_env("effective", marker),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert kill_marked(marker) == []
    assert again.returncode == 2 and "holds the report of an earlier run" in again.stderr
    assert "Traceback" not in again.stderr
    proc, report = run_compare(tmp_path, "effective", "--force")
    assert proc.returncode == 0, proc.stderr
    assert not (out / "mode-1.log").exists()  # nothing stale from the first run
    assert [m["label"] for m in report["modes"]] == ["0", "0.5"]


def test_out_in_use_by_another_run_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    with open(out / ".offload-doctor.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write("424242\n")
        lock.flush()
        proc = subprocess.run(
            _argv(out, free_port()),
            env=_env("effective", uuid.uuid4().hex),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2
    assert "in use by another offload-doctor run (pid 424242)" in proc.stderr
    assert not (out / "report.json").exists()


def test_the_lock_is_held_during_the_run_and_removed_after_it(tmp_path: Path) -> None:
    from vllm_offload_doctor.compare.artifacts import LOCK_NAME, claim
    from vllm_offload_doctor.errors import DoctorError

    out = tmp_path / "run"
    with claim(out, force=False):
        assert (out / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        with (
            pytest.raises(DoctorError, match="in use by another offload-doctor run"),
            claim(out, force=False),
        ):
            pass
        assert (out / LOCK_NAME).exists()  # the refused run leaves the holder's lock alone
    assert not (out / LOCK_NAME).exists()
    with pytest.raises(KeyboardInterrupt), claim(out, force=False):
        raise KeyboardInterrupt
    assert not (out / LOCK_NAME).exists()
    with claim(out, force=False):  # and the folder can be claimed again
        assert (out / LOCK_NAME).exists()


def test_default_out_folders_are_unique_within_a_second() -> None:
    from vllm_offload_doctor.compare.artifacts import default_out_dir

    assert len({default_out_dir() for _ in range(50)}) == 50


def test_unwritable_out_is_a_one_line_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = subprocess.run(
        _argv(blocker / "run", free_port()),
        env=_env("effective", uuid.uuid4().hex),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("offload-doctor: error: cannot use --out")


def test_full_disk_mid_run_keeps_partial_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write failing after the baseline (ENOSPC) is a WriteError (exit 2); what was written
    stays and no server is left running."""
    import errno

    from test_compare_e2e import FAKE

    from vllm_offload_doctor.compare import artifacts as art
    from vllm_offload_doctor.compare.config import CompareConfig
    from vllm_offload_doctor.compare.render import report_files
    from vllm_offload_doctor.compare.run import CompareRun

    marker = uuid.uuid4().hex
    for k, v in _env("effective", marker).items():
        monkeypatch.setenv(k, v)
    real = art.atomic_write
    state = {"baseline_done": False}

    def flaky(path: Path, text: str) -> None:
        if state["baseline_done"] and path.name == "report.md":
            raise art.WriteError(f"cannot write {path}: {os.strerror(errno.ENOSPC)}")
        real(path, text)
        if path.name == "report.json" and '"status": "ok"' in text:
            state["baseline_done"] = True

    monkeypatch.setattr(art, "atomic_write", flaky)
    cfg = CompareConfig(
        vllm_cmd=[str(FAKE)],
        port=free_port(),
        repeats=1,
        warmup=0,
        grace_s=3,
        out_dir=tmp_path / "run",
    )
    run = CompareRun(cfg, files=report_files)
    try:
        with pytest.raises(art.WriteError, match="No space left on device"):
            run.execute()
    finally:
        left = kill_marked(marker)
    assert left == []
    saved = json.loads((tmp_path / "run" / "report.json").read_text())
    assert mode(saved, "0")["status"] == "ok"
    assert run.report.error and "No space left" in run.report.error


# ---------------------------------------------------------------------------- SIGKILL


def _sigkill(proc: subprocess.Popen[bytes], marker: str) -> list[int]:
    """SIGKILL the doctor; the pids of its servers still alive after "a few seconds" (the guard's
    SIGTERM, then SIGKILL)."""
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    gone_by = time.monotonic() + 10
    while time.monotonic() < gone_by and marked(marker):
        time.sleep(0.1)
    return [p.pid for p in marked(marker)]


def test_sigkill_of_the_doctor_takes_the_server_down(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    out = tmp_path / "run"
    proc = subprocess.Popen(
        _argv(out, free_port(), "--timeout", "120"),
        env=_env("hang", marker),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not offload_server_up(out, marker):
            pytest.fail("the offload-mode server never started")
        server_pid = mode(json.loads((out / "report.json").read_text()), "0.5")["pid"]
        survivors = _sigkill(proc, marker)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        left = kill_marked(marker)
    assert survivors == [], f"server tree outlived the doctor: {survivors}"
    assert left == []
    assert not os.path.exists(f"/proc/{server_pid}") or _zombie(server_pid)


def test_sigkill_of_the_doctor_leaves_each_started_modes_log_scrubbed(tmp_path: Path) -> None:
    """Nothing lost: the partial report and every started mode's log are in --out, masked."""
    marker = uuid.uuid4().hex
    out = tmp_path / "run"
    extra = tmp_path / "extra.log"
    extra.write_text(planted_line("hf_token", "token: {v}") + "\n")
    proc = subprocess.Popen(
        _argv(out, free_port(), "--timeout", "120"),
        env=_env("hang", marker, FAKE_VLLM_EXTRA_LOG=str(extra)),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not offload_server_up(out, marker):
            pytest.fail("the offload-mode server never started")
        time.sleep(1.5)  # the mirror copies every half second
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        kill_marked(marker)
    report = json.loads((out / "report.json").read_text())
    assert [m["label"] for m in report["modes"]] == ["0", "0.5"]
    assert mode(report, "0.5")["status"] == "starting"  # the partial report
    for label in ("0", "0.5"):
        log = (out / f"mode-{label}.log").read_text()
        assert "Starting to load model" in log, log[:500]
        assert leaks(log) == [], f"mode-{label}.log leaks {leaks(log)}"
        assert "token: " in log  # the planted line arrived, masked


@pytest.mark.parametrize("moment", ["preflight", "baseline", "offload"])
def test_sigkill_at_any_moment_leaves_a_readable_report_and_nothing_that_blocks(
    tmp_path: Path, moment: str
) -> None:
    """Issue 20 killed compare at 30 random moments: report.json was missing in 3, the lock file
    stayed in 22, a raw (unmasked) log folder in 1 (bench_issue20.py's sigkills, fefc042: lock
    and raw folder left in 29 of 30). Here: before any server, while the baseline starts, while
    the offload mode starts; the janitor (compare/janitor.py) removes what the doctor could not."""
    marker = uuid.uuid4().hex
    out, tmp = tmp_path / "run", tmp_path / "tmp"
    tmp.mkdir()
    scenario = "slow" if moment == "baseline" else "hang"
    proc = subprocess.Popen(
        _argv(out, free_port(), "--timeout", "120"),
        env=_env(scenario, marker, TMPDIR=str(tmp), FAKE_VLLM_SLOW_S="30"),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if moment == "offload":
            assert offload_server_up(out, marker), "the offload-mode server never started"
        else:  # the folder claimed (its lock made), or the baseline's server tree up
            deadline = time.monotonic() + 60
            while not (out / ".offload-doctor.lock").exists() or (
                moment == "baseline" and len(marked(marker)) < 2
            ):
                assert time.monotonic() < deadline, "the run never got there"
                time.sleep(0.02)
            time.sleep(0.1)  # report.json is written a few ms after the lock (rendering)
        survivors = _sigkill(proc, marker)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        kill_marked(marker)
    assert survivors == [], f"server tree outlived the doctor: {survivors}"
    report = json.loads((out / "report.json").read_text())  # readable, whenever it died
    assert report["complete"] is False
    gone_by = time.monotonic() + 5
    while (any(tmp.iterdir()) or (out / ".offload-doctor.lock").exists()) and (
        time.monotonic() < gone_by
    ):
        time.sleep(0.05)
    assert list(tmp.iterdir()) == [], "the raw (unmasked) server logs outlived the run"
    assert not (out / ".offload-doctor.lock").exists()
    # The next run on the same folder proceeds.
    marker = uuid.uuid4().hex
    again = subprocess.run(
        [*_argv(out, free_port()), "--force"], env=_env("effective", marker, TMPDIR=str(tmp)),
        cwd=tmp_path, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert kill_marked(marker) == []
    assert again.returncode == 0, again.stderr


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


if sys.platform != "linux":  # pragma: no cover - the guard's death signal is Linux-only
    pytestmark = pytest.mark.skip("Linux only")


def test_raw_logs_of_a_killed_run_are_swept(tmp_path: Path) -> None:
    from vllm_offload_doctor.compare.artifacts import RAW_PREFIX, sweep_raw_dirs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{RAW_PREFIX}{dead.pid}-abc"
    live = tmp_path / f"{RAW_PREFIX}{os.getpid()}-def"
    for d in (stale, live):
        d.mkdir()
        (d / "mode-0.log").write_text(f"api_key {SECRETS['api_key']}\n")
    sweep_raw_dirs(tmp_path)
    assert not stale.exists() and live.exists()
