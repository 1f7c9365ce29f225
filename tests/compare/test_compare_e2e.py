"""End-to-end: `offload-doctor compare` against tests/fake-vllm, every scenario, no process left."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
from server_procs import MARKER, free_port, kill_marked, marked

pytest.importorskip("vllm_offload_doctor.analyze.engine")

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "fake-vllm"


def _env(scenario: str, marker: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    env.update(
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        FAKE_VLLM_SCENARIO=scenario,
        **{MARKER: marker},
        **extra,
    )
    return env


def _argv(out: Path, port: int, *more: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm_offload_doctor",
        "compare",
        "--vllm-cmd",
        str(FAKE),
        "--port",
        str(port),
        "--repeats",
        "2",
        "--warmup",
        "0",
        "--grace",
        "3",
        "--out",
        str(out),
        *more,
    ]


def run_compare(
    tmp_path: Path, scenario: str, *more: str, timeout: float = 45, **env: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    marker = uuid.uuid4().hex
    out = tmp_path / "run"
    try:
        proc = subprocess.run(
            _argv(out, free_port(), *more),
            env=_env(scenario, marker, **env),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        leftovers = kill_marked(marker)
    assert leftovers == [], f"processes left behind: {leftovers}"
    report = json.loads((out / "report.json").read_text())
    return proc, report


def mode(report: dict[str, Any], label: str) -> dict[str, Any]:
    return next(m for m in report["modes"] if m["label"] == label)


def test_effective(tmp_path: Path) -> None:
    proc, report = run_compare(tmp_path, "effective")
    assert proc.returncode == 0, proc.stderr
    assert report["verdict"]["status"] == "effective"
    assert report["complete"] and not report["interrupted"]
    base, off = mode(report, "0"), mode(report, "0.5")
    assert off["log_facts"]["offloaded_gib"] == pytest.approx(0.51)
    assert base["log_facts"]["model_loading_gib"] > off["log_facts"]["model_loading_gib"]
    assert off["latency"]["median_s"] > base["latency"]["median_s"]
    perf = report["comparisons"][0]["performance"]
    assert perf["slowdown"] > 1 and perf["extra_ms_per_token"] > 0
    assert base["server_version"] == "0.25.1"
    assert base["metrics"]["num_gpu_blocks"] > 0
    assert base["answers_matched"] == {"matched": 2, "checked": 2}
    assert base["gpu"]["available"] in (True, False)
    assert base["host_rss"]["total_mib"] > 0
    assert len(base["processes"]) == 2  # API server + EngineCore
    assert base["stop"]["survivors"] == [] and base["stop"]["port_free"] is True
    out = tmp_path / "run"
    for name in ("mode-0.log", "mode-0.5.log", "report.md", "report.html", "commands.txt"):
        assert (out / name).is_file()
    assert "Total CPU offloaded parameters: 0.51" in (out / "mode-0.5.log").read_text()
    assert "Verdict: OK" in proc.stdout and "0.51" in proc.stdout
    assert "nvidia-smi" in proc.stdout
    assert "effective" in (out / "report.md").read_text()
    assert 'id="latency-chart"' in (out / "report.html").read_text()


def test_ignored_v2(tmp_path: Path) -> None:
    proc, report = run_compare(tmp_path, "ignored")
    assert proc.returncode == 1, proc.stderr
    v = report["verdict"]
    assert v["status"] == "ignored", v
    assert "https://github.com/vllm-project/vllm/issues/51396" in v["links"]
    assert "https://github.com/vllm-project/vllm/pull/51413" in v["links"]
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in v["remedy"]
    assert mode(report, "0.5")["log_facts"]["model_runner"] == "v2"


def test_oom_in_offload_mode_is_the_answer(tmp_path: Path) -> None:
    proc, report = run_compare(tmp_path, "oom-load")
    assert proc.returncode == 1, proc.stderr
    v = report["verdict"]
    assert v["status"] == "failed"
    off = mode(report, "0.5")
    assert off["status"] == "exited"
    assert off["analysis"]["category"].startswith("oom"), off["analysis"]
    assert "out of memory" in v["summary"].lower() or "oom" in v["summary"].lower()


def test_port_taken_bind_failure(tmp_path: Path) -> None:
    proc, report = run_compare(tmp_path, "port-taken")
    assert proc.returncode == 1
    assert report["verdict"]["status"] == "failed"
    assert mode(report, "0.5")["analysis"]["category"] == "port_in_use"


def test_slow_start_shows_phases(tmp_path: Path) -> None:
    proc, report = run_compare(tmp_path, "slow", FAKE_VLLM_SLOW_S="1")
    assert proc.returncode == 0, proc.stderr
    assert mode(report, "0")["startup_s"] >= 1.0
    assert "loading weights" in proc.stderr or "profiling" in proc.stderr


def test_hang_times_out(tmp_path: Path) -> None:
    proc, report = run_compare(tmp_path, "hang", "--timeout", "2")
    assert proc.returncode == 1
    off = mode(report, "0.5")
    assert off["status"] == "timeout"
    assert report["verdict"]["status"] == "failed"
    assert "--timeout" in report["verdict"]["summary"]


def test_die_mid_start(tmp_path: Path) -> None:
    # The fake exits abruptly and leaves its EngineCore child running: the sweep must get it.
    proc, report = run_compare(tmp_path, "die")
    assert proc.returncode == 1
    off = mode(report, "0.5")
    assert off["status"] == "exited" and off["returncode"] == 1
    assert off["stop"]["survivors"] == []
    assert report["verdict"]["status"] == "failed"


def test_malformed_responses(tmp_path: Path) -> None:
    proc, report = run_compare(tmp_path, "malformed")
    assert proc.returncode == 1
    off = mode(report, "0.5")
    assert off["status"] == "requests_failed"
    errors = [r["error"] for r in off["requests"]]
    assert any("not valid JSON" in e for e in errors) and any("choices" in e for e in errors)
    assert report["verdict"]["status"] == "failed"


@pytest.mark.parametrize("how", ["scenario", "args"])
def test_tensor_parallel_per_rank(tmp_path: Path, how: str) -> None:
    if how == "scenario":
        proc, report = run_compare(tmp_path, "tp2")
    else:
        proc, report = run_compare(tmp_path, "effective", "--", "--tensor-parallel-size", "2")
        assert report["config"]["tensor_parallel_size"] == 2
        assert mode(report, "0")["command"][-2:] == ["--tensor-parallel-size", "2"]
    assert proc.returncode == 0, proc.stderr
    ranks = report["comparisons"][0]["ranks"]
    assert set(ranks) >= {"Worker_TP0", "Worker_TP1"}
    assert all(r["status"] == "effective" for r in ranks.values())
    assert all(r["offloaded_gib"] == pytest.approx(0.51) for r in ranks.values())
    assert len(mode(report, "0.5")["processes"]) == 4  # API server, EngineCore, 2 workers
    assert "Worker_TP1 offloaded" in proc.stdout


def test_port_busy_names_holder(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        marker = uuid.uuid4().hex
        proc = subprocess.run(
            _argv(tmp_path / "run", port),
            env=_env("effective", marker),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert kill_marked(marker) == []
    assert proc.returncode == 2
    assert "in use" in proc.stderr and str(os.getpid()) in proc.stderr
    assert not (tmp_path / "run" / ".offload-doctor.lock").exists()  # an error ends the run too


def test_dry_run_prints_reference_commands(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", "compare", "--dry-run"],
        env=_env("effective", "x"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("vllm serve")]
    rev = "c1899de289a04d12100db370d81485cdf75e47ca"
    assert lines == [
        f"vllm serve Qwen/Qwen3-0.6B --revision {rev} --cpu-offload-gb {gb} "
        "--host 127.0.0.1 --port 8000 --max-model-len 2048"
        for gb in ("0", "0.5")
    ]
    assert "Назови одним словом столицу Франции. /no_think" in proc.stdout
    assert not (tmp_path / "offload-doctor-runs").exists()


def _start_interruptible(tmp_path: Path, marker: str) -> tuple[subprocess.Popen[str], Path]:
    out = tmp_path / "run"
    (tmp_path / "tmp").mkdir()  # TMPDIR of its own: the raw-log folder must not outlive the run
    proc = subprocess.Popen(
        _argv(out, free_port(), "--timeout", "60"),
        env=_env("hang", marker, TMPDIR=str(tmp_path / "tmp")),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if not offload_server_up(out, marker):
        reap(proc)
        pytest.fail("the offload-mode server never started")
    return proc, out


def offload_server_up(out: Path, marker: str) -> bool:
    """Wait until the second (hanging) server is up with its EngineCore child. (The mode log is
    saved scrubbed only when the mode ends, so watch the report and the processes.)"""
    deadline = time.monotonic() + 90  # generous: the suite may run on a loaded machine
    while time.monotonic() < deadline:
        if _offload_mode_started(out) and any(_is_engine(p) for p in marked(marker)):
            return True
        time.sleep(0.1)
    return False


def reap(proc: subprocess.Popen[str]) -> None:
    """Kill and wait: a Popen dropped while its process runs raises ResourceWarning in whichever
    test the garbage collector happens to run next (an error under filterwarnings=error)."""
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def _offload_mode_started(out: Path) -> bool:
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return False
    return any(m["label"] == "0.5" and m.get("pid") for m in report["modes"])


def _is_engine(p: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return "EngineCor" in p.name() or "--fake-vllm-child" in p.cmdline()
    return False


@pytest.mark.parametrize(
    ("sig", "rc"),
    [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGQUIT, 131)],
)
def test_interrupt_cleans_up_and_keeps_partial_report(
    tmp_path: Path, sig: signal.Signals, rc: int
) -> None:
    marker = uuid.uuid4().hex
    proc, out = _start_interruptible(tmp_path, marker)
    try:
        proc.send_signal(sig)
        _stdout, stderr = proc.communicate(timeout=60)
    finally:
        reap(proc)
        survivors = kill_marked(marker)
    assert proc.returncode == rc, stderr
    assert survivors == [], f"processes left behind: {survivors}"
    report = json.loads((out / "report.json").read_text())
    assert report["interrupted"] is True and report["complete"] is False
    assert mode(report, "0")["status"] == "ok"
    assert mode(report, "0.5")["status"] == "interrupted"
    assert (out / "mode-0.5.log").exists() and (out / "report.md").exists()
    assert "partial report" in stderr
    assert not (out / ".offload-doctor.lock").exists()
    assert list((tmp_path / "tmp").iterdir()) == []  # the raw (unmasked) logs are gone too


def test_a_failed_mode_shows_the_line_it_failed_on_everywhere(tmp_path: Path) -> None:
    proc, report = run_compare(tmp_path, "effective", "--", "--no-such-flag")
    needle = "vllm serve: error: unrecognized arguments: --no-such-flag"
    assert f"mode-0.log line 2: {needle}" in proc.stdout
    assert f"mode-0.log line 2: {needle}" in (tmp_path / "run" / "report.md").read_text()
    assert mode(report, "0")["analysis"]["evidence"] == [{"line": 2, "text": needle}]


def test_host_oom_run_names_host_memory(tmp_path: Path) -> None:
    """The issue's done-when: with memory to spare the silent death says what host memory did."""
    proc, report = run_compare(tmp_path, "host-oom", "--offload-gb", "8")
    assert proc.returncode == 1
    assert "host memory did not run out" in proc.stdout
    hm = mode(report, "8")["host_memory"]
    assert hm["samples"] >= 1 and hm["peak_rss_gib"] > 0 and hm["total_gib"] > 0
    assert mode(report, "8")["analysis"]["evidence"][-1]["text"].endswith("Failed core proc(s): {}")
