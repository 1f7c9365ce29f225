"""The startup phase of `vllm serve`, read live from its log, and a one-line progress display."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TextIO

from vllm_offload_doctor.analyze.facts import PHASE_TABLE
from vllm_offload_doctor.analyze.normalize import parse
from vllm_offload_doctor.analyze.patterns import MAX_TEXT
from vllm_offload_doctor.analyze.verdict import FATAL_HINT

# A start failed: analyze's fatal wrappers, or an exception line (a traceback's last line).
_EXCEPTION_LINE = re.compile(r"^(?:\(\S+ pid=\d+\) )?\w*(?:Error|Exception): ")
# Display names in start-up order, from the phase table analyze uses too.
PHASES = tuple(dict.fromkeys(name for _, name, _ in PHASE_TABLE))
_ORDER = {name: i for i, name in enumerate(PHASES)}


def phase_of(line: str, current: str) -> str:
    """The phase after seeing `line` (never goes backwards, except to `failed`)."""
    line = line[:MAX_TEXT]
    if FATAL_HINT.search(line) or _EXCEPTION_LINE.search(line):
        return "failed"
    if current == "failed":
        return current
    msg = parse(0, line).msg
    for _, name, rx in reversed(PHASE_TABLE):
        if rx.search(msg):
            return name if _ORDER[name] >= _ORDER.get(current, 0) else current
    return current


# A poll reads at most this much. A server flooding its log (100 MB/s) is skipped ahead to its
# latest lines, which say the phase: reading all of it held hundreds of MB (issue 20).
MAX_POLL_BYTES = 4 << 20


class LogFollower:
    """Reads what was appended to a log since the last call and tracks the phase."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.phase = "launching"

    def poll(self) -> str:
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size - self.offset > MAX_POLL_BYTES or size < self.offset:  # behind, or cut
                    self.offset, self.partial = max(0, size - MAX_POLL_BYTES), b""
                f.seek(self.offset)
                data = f.read(MAX_POLL_BYTES)
        except OSError:
            return self.phase
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        if len(self.partial) > MAX_POLL_BYTES:  # a line that never ends
            self.partial = b""
        for raw in lines:
            for piece in raw.split(b"\r"):  # progress bars rewrite lines with \r
                self.phase = phase_of(piece.decode("utf-8", "replace"), self.phase)
        return self.phase


class Progress:
    """Elapsed time and phase on stderr: rewritten in place on a TTY, one line per change else."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.last_phase: str | None = None
        self.last_len = 0

    def update(self, elapsed_s: float, phase: str) -> None:
        self.rewrite(f"{elapsed_s:6.1f} s  {phase}", final=phase != self.last_phase)
        self.last_phase = phase

    def rewrite(self, message: str, *, final: bool) -> None:
        """Rewritten in place on a TTY; elsewhere written only when `final` (one line each)."""
        text = f"[{self.label}] {message}"
        if self.tty:
            pad = " " * max(0, self.last_len - len(text))
            self.stream.write(f"\r{text}{pad}")
            self.last_len = len(text)
            self.stream.flush()
        elif final:
            self.stream.write(text + "\n")
            self.stream.flush()

    def line(self, message: str) -> None:
        """A permanent line (ends the in-place one first)."""
        self.done()
        self.stream.write(f"[{self.label}] {message}\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty and self.last_len:
            self.stream.write("\n")
            self.stream.flush()
            self.last_len = 0


class RequestProgress:
    """Request k of n, tokens so far and the running median, for `measure`'s callback."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tokens = 0
        self.latencies: list[float] = []

    def __call__(self, warmup: bool, k: int, n: int, result: object | None) -> None:
        import statistics

        what = f"warm-up {k}/{n}" if warmup else f"request {k}/{n}"
        if result is None:
            self.progress.rewrite(f"{what} ...{self._so_far()}", final=False)
            return
        ok = bool(getattr(result, "ok", False))
        if not warmup:
            self.tokens += int(getattr(result, "completion_tokens", None) or 0)
            if ok:
                self.latencies.append(float(getattr(result, "latency_s", 0.0)))
        took = f"{getattr(result, 'latency_s', 0.0):.2f} s" if ok else "failed"
        median = f", median {statistics.median(self.latencies):.2f} s" if self.latencies else ""
        self.progress.rewrite(f"{what}: {took}{self._so_far()}{median}", final=True)

    def _so_far(self) -> str:
        return f", {self.tokens} tokens so far" if self.tokens else ""
