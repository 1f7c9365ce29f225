"""A mode's server log copied, scrubbed, into the run folder while the server writes it.

The raw log stays private (only this run reads it); every half second the lines appended since
are masked with the repo's redaction and appended to `--out`/mode-X.log. A doctor killed with
SIGKILL so leaves the log up to its last half second; the mode's end replaces the copy with a
whole scrubbed one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from vllm_offload_doctor.redact import MAX_PIECE, line_scrubber

EVERY_S = 0.5
CHUNK = 1 << 20  # bytes read at a time
# A copy this far behind the raw log skips ahead with a marker line: a server flooding its log
# (100 MB/s) outruns any masking, and chasing it kept the doctor busy and the copy never done.
# The mode's end replaces this copy with the whole scrubbed log anyway.
MAX_LAG = 16 << 20


class LogMirror:
    def __init__(self, raw: Path, dest: Path, every_s: float = EVERY_S) -> None:
        self.raw, self.dest, self.every_s = raw, dest, every_s
        self._scrub = line_scrubber()
        self._offset = 0
        self._partial = b""
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one copy at a time: the thread's, or stop()'s last one
        self._thread = threading.Thread(target=self._loop, name="log-mirror", daemon=True)
        self._fd: int | None = None

    def start(self) -> LogMirror:
        from vllm_offload_doctor.compare.artifacts import WriteError, write_error

        try:
            # New file, never through a link planted under its name.
            self._fd = os.open(
                self.dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644
            )
        except FileExistsError:
            raise WriteError(
                f"cannot write {self.dest}: it already exists (a link or another run's log); "
                "give each run its own --out"
            ) from None
        except OSError as exc:
            raise write_error(self.dest, exc) from exc
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.copy()

    def copy(self, final: bool = False) -> None:
        """Append the complete lines written since the last call (all of it when final), up to
        what the log held when the call began: a server that keeps writing is not chased."""
        with self._lock:
            if self._fd is None:
                return
            with contextlib.suppress(OSError), open(self.raw, "rb") as f:  # a full disk: go on
                end = os.fstat(f.fileno()).st_size
                if end < self._offset:  # the server's log was cut (a flood): carry on at its end
                    self._offset, self._partial = end, b""
                if end - self._offset > MAX_LAG:
                    skipped = end - MAX_LAG - self._offset
                    self._offset, self._partial = end - MAX_LAG, b""
                    _write_all(
                        self._fd,
                        f"[offload-doctor: {skipped} bytes of the server's log not copied while it "
                        "ran (it wrote faster than they could be masked)]\n".encode(),
                    )
                f.seek(self._offset)
                while self._offset < end and (data := f.read(min(CHUNK, end - self._offset))):
                    self._offset += len(data)
                    self._lines(data, final=False)
                self._lines(b"", final=final)

    def _lines(self, data: bytes, *, final: bool) -> None:
        assert self._fd is not None
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > MAX_PIECE or (final and self._partial):
            lines.append(self._partial)  # a line that never ends still gets through
            self._partial = b""
        if lines:
            text = "".join(self._scrub(ln.decode("utf-8", "replace")) + "\n" for ln in lines)
            _write_all(self._fd, text.encode("utf-8"))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)  # a copy in progress finishes; stop()'s waits for it
        self.copy(final=True)
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
