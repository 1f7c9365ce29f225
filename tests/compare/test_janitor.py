"""compare/janitor.py: after the doctor's SIGKILL it removes the raw (unmasked) server logs and
the --out lock file, and nothing of another run."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_offload_doctor.compare import janitor
from vllm_offload_doctor.compare.artifacts import JANITOR, LOCK_NAME, RAW_PREFIX

if sys.platform != "linux":  # pragma: no cover - the parent-death signal is Linux-only
    pytest.skip("Linux only", allow_module_level=True)


def _run_folder(tmp_path: Path, pid: int) -> tuple[Path, Path]:
    raw = tmp_path / f"{RAW_PREFIX}{pid}-abc"
    raw.mkdir()
    (raw / "mode-0.log").write_text("token hf_QpWoEiRuTyAlSkDjFhGzXmCnVb3141592653\n")
    lock = tmp_path / LOCK_NAME
    lock.write_text(f"{pid}\n")
    return raw, lock


def test_the_prefix_is_the_one_artifacts_uses() -> None:
    assert janitor.RAW_PREFIX == RAW_PREFIX  # it cannot import it (-I -S)


def test_clean_removes_the_dead_runs_raw_logs_and_lock(tmp_path: Path) -> None:
    raw, lock = _run_folder(tmp_path, 4242)
    janitor.clean(4242, str(lock), str(raw))
    assert not raw.exists() and not lock.exists()


def test_clean_leaves_another_runs_folder_and_a_held_lock(tmp_path: Path) -> None:
    raw, lock = _run_folder(tmp_path, 4243)
    janitor.clean(4242, str(lock), str(raw))  # not the dead doctor's pid
    assert raw.exists() and lock.exists()
    lock.write_text("4242\n")
    with open(lock) as held:  # a new run took the folder
        fcntl.flock(held, fcntl.LOCK_EX)
        janitor.clean(4242, str(lock), str(raw))
    assert lock.exists()


# A stand-in doctor: it makes its raw-log folder and lock file as compare does, starts the
# janitor, says where they are, and waits to be killed.
PARENT = """
import os, subprocess, sys, time
folder = sys.argv[2]
raw = os.path.join(folder, f"{sys.argv[3]}{os.getpid()}-abc")
os.mkdir(raw)
with open(os.path.join(raw, "mode-0.log"), "w") as f:
    f.write("token hf_QpWoEiRuTyAlSkDjFhGzXmCnVb3141592653\\n")
lock = os.path.join(folder, sys.argv[4])
with open(lock, "w") as f:
    f.write(f"{os.getpid()}\\n")
subprocess.Popen([sys.executable, "-I", "-S", sys.argv[1], str(os.getpid()), lock, raw])
print(raw, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_the_janitor_cleans_after_its_parents_death_only(tmp_path: Path, how: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT, JANITOR, str(tmp_path), RAW_PREFIX, LOCK_NAME],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        raw, lock = Path(proc.stdout.readline().strip()), tmp_path / LOCK_NAME
        assert raw.is_dir() and lock.is_file()
        time.sleep(0.3)  # the janitor is waiting
        kids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == proc.pid]
        assert kids, "the janitor did not start"
        if how == "sigterm":  # the doctor's normal end: stopped first, it touches nothing
            os.kill(kids[0], signal.SIGTERM)
            time.sleep(0.5)
            assert raw.exists() and lock.exists()
            return
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while (raw.exists() or lock.exists()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not raw.exists() and not lock.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
