"""Clean up after a compare run whose doctor was killed (SIGKILL, the OOM killer).

Two things only a living doctor removes: the private folder of raw, unmasked server logs under
TMPDIR (secrets and all; a later run swept it, if there ever was one) and the --out lock file.
Issue 20 killed compare at random moments and found both left behind.

Started by the doctor as `python -I -S janitor.py PARENT_PID LOCK_FILE RAW_DIR` once the run
folder is claimed. It blocks SIGUSR2 and asks the kernel for it when its parent dies (prctl
PR_SET_PDEATHSIG: delivered even when the parent is SIGKILLed; where prctl is missing, the wait
times out every second), and once it has a new parent it cleans up and exits. On a normal end
the doctor removes both itself and stops this process first (SIGTERM: nothing is touched).

Nothing of another run is touched: the raw folder must carry the dead doctor's pid in its name,
and the lock file goes only when nobody holds its lock and it still names the dead doctor.
Stdlib only, no site-packages (it cannot import the package): it starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
WATCH_S = 1.0
LOCK_TRIES = 40  # x 50 ms
RAW_PREFIX = "offload-doctor-raw-"  # compare/artifacts.RAW_PREFIX (this script imports nothing)


def clean(parent: int, lock: str, raw: str) -> None:
    name = os.path.basename(raw.rstrip(os.sep))
    if name.startswith(f"{RAW_PREFIX}{parent}-") and not os.path.islink(raw):
        shutil.rmtree(raw, ignore_errors=True)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        # Held a moment longer by a child the doctor was forking as it died (the copy of the
        # descriptor goes at its exec); held on: another run has the folder now.
        for _ in range(LOCK_TRIES):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.05)
        else:
            return
        if os.read(fd, 32).strip() == str(parent).encode():
            os.unlink(lock)  # while locked, as the doctor does: a run opening it now retries
    except OSError:
        pass
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    # Exit codes are a shell's (2 usage), not exitcodes': under -I -S this script cannot import
    # the package.
    if len(argv) != 3 or not argv[0].isdigit():
        sys.stderr.write("usage: janitor.py PARENT_PID LOCK_FILE RAW_DIR\n")
        return 2
    parent, lock, raw = int(argv[0]), argv[1], argv[2]
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGUSR2, 0, 0, 0)
    # The parent may have died before prctl took effect; and the signal also comes when the
    # thread that started us ends, so only a new parent (we were re-parented) means death.
    while os.getppid() == parent:
        signal.sigtimedwait({signal.SIGUSR2}, WATCH_S)
    clean(parent, lock, raw)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
