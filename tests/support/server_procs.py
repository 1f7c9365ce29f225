"""Process and port helpers the compare tests that start servers share."""

from __future__ import annotations

import socket
from pathlib import Path


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
