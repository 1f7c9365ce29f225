"""Process and port helpers the compare tests that start servers share."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import psutil

# fake-vllm and everything it starts carry this variable: a test finds and kills exactly its own.
MARKER = "FAKE_VLLM_TEST_MARKER"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    """Running, not a zombie (read from /proc: Linux only)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def escapees(pidfile: Path) -> list[int]:
    """The pids fake-vllm's escaped descendants wrote to `pidfile`."""
    try:
        return [int(x) for x in pidfile.read_text().split()]
    except OSError:
        return []


def marked(marker: str) -> list[psutil.Process]:
    """The processes whose environment carries MARKER=marker."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(MARKER) == marker:
                found.append(p)
        except psutil.Error:
            continue
    return found


def kill_marked(marker: str) -> list[int]:
    """SIGKILL the marked processes; their pids."""
    procs = marked(marker)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return [p.pid for p in procs]
