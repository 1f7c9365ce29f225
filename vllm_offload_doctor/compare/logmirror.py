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


class LogMirror:
    def __init__(self, raw: Path, dest: Path, every_s: float = EVERY_S) -> None:
        self.raw, self.dest, self.every_s = raw, dest, every_s
        self._scrub = line_scrubber()
        self._offset = 0
        self._partial = b""
        self._stop = threading.Event()
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
        """Append the complete lines written since the last call (all of it when final)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError), open(self.raw, "rb") as f:  # a full disk: go on
            f.seek(self._offset)
            while data := f.read(CHUNK):  # memory bounded however fast the server writes
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
            self._thread.join(timeout=5)
        self.copy(final=True)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
