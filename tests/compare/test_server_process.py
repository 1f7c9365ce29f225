"""ServerProcess: readiness, early exit, timeout, and teardown that leaves nothing behind."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from server_procs import free_port

from vllm_offload_doctor.compare.server import RUN_TAG, ServerProcess

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "fake-vllm"


def tagged(tag: str) -> list[int]:
    pids = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(RUN_TAG) == tag:
                pids.append(p.pid)
        except psutil.Error:
            continue
    return pids


def fake(port: int, offload: str = "0", model: str = "m") -> list[str]:
    return [
        str(FAKE),
        "serve",
        model,
        "--cpu-offload-gb",
        offload,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def test_ready_then_sigint_stops_whole_tree(tmp_path: Path) -> None:
    port = free_port()
    srv = ServerProcess(
        fake(port),
        log_path=tmp_path / "s.log",
        host="127.0.0.1",
        port=port,
        served_model="m",
        env=dict(os.environ, FAKE_VLLM_SCENARIO="tp2"),
    )
    with srv:
        res = srv.wait_ready(20)
        assert res.ready, res
        assert len(srv.live_tree()) == 4  # API server, EngineCore, Worker_TP0, Worker_TP1
    stop = srv.stop_result
    assert stop is not None
    assert stop.signals == ["SIGINT"] and stop.returncode == 0
    assert stop.survivors == [] and stop.port_free is True
    assert tagged(srv.tag) == []
    assert "Application startup complete" in (tmp_path / "s.log").read_text()


def test_wrong_served_name_is_not_ready(tmp_path: Path) -> None:
    port = free_port()
    with ServerProcess(
        fake(port), log_path=tmp_path / "s.log", host="127.0.0.1", port=port, served_model="other"
    ) as srv:
        res = srv.wait_ready(1.5)
        assert not res.ready and res.timed_out
    assert tagged(srv.tag) == []


def test_early_exit_detected_immediately(tmp_path: Path) -> None:
    port = free_port()
    srv = ServerProcess(
        fake(port, "0.5"),
        log_path=tmp_path / "s.log",
        host="127.0.0.1",
        port=port,
        served_model="m",
        env=dict(os.environ, FAKE_VLLM_SCENARIO="oom-load"),
    )
    with srv:
        t0 = time.monotonic()
        res = srv.wait_ready(60)
        assert res.exited and res.returncode == 1
        assert time.monotonic() - t0 < 10
    assert "CUDA out of memory" in (tmp_path / "s.log").read_text()


STUBBORN = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A grandchild that leaves the process group (new session) and ignores polite signals.
    subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
        start_new_session=True)
    print("started", flush=True)
    time.sleep(600)
    """
)


def test_stubborn_tree_is_killed_including_escaped_grandchild(tmp_path: Path) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    port = free_port()
    srv = ServerProcess(
        [sys.executable, str(script)],
        log_path=tmp_path / "s.log",
        host="127.0.0.1",
        port=port,
        served_model="m",
        grace_s=0.5,
        term_s=0.5,
    )
    with srv:
        deadline = time.monotonic() + 10
        while len(srv.live_tree()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(srv.live_tree()) == 2
    stop = srv.stop_result
    assert stop is not None
    assert stop.signals == ["SIGINT", "SIGTERM", "SIGKILL"]
    assert stop.swept, "the escaped grandchild should have been swept"
    assert stop.survivors == []
    assert tagged(srv.tag) == []


def test_missing_command_raises_oserror(tmp_path: Path) -> None:
    srv = ServerProcess(
        [str(tmp_path / "nope")],
        log_path=tmp_path / "s.log",
        host="127.0.0.1",
        port=free_port(),
        served_model="m",
    )
    with pytest.raises(OSError):
        srv.start()
    assert srv.stop().signals == []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="subreaper and /proc/net/tcp are Linux")
def test_double_forked_setsid_port_holder_is_killed(tmp_path: Path) -> None:
    # fake-vllm's escapee: forked twice (re-parented at once), setsid, no environment (no run
    # tag), listening on the server's socket, deaf to SIGINT and SIGTERM.
    port = free_port()
    pidfile = tmp_path / "escapees"
    srv = ServerProcess(
        fake(port),
        log_path=tmp_path / "s.log",
        host="127.0.0.1",
        port=port,
        served_model="m",
        env=dict(os.environ, FAKE_VLLM_ESCAPE=str(pidfile)),
        grace_s=2,
        term_s=1,
        port_wait_s=3,
    )
    escapee = 0
    try:
        with srv:
            assert srv.wait_ready(20).ready
            escapee = int(pidfile.read_text())
            assert _alive(escapee) and RUN_TAG not in psutil.Process(escapee).environ()
        stop = srv.stop_result
        assert stop is not None
        assert not _alive(escapee), "the escaped port holder outlived the server"
        assert stop.port_free is True and stop.survivors == []
    finally:
        if escapee and _alive(escapee):
            os.kill(escapee, 9)
