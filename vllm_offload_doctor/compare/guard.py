"""Run a server command so that it dies with offload-doctor, however offload-doctor dies.

Started as `python -I -S guard.py PARENT_PID -- argv...` in a new session (this process leads
the server's process group). It asks the kernel for SIGUSR2 when its parent dies
(prctl PR_SET_PDEATHSIG: delivered even when the parent is SIGKILLed), starts the server as its
child in the same group, and on that signal takes the whole group down (SIGTERM, then SIGKILL).
Why a wrapper instead of `preexec_fn`: preexec_fn is unsafe when the parent has threads, and a
parent-death signal on the server itself would not reach its own children (EngineCore,
workers); the group kill does. Where prctl is missing, a watchdog notices the new parent within
a second. Every second it also records the server's descendants by parentage, so one that left
the group with setsid is taken down too (when the doctor dies, and when the server exits).
Stdlib only, no site-packages: it starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
TERM_WAIT_S = 3.0
WATCH_S = 1.0


# Descendants seen so far, pid -> start time: one that left the group (setsid) is still ours.
_seen: dict[int, bytes] = {}


def _stat(pid: int) -> list[bytes] | None:
    """Fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _note_descendants() -> None:
    """Record every live descendant of this process, by parentage (it survives a setsid)."""
    parents = {os.getpid(), *_seen}
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat(int(name))
            if fields is not None and fields[0] != b"Z":
                table[int(name)] = fields
    grew = True
    while grew:
        grew = False
        for pid, fields in table.items():
            if pid not in parents and int(fields[1]) in parents:
                parents.add(pid)
                _seen[pid] = fields[19]  # start time: a reused pid is not ours
                grew = True


def _signal_seen(sig: int) -> bool:
    """Send `sig` to every recorded descendant still alive; whether any was."""
    alive = False
    for pid, start in list(_seen.items()):
        fields = _stat(pid)
        if fields is None or fields[0] == b"Z" or fields[19] != start:
            _seen.pop(pid, None)
            continue
        alive = True
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
    return alive


def _kill_group() -> None:
    pgid = os.getpgrp()
    with contextlib.suppress(OSError):
        _note_descendants()
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGTERM)
    _signal_seen(signal.SIGTERM)
    deadline = time.monotonic() + TERM_WAIT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(-1, os.WNOHANG)
        if not _others_alive(pgid) and not _signal_seen(0):
            break
        time.sleep(0.05)
    _signal_seen(signal.SIGKILL)
    os.killpg(pgid, signal.SIGKILL)  # takes this process too


def _others_alive(pgid: int) -> bool:
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != b"Z" and int(fields[2]) == pgid:
            return True
    return False


def main(argv: list[str]) -> int:
    parent, sep, cmd = int(argv[0]), argv[1], argv[2:]
    if sep != "--" or not cmd:
        sys.stderr.write("usage: guard.py PARENT_PID -- command...\n")
        return 2
    signal.signal(signal.SIGUSR2, lambda s, f: _kill_group())
    # Not Linux (no prctl): the doctor's own cleanup still runs on a normal exit.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGUSR2, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        return 1
    # The group gets SIGINT/SIGTERM from the doctor's stop(); the server handles them, this
    # process only waits for it. Handlers (not SIG_IGN) so the server does not inherit them.
    signal.signal(signal.SIGINT, lambda s, f: None)
    signal.signal(signal.SIGTERM, lambda s, f: None)
    try:
        child = subprocess.Popen(cmd, restore_signals=True)
    except OSError as exc:
        sys.stderr.write(f"offload-doctor: cannot run {cmd[0]!r}: {exc}\n")
        return 127
    while True:
        try:
            rc = child.wait(timeout=WATCH_S)
            break
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                _note_descendants()
            # Watchdog for when the death signal cannot be had (no prctl) or was lost.
            if os.getppid() != parent:
                _kill_group()
        except InterruptedError:
            continue
    # The server is gone: what it started and left behind (in another session) goes with it.
    if _signal_seen(signal.SIGTERM):
        time.sleep(TERM_WAIT_S / 3)
        _signal_seen(signal.SIGKILL)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
