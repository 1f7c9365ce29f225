"""A log as a crash-looping pod prints it, for the tests that hold the fast paths to feeding."""

from __future__ import annotations

import re

_PID = re.compile(r"pid=(\d+)")
_TIME = re.compile(r"(\d\d-\d\d \d\d:\d\d):(\d\d)")


def crash_loop(text: str, restarts: int) -> list[str]:
    """`text` `restarts` times, every restart with other pids and times."""
    out: list[str] = []
    for r in range(restarts):
        block = _PID.sub(lambda m, r=r: f"pid={int(m.group(1)) + 7 * r}", text)
        block = _TIME.sub(lambda m, r=r: f"{m.group(1)}:{(int(m.group(2)) + r) % 60:02d}", block)
        out += block.rstrip("\n").split("\n")
    return out
