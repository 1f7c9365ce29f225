"""/proc/PID/status, read once for compare's host sampler and inspect: `RssShmem` is where
offloaded weights show (shared, pinned host memory)."""

from __future__ import annotations


def parse_status(text: str) -> dict[str, int]:
    """The `NAME: N kB` lines of /proc/PID/status (and of /proc/meminfo, the same format)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            out[name.strip()] = int(parts[0])
    return out


def read_status(pid: int) -> dict[str, int]:
    """The kB fields of a process's status; raises OSError (gone, another user's, not Linux)."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as fh:
        return parse_status(fh.read())
