"""`compare` leaves nothing of a server's tree behind, however it ends: each server leaves a
double-forked, setsid, untagged grandchild that holds the port and ignores SIGTERM
(fake-vllm's FAKE_VLLM_ESCAPE). After the run none is alive and the port is free."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from server_procs import alive, escapees

from tests.compare.test_compare_e2e import _argv, _env, free_port, kill_marked, marked, reap
from vllm_offload_doctor.compare.server import CGROUP_PREFIX, own_cgroup_dir
from vllm_offload_doctor.machine.ports import probe_port

pytest.importorskip("vllm_offload_doctor.analyze.engine")

if sys.platform != "linux":  # pragma: no cover - the guard's death signal is Linux-only
    pytest.skip("Linux only", allow_module_level=True)


def gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def port_free_within(port: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not probe_port("127.0.0.1", port).free:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def cgroups(doctor: int) -> set[str]:
    """The cgroups of the doctor with this pid under ours (none where no cgroup can be made: then
    nothing can leak). Its own only: other tests may run compares beside this one."""
    base = own_cgroup_dir()
    if base is None:
        return set()
    return {p.name for p in base.iterdir() if p.name.startswith(f"{CGROUP_PREFIX}{doctor}-")}


def cgroups_within(doctor: int, seconds: float) -> set[str]:
    deadline = time.monotonic() + seconds
    while (left := cgroups(doctor)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def cleanup(marker: str, pidfile: Path) -> list[int]:
    left = [p for p in escapees(pidfile) if alive(p)]
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return kill_marked(marker) + left


@pytest.mark.parametrize(
    ("scenario", "rc", "statuses"),
    [
        ("effective", 0, {"0": "ok", "0.5": "ok"}),  # ends normally
        ("oom-load", 1, {"0": "ok", "0.5": "exited"}),  # the offload server dies with an OOM
    ],
)
def test_compare_ends_with_no_escapee_left(
    tmp_path: Path, scenario: str, rc: int, statuses: dict[str, str]
) -> None:
    marker, pidfile, port = uuid.uuid4().hex, tmp_path / "escapees", free_port()
    out = tmp_path / "run"
    proc = subprocess.Popen(
        _argv(out, port),
        env=_env(scenario, marker, FAKE_VLLM_ESCAPE=str(pidfile)),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _stdout, stderr = proc.communicate(timeout=90)
        left = gone_within(escapees(pidfile), 1)
        free = probe_port("127.0.0.1", port).free
    finally:
        reap(proc)
        leftovers = cleanup(marker, pidfile)
    assert len(escapees(pidfile)) == 2, "each mode's server should have left one behind"
    assert left == [] and leftovers == [], f"left behind: {left or leftovers}"
    assert free, "the port is still taken after compare ended"
    assert cgroups(proc.pid) == set(), "a run's cgroup was left behind"
    assert proc.returncode == rc, stderr
    report = json.loads((out / "report.json").read_text())
    assert {m["label"]: m["status"] for m in report["modes"]} == statuses
    for m in report["modes"]:
        assert m["stop"]["survivors"] == [] and m["stop"]["port_free"] is True


def _start_hanging(tmp_path: Path, marker: str, pidfile: Path, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        _argv(tmp_path / "run", port, "--timeout", "60"),
        env=_env("hang", marker, FAKE_VLLM_ESCAPE=str(pidfile)),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 90  # generous: the suite may run on a loaded machine
    # The first mode's escapee, then the second (hanging) server's, both up.
    while len(escapees(pidfile)) < 2 or len(marked(marker)) < 2:
        if time.monotonic() > deadline or proc.poll() is not None:
            reap(proc)
            left = cleanup(marker, pidfile)
            pytest.fail(f"the offload-mode server never started (killed after: {left})")
        time.sleep(0.1)
    return proc


@pytest.mark.parametrize(("sig", "rc"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signalled_compare_leaves_no_escapee(tmp_path: Path, sig: int, rc: int) -> None:
    marker, pidfile, port = uuid.uuid4().hex, tmp_path / "escapees", free_port()
    proc = _start_hanging(tmp_path, marker, pidfile, port)
    try:
        proc.send_signal(sig)
        _out, stderr = proc.communicate(timeout=60)
        left = gone_within(escapees(pidfile), 1)
        free = port_free_within(port, 1)
    finally:
        reap(proc)
        leftovers = cleanup(marker, pidfile)
    assert proc.returncode == rc, stderr
    assert left == [] and leftovers == [], f"left behind: {left or leftovers}"
    assert free, "the port is still taken after compare ended"


def test_a_killed_compare_leaves_no_escapee(tmp_path: Path) -> None:
    # SIGKILL: no cleanup runs in the doctor; the guard (and its cgroup) take the tree down.
    marker, pidfile, port = uuid.uuid4().hex, tmp_path / "escapees", free_port()
    proc = _start_hanging(tmp_path, marker, pidfile, port)
    try:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        left = gone_within(escapees(pidfile), 10)  # the guard's SIGTERM, wait, SIGKILL
        deadline = time.monotonic() + 10  # the guard itself goes last
        while marked(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        free = port_free_within(port, 5)
    finally:
        reap(proc)
        leftovers = cleanup(marker, pidfile)
    assert left == [] and leftovers == [], f"left behind: {left or leftovers}"
    assert free, "the port is still taken after compare was killed"
    # The guard removes it once empty, a moment after the last member died.
    assert cgroups_within(proc.pid, 5) == set(), "the guard left the run's cgroup behind"
