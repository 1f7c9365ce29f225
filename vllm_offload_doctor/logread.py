"""Read log inputs as bounded blocks of bytes: files, directories, stdin, gzip.

Memory stays bounded whatever the input: blocks are a few MiB, and a line longer
than MAX_LINE is cut into pieces rather than held whole.
"""

from __future__ import annotations

import gzip
import io
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from vllm_offload_doctor.errors import InputError

BLOCK = 4 << 20
MAX_LINE = 256 << 10
LOG_SUFFIXES = (".log", ".txt", ".gz", ".out", ".err")
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True, slots=True)
class Source:
    name: str  # as the user gave it (or the path found under a directory)
    path: Path | None  # None for stdin


def resolve_inputs(args: list[str]) -> tuple[list[Source], list[str]]:
    """Expand the command-line inputs; returns the sources and one error line per bad input."""
    sources: list[Source] = []
    errors: list[str] = []
    for arg in args:
        if arg == "-":
            sources.append(Source("-", None))
            continue
        path = Path(arg)
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.is_file() and p.name.lower().endswith(LOG_SUFFIXES)
            )
            if not found:
                errors.append(f"{arg}: directory holds no *.log, *.txt or *.gz files")
            sources.extend(Source(str(p), p) for p in found)
        elif not path.exists():
            errors.append(f"{arg}: no such file")
        elif not path.is_file():
            errors.append(f"{arg}: not a regular file")
        else:
            sources.append(Source(arg, path))
    return sources, errors


def open_source(source: Source) -> BinaryIO:
    """Open a source for binary reading, decompressing gzip transparently."""
    if source.path is None:
        raw: BinaryIO = sys.stdin.buffer
    else:
        try:
            raw = open(source.path, "rb")  # noqa: SIM115 - closed by the caller
        except PermissionError as exc:
            raise InputError(f"{source.name}: permission denied") from exc
        except OSError as exc:
            raise InputError(f"{source.name}: cannot open ({exc.strerror})") from exc
    head = _peek(raw, 2)
    if head == GZIP_MAGIC:
        if source.path is not None:
            # GzipFile(fileobj=...) never closes the file it was given: let gzip own it.
            raw.close()
            return gzip.open(source.path, "rb")  # type: ignore[return-value]
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def _peek(stream: BinaryIO, n: int) -> bytes:
    if isinstance(stream, io.BufferedReader):
        return stream.peek(n)[:n]
    if stream.seekable():
        pos = stream.tell()
        data = stream.read(n)
        stream.seek(pos)
        return data
    return b""


class TruncatedInput(Exception):
    """The stream ended early (e.g. truncated gzip); what was read is still valid."""


def _read_chunks(stream: BinaryIO) -> Iterator[bytes]:
    """Yield raw chunks of about BLOCK bytes.

    `read1` keeps what a truncated gzip stream decompressed before it ended: a plain
    `read(BLOCK)` loses the whole partial block when the decoder raises.
    """
    read = getattr(stream, "read1", None) or stream.read
    while True:
        parts: list[bytes] = []
        size = 0
        try:
            while size < BLOCK:
                piece = read(BLOCK - size)
                if not piece:
                    break
                parts.append(piece)
                size += len(piece)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            if parts:
                yield b"".join(parts)
            raise TruncatedInput(str(exc) or "unexpected end of compressed data") from exc
        if not parts:
            return
        yield parts[0] if len(parts) == 1 else b"".join(parts)


def _bound_lines(data: bytes) -> bytes:
    """Break every line of `data` longer than MAX_LINE (a few rfind calls per block)."""
    if len(data) <= MAX_LINE:
        return data
    pieces: list[bytes] = []
    start = pos = 0
    while len(data) - pos > MAX_LINE:
        nl = data.rfind(b"\n", pos, pos + MAX_LINE)
        if nl >= 0:
            pos = nl + 1
            continue
        pos += MAX_LINE
        pieces += (data[start:pos], b"\n")
        start = pos
    if not pieces:
        return data
    pieces.append(data[start:])
    return b"".join(pieces)


def iter_blocks(stream: BinaryIO) -> Iterator[bytes]:
    """Yield blocks that end on a line boundary; lines longer than MAX_LINE are cut."""
    carry = b""
    chunks = _read_chunks(stream)
    while True:
        try:
            chunk = next(chunks, b"")
        except TruncatedInput:
            if carry:
                yield carry + b"\n"
            raise
        if not chunk:
            break
        data = carry + chunk if carry else chunk
        cut = data.rfind(b"\n") + 1
        carry = data[cut:]
        if cut:
            yield _bound_lines(data[:cut])
        while len(carry) >= MAX_LINE:
            # No newline for a long stretch: a pasted log with its line breaks lost, or junk.
            yield carry[:MAX_LINE] + b"\n"
            carry = carry[MAX_LINE:]
    if carry:
        yield carry + b"\n"


def looks_binary(sample: bytes) -> bool:
    """NUL bytes or mostly non-text bytes in the first block: not a log."""
    if not sample:
        return False
    if b"\x00" in sample[:8192]:
        return True
    window = sample[:8192]
    text_bytes = sum(1 for b in window if b in b"\t\n\r\f\x1b" or 32 <= b < 127 or b >= 128)
    return text_bytes / len(window) < 0.85
