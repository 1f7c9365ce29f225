"""Run a server command so that it dies with offload-doctor, however offload-doctor dies.

Started as `python -I -S guard.py PARENT_PID [--cgroup DIR] -- argv...` in a new session (this
process leads the server's process group). It asks the kernel for SIGUSR2 when its parent dies
(prctl PR_SET_PDEATHSIG: delivered even when the parent is SIGKILLed), starts the server as its
child in the same group, and on that signal takes the whole group down (SIGTERM, then SIGKILL).
Why a wrapper instead of `preexec_fn`: preexec_fn is unsafe when the parent has threads, and a
parent-death signal on the server itself would not reach its own children (EngineCore,
workers); the group kill does. Where prctl is missing, a watchdog notices the new parent within
a second. It is a child subreaper (PR_SET_CHILD_SUBREAPER): a descendant whose parent exits (a
double fork) is re-parented to it instead of init, so parentage still finds it. Every second it
records the server's descendants, so one that left the group with setsid is taken down too (when
the doctor dies, and when the server exits). With `--cgroup DIR` (a fresh cgroup v2 the doctor
made) it moves itself there before starting the server, and on the doctor's death kills the
whole cgroup (cgroup.kill) and removes it. Stdlib only, no site-packages: it starts in
milliseconds.
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
PR_SET_CHILD_SUBREAPER = 36
TERM_WAIT_S = 3.0
WATCH_S = 1.0


# Descendants seen so far, pid -> start time: one that left the group (setsid) is still ours.
_seen: dict[int, bytes] = {}
_server: list[int] = []  # the server's pid, once started: reaped by Popen, never here
_cgroup: list[str] = []  # the cgroup this process moved into, if any


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
            elif fields is not None and int(fields[1]) == os.getpid() and int(name) not in _server:
                _reap(int(name))  # an orphan re-parented to us (subreaper) that has exited
    grew = True
    while grew:
        grew = False
        for pid, fields in table.items():
            if pid not in parents and int(fields[1]) in parents:
                parents.add(pid)
                _seen[pid] = fields[19]  # start time: a reused pid is not ours
                grew = True


def _reap(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.waitpid(pid, os.WNOHANG)


def _signal_seen(sig: int) -> bool:
    """Send `sig` to every recorded descendant still alive; whether any was."""
    alive = False
    for pid, start in list(_seen.items()):
        fields = _stat(pid)
        if fields is None or fields[0] == b"Z" or fields[19] != start:
            _seen.pop(pid, None)
            if fields is not None and fields[0] == b"Z" and pid not in _server:
                _reap(pid)
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
    _kill_cgroup()
    os.killpg(pgid, signal.SIGKILL)  # takes this process too


def _kill_cgroup() -> None:
    """Kill everything in our cgroup (whatever left group, session and parentage) and remove it:
    this process first moves back to the parent cgroup, so it lives to do the rmdir."""
    if not _cgroup:
        return
    path = _cgroup[0]
    with contextlib.suppress(OSError):
        _write(os.path.join(os.path.dirname(path), "cgroup.procs"), "0")
        _write(os.path.join(path, "cgroup.kill"), "1")
        deadline = time.monotonic() + TERM_WAIT_S
        while time.monotonic() < deadline:
            with open(os.path.join(path, "cgroup.events")) as f:
                if "populated 0" in f.read():
                    break
            time.sleep(0.05)
        os.rmdir(path)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


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
    parent, rest = int(argv[0]), argv[1:]
    if rest[:1] == ["--cgroup"] and len(rest) > 1:
        # Moved before the server starts: every process it ever forks is born in the cgroup.
        with contextlib.suppress(OSError):
            _write(os.path.join(rest[1], "cgroup.procs"), "0")
            _cgroup.append(rest[1])
        rest = rest[2:]
    sep, cmd = rest[:1], rest[1:]
    # Exit codes are a shell's (2 usage, 127 not run), not exitcodes': under -I -S this script
    # cannot import the package, and the doctor reads only the server's own status through it.
    if sep != ["--"] or not cmd:
        sys.stderr.write("usage: guard.py PARENT_PID [--cgroup DIR] -- command...\n")
        return 2
    signal.signal(signal.SIGUSR2, lambda s, f: _kill_group())
    # Not Linux (no prctl): the doctor's own cleanup still runs on a normal exit.
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGUSR2, 0, 0, 0)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
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
    _server.append(child.pid)
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
    # The server is gone: what it started and left behind (in another session, or orphaned and
    # so re-parented to us) goes with it.
    with contextlib.suppress(OSError):
        _note_descendants()
    if _signal_seen(signal.SIGTERM):
        deadline = time.monotonic() + TERM_WAIT_S / 3
        while time.monotonic() < deadline and _signal_seen(0):
            time.sleep(0.05)
        _signal_seen(signal.SIGKILL)
        time.sleep(0.05)
        _signal_seen(0)  # reaps the orphans just killed
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
