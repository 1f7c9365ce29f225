"""The guard takes down what the server started even after it left the group with setsid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_offload_doctor.compare.server import GUARD

if sys.platform != "linux":  # pragma: no cover - the guard's death signal is Linux-only
    pytest.skip("Linux only", allow_module_level=True)

# The "server": forks a grandchild that leaves the group and the session (setsid) and drops its
# environment, then both sleep. `mode` is "die": the server exits after 2 s; "live": it stays.
# `how` is "fork": the grandchild is the server's child; "double": forked twice, its parent exits
# at once, so it is re-parented before anyone can see whose it was (the guard is a subreaper).
SERVER = """
import os, sys, time
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()
    if sys.argv[3] == "double" and os.fork() != 0:
        os._exit(0)
    os.write(w, str(os.getpid()).encode())
    os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)"], {})
if sys.argv[3] == "double":
    os.waitpid(pid, 0)
os.close(w)
open(sys.argv[1], "w").write(os.read(r, 32).decode())
time.sleep(2 if sys.argv[2] == "die" else 600)
"""
# The "doctor": starts the guard as compare does (a new session), then sleeps until killed.
DOCTOR = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-I", "-S", sys.argv[1], str(os.getpid()), "--",
                  sys.executable, "-c", sys.argv[2], *sys.argv[3:]],
                 start_new_session=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _run(tmp_path: Path, mode: str, how: str = "fork") -> tuple[subprocess.Popen[bytes], int]:
    pidfile = tmp_path / "grandchild"
    doctor = subprocess.Popen(
        [sys.executable, "-c", DOCTOR, GUARD, SERVER, str(pidfile), mode, how]
    )
    deadline = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return doctor, int(pidfile.read_text())


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("how", ["fork", "double"])
def test_a_setsid_grandchild_dies_with_the_doctor(tmp_path: Path, how: str) -> None:
    doctor, grandchild = _run(tmp_path, "live", how)
    try:
        assert os.getsid(grandchild) != os.getsid(doctor.pid)  # it really left the session
        time.sleep(1.5)  # the guard records descendants every second
        doctor.send_signal(signal.SIGKILL)
        doctor.wait()
        assert _gone_within(grandchild, 10), "the setsid grandchild outlived the doctor"
    finally:
        if _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)
        doctor.kill()
        doctor.wait()


@pytest.mark.parametrize("how", ["fork", "double"])
def test_a_setsid_grandchild_dies_with_the_server(tmp_path: Path, how: str) -> None:
    doctor, grandchild = _run(tmp_path, "die", how)
    try:
        assert _gone_within(grandchild, 10), "the setsid grandchild outlived its server"
    finally:
        if _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)
        doctor.kill()
        doctor.wait()
