"""Read log inputs as bounded blocks of bytes: files, directories, stdin, compressed logs.

Memory stays bounded whatever the input: blocks are a few MiB, and a line longer
than MAX_LINE is cut into pieces rather than held whole. Time stays bounded too: a
compressed input (gzip, bzip2, xz; zstd where Python has it) is decompressed up to a cap
on size and on ratio (a decompression bomb stops early, with a note, and what was read
still gives a verdict). Text comes out as UTF-8: UTF-16/32 logs (by BOM, or UTF-16 by
its zero bytes) are transcoded, a UTF-8 BOM and a run of leading NUL bytes (a log
truncated while written, e.g. by copytruncate) are skipped.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import importlib.util
import io
import lzma
import os
import re
import stat
import sys
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from vllm_offload_doctor.analyze.reports import is_doctor_output
from vllm_offload_doctor.errors import InputError
from vllm_offload_doctor.redact import scrub_text

BLOCK = 4 << 20
MAX_LINE = 256 << 10


def _has_zstd() -> bool:
    try:
        return importlib.util.find_spec("compression.zstd") is not None  # Python 3.14+
    except ImportError:
        return False


# What a directory gives: a folder is never walked into a log this Python cannot read.
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", *((".zst",) if _has_zstd() else ()))
LOG_SUFFIXES = (".log", ".txt", ".out", ".err", *COMPRESSED_SUFFIXES)
FOLDER_GLOBS = ", ".join(f"*{s}" for s in LOG_SUFFIXES)
GZIP_MAGIC = b"\x1f\x8b"
BZ2_MAGIC = b"BZh"
XZ_MAGIC = b"\xfd7zXZ\x00"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# Decompressed bytes read from one compressed input unless --max-bytes says otherwise.
DEFAULT_MAX_BYTES = 1 << 30
# Past RATIO_AFTER decompressed bytes, a ratio above MAX_RATIO stops reading: real vLLM logs
# compress 5-50x, a bomb ~1000x. An explicit --max-bytes lifts the ratio check.
MAX_RATIO = 200
RATIO_AFTER = 16 << 20
_HEAD = 4096  # bytes looked at to tell an encoding
_PROBE = 64 << 10  # the tail read_lines looks at for a line end


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
                p
                for p in path.rglob("*")
                if p.is_file() and p.name.lower().endswith(LOG_SUFFIXES) and not doctor_artifact(p)
            )
            if not found:
                errors.append(f"{arg}: directory holds no log files ({FOLDER_GLOBS})")
            sources.extend(Source(str(p), p) for p in found)
        elif not path.exists():
            errors.append(f"{arg}: no such file")
        elif not path.is_file():
            errors.append(f"{arg}: not a regular file")
        else:
            sources.append(Source(arg, path))
    return sources, errors


DOCTOR_FILES = ("report.md", "report.json", "commands.txt")  # what `compare --out` writes
_ARTIFACT_HEAD = 8192


def doctor_artifact(path: Path) -> bool:
    """A file offload-doctor wrote (compare's artifacts, saved check/compare/analyze output): a
    directory walk skips it rather than calling it an unknown log. Compressed files are logs."""
    if path.name in DOCTOR_FILES:
        return True
    if path.name.lower().endswith((".gz", ".bz2", ".xz", ".zst")):
        return False
    try:
        with path.open("rb") as fh:
            head = fh.read(_ARTIFACT_HEAD).decode("utf-8", "replace")
    except OSError:
        return False
    lines = [ln for ln in head.splitlines()[:60] if ln.strip()][:40]
    shaped = sum(1 for ln in lines if is_doctor_output(ln))
    return shaped >= 2 and shaped * 3 >= len(lines)


def open_source(source: Source, max_bytes: int | None = None) -> BinaryIO:
    """Open a source for binary reading: decompressed, transcoded to UTF-8, leading NULs skipped.

    `max_bytes` caps the decompressed size of a compressed input (None: DEFAULT_MAX_BYTES and
    the ratio check; 0: no cap at all).
    """
    if source.path is None:
        raw: BinaryIO = sys.stdin.buffer
    else:
        raw = _open_regular(source)
        _skip_hole(raw)
    try:
        head = _peek(raw, 6)
        stream: Any = raw
        if head.startswith((GZIP_MAGIC, BZ2_MAGIC, XZ_MAGIC, ZSTD_MAGIC)):
            stream = _Decompressed(raw, head, source.name, max_bytes, own=source.path is not None)
        elif source.path is None:
            # A pipe has no size to check first (`< /dev/zero` never ends): stdin stops at the cap.
            stream = _Capped(raw, DEFAULT_MAX_BYTES if max_bytes is None else max_bytes)
        return _text(stream, source.name)  # type: ignore[no-any-return]
    except BaseException:
        if source.path is not None:
            raw.close()
        raise


def _open_regular(source: Source) -> BinaryIO:
    """Open a regular file, checked on the descriptor: a path swapped for a FIFO or a device
    after resolve_inputs looked at it is refused, never waited on or read forever."""
    assert source.path is not None
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(source.path, flags)
    except PermissionError as exc:
        raise InputError(f"{source.name}: permission denied") from exc
    except OSError as exc:
        raise InputError(f"{source.name}: cannot open ({exc.strerror})") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{source.name}: not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _skip_hole(raw: BinaryIO) -> None:
    """Seek past a leading hole (a sparse run of NULs) without reading it.

    Runs on a file just opened, before any buffered read: the seek is then a real one.
    """
    try:
        start = os.lseek(raw.fileno(), 0, os.SEEK_DATA)
    except (OSError, AttributeError, ValueError):
        start = 0  # no SEEK_DATA here, or all hole: NULs are skipped by reading
    raw.seek(start)


def _peek(stream: BinaryIO, n: int) -> bytes:
    if isinstance(stream, io.BufferedReader):
        return stream.peek(n)[:n]
    if stream.seekable():
        pos = stream.tell()
        data = stream.read(n)
        stream.seek(pos)
        return data
    return b""


class _Counting(io.RawIOBase):
    """The compressed file, counting the bytes the decompressor took (for the ratio)."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.raw.read(len(buffer))
        buffer[: len(data)] = data
        self.count += len(data)
        return len(data)


class _Capped:
    """Standard input read up to `cap` bytes (0: no cap); past it, what was read is analysed."""

    def __init__(self, raw: BinaryIO, cap: int) -> None:
        self.raw, self.cap, self.count = raw, cap, 0
        self.stop: str | None = None

    def read1(self, n: int = -1) -> bytes:
        if self.stop:
            raise InputStopped(self.stop)
        n = BLOCK if n < 0 else n
        if self.cap:
            n = min(n, self.cap - self.count)
        data = _read1(self.raw, n) if n > 0 else b""
        self.count += len(data)
        if self.cap and self.count >= self.cap:
            self.stop = (
                f"stopped reading stdin after {human(self.count)} (the cap of {human(self.cap)}); "
                "the verdict covers what was read, --max-bytes SIZE reads further"
            )
            if not data:
                raise InputStopped(self.stop)
        return data

    read = read1

    def close(self) -> None:
        self.raw.close()


class _Decompressed:
    """A decompressed stream that stops at a size cap and, by default, at a ratio cap."""

    def __init__(
        self, raw: BinaryIO, head: bytes, name: str, max_bytes: int | None, *, own: bool
    ) -> None:
        self.raw, self.own = raw, own
        self.counted = _Counting(raw)
        self.cap = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
        self.check_ratio = max_bytes is None
        self.out = 0
        self.stop: str | None = None
        self.dec: Any
        counted: Any = (
            self.counted
        )  # a readable file object; typeshed's overloads differ by version
        if head.startswith(GZIP_MAGIC):
            self.dec = gzip.GzipFile(fileobj=counted, mode="rb")
        elif head.startswith(BZ2_MAGIC):
            self.dec = bz2.BZ2File(counted)
        elif head.startswith(XZ_MAGIC):
            self.dec = lzma.LZMAFile(counted)  # noqa: SIM115, RUF100
        else:
            try:
                from compression import zstd  # type: ignore[import-not-found]  # Python 3.14+
            except ImportError:
                raise InputError(
                    f"{name}: zstd-compressed; decompress it first (zstd -d {name})"
                ) from None
            self.dec = zstd.ZstdFile(self.counted)

    def read1(self, n: int = -1) -> bytes:
        if self.stop:
            raise InputStopped(self.stop)
        if n < 0:
            n = BLOCK
        if self.cap:
            n = min(n, self.cap - self.out)
        data: bytes = self.dec.read1(n) if n > 0 else b""
        self.out += len(data)
        why = ""
        if self.cap and self.out >= self.cap:
            why = f"the cap of {human(self.cap)}"
        elif (
            self.check_ratio
            and self.out > RATIO_AFTER
            and self.out > MAX_RATIO * max(1, self.counted.count)
        ):
            why = f"it expands over {MAX_RATIO}:1, like a decompression bomb"
        if why and not self.stop:
            self.stop = (
                f"stopped reading after {human(self.out)} decompressed from "
                f"{human(self.counted.count)} ({why}); the verdict covers what was read, "
                "--max-bytes SIZE reads further"
            )
        if self.stop and not data:
            raise InputStopped(self.stop)
        return data

    read = read1

    def close(self) -> None:
        try:
            self.dec.close()
        finally:
            if self.own:
                self.raw.close()


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),  # before UTF-16 LE: it starts with the same two bytes
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
    (codecs.BOM_UTF8, "utf-8"),
)


class _Text:
    """UTF-8 bytes from a stream in another encoding, or with junk before its text."""

    def __init__(
        self, stream: Any, head: bytes, encoding: str | None, failed: Exception | None = None
    ) -> None:
        self.stream = stream
        self.head = head
        self.failed = failed  # raised once the head is given out
        self.decoder = (
            codecs.getincrementaldecoder(encoding)(errors="replace") if encoding else None
        )
        self.done = False

    def read1(self, n: int = -1) -> bytes:
        while not self.done:
            if self.head:
                data, self.head = self.head, b""
            elif self.failed is not None:
                failed, self.failed = self.failed, None
                raise failed
            else:
                data = _read1(self.stream, n if n > 0 else BLOCK)
            if self.decoder is None:
                if not data:
                    self.done = True
                return data
            text = self.decoder.decode(data, final=not data)
            if not data:
                self.done = True
            if text:
                return text.encode("utf-8", "replace")
        return b""

    read = read1

    def read_lines(self, n: int) -> bytes:
        """read1's bytes, ending at a line's end where a plain file allows: iter_blocks then
        yields the read as it is, with no copy to join a line cut in two (a looked-at tail
        tells where the last line end of the next n bytes is). read1's otherwise."""
        fd = self._fd()
        if fd is None or n <= _PROBE or self.head or self.failed is not None:
            return self.read1(n)
        try:
            at = self.stream.tell()
            tail = os.pread(fd, _PROBE, at + n - _PROBE)
        except OSError:  # read1 meets it too, and says what it is
            return self.read1(n)
        end = tail.rfind(b"\n")
        return self.read1(n - _PROBE + end + 1 if end >= 0 else n)

    def _fd(self) -> int | None:
        """The descriptor of a regular file read as it is (no decoder, no decompression), where
        the platform has pread (Windows does not)."""
        if self.decoder is not None or not isinstance(self.stream, io.BufferedReader):
            return None
        if not hasattr(os, "pread"):
            return None
        try:
            return self.stream.fileno()
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        self.stream.close()


def _read1(stream: Any, n: int) -> bytes:
    read = getattr(stream, "read1", None) or stream.read
    return bytes(read(n))


def _utf16_without_bom(head: bytes) -> str | None:
    """`L\0O\0G\0`: UTF-16 LE text; `\0L\0O\0G`: BE (ASCII-range text, as logs are)."""
    sample = head[: len(head) // 2 * 2][:512]
    if len(sample) < 16:
        return None
    even, odd = sample[0::2], sample[1::2]
    if odd.count(0) >= 0.9 * len(odd) and even.count(0) == 0:
        return "utf-16-le"
    if even.count(0) >= 0.9 * len(even) and odd.count(0) == 0:
        return "utf-16-be"
    return None


MAX_NUL_RUN = (
    64 << 20
)  # leading NUL bytes skipped (a truncated log's hole) before calling it binary


def _text(stream: Any, name: str = "input") -> Any:
    """Wrap `stream` so that it yields UTF-8 text bytes (see the module docstring)."""
    head = b""
    skipped = 0
    failed: Exception | None = None  # a stream cut short within its head: keep what came
    try:
        while len(head) < _HEAD:
            data = _read1(stream, _HEAD - len(head))
            if not data:
                break
            head += data
        for bom, encoding in _BOMS:
            if head.startswith(bom):
                plain = encoding == "utf-8"
                return _Text(stream, head[len(bom) :], None if plain else encoding)
        utf16 = _utf16_without_bom(head)
        if utf16:
            return _Text(stream, head, utf16)
        if head.startswith(b"\x00"):
            skipped = len(head)
            head = head.lstrip(b"\x00")
            while not head:  # a long NUL run: read on, holding one block at most
                if skipped >= MAX_NUL_RUN:
                    raise InputError(
                        f"{name}: binary input ({human(skipped)} of NUL bytes), not a log"
                    )
                data = _read1(stream, BLOCK)
                if not data:
                    break
                skipped += len(data)
                head = data.lstrip(b"\x00")
    except (EOFError, zlib.error, lzma.LZMAError, OSError, TruncatedInput) as exc:
        if skipped and not head:
            raise InputError(
                f"{name}: binary input ({human(skipped)} of NUL bytes), not a log"
            ) from exc
        failed = exc
    return _Text(stream, head, None, failed)


class TruncatedInput(Exception):
    """The stream ended early (e.g. truncated gzip); what was read is still valid."""


class InputStopped(TruncatedInput):
    """Reading stopped at a cap (decompressed size or ratio); what was read is still valid."""


def _read_chunks(stream: BinaryIO) -> Iterator[bytes]:
    """Yield raw chunks of about BLOCK bytes.

    `read1` keeps what a truncated gzip stream decompressed before it ended: a plain
    `read(BLOCK)` loses the whole partial block when the decoder raises.
    """
    read = getattr(stream, "read_lines", None) or getattr(stream, "read1", None) or stream.read
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
                if size > BLOCK - _PROBE and piece.endswith(b"\n"):
                    break  # read_lines' block: whole lines, taken as it is
        except (EOFError, zlib.error, lzma.LZMAError, OSError, TruncatedInput) as exc:
            # OSError: gzip.BadGzipFile, bz2's "Invalid data stream", a read error.
            if parts:
                yield b"".join(parts)
            if isinstance(exc, TruncatedInput):
                raise
            raise TruncatedInput(str(exc) or "unexpected end of compressed data") from exc
        if not parts:
            return
        yield parts[0] if len(parts) == 1 else b"".join(parts)


SOFT_CUT = 4096  # how far back a forced cut looks for a blank


def _soft_cut(data: bytes, pos: int) -> int:
    """Where a line longer than MAX_LINE is cut: after the last blank of its last SOFT_CUT
    bytes where masking each piece alone hides what masking them together does (masking runs
    on each piece: `password:` at the end of one and the bare value at the start of the next
    would hide nothing); at MAX_LINE when there is no blank."""
    end = pos + MAX_LINE
    lo = end - SOFT_CUT
    first = -1
    at = end
    for _ in range(_CUT_TRIES):
        blank = max(data.rfind(b" ", lo, at), data.rfind(b"\t", lo, at))
        if blank < 0:
            break
        if first < 0:
            first = blank
        if _masks_alike(data, blank + 1):
            return blank + 1
        at = blank
    return first + 1 if first >= 0 else end


_AROUND = 1024  # bytes either side of a cut that its masking is compared on (a secret's reach)
_CUT_TRIES = 32  # blanks tried; then the last one (a line crowded with secrets is masked whole)


def _masks_alike(data: bytes, cut: int) -> bool:
    """Whether the bytes around `cut`, masked as two pieces, keep no word that masking them as
    one hides (a mask may differ in shape: a multi-valued flag's sweep over plain words)."""
    before = data[max(0, cut - _AROUND) : cut].decode("utf-8", "replace")
    after = data[cut : cut + _AROUND].decode("utf-8", "replace")
    kept = _secretish(scrub_text(before)) + _secretish(scrub_text(after))
    return not kept - _secretish(scrub_text(before + after))


_WORD = re.compile(r"[^\s'\"`()\[\]{},;*]{8,}")


def _secretish(text: str) -> Counter[str]:
    """The words of `text` that could be a secret's (8+ characters, a digit or both cases)."""
    return Counter(
        w
        for w in _WORD.findall(text)
        if any(c.isdigit() for c in w) or (w.lower() != w and w.upper() != w)
    )


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
        pos = _soft_cut(data, pos)
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
        # One copy a block: the carried partial line joined to the chunk up to its last newline.
        cut = chunk.rfind(b"\n") + 1
        if not cut:
            carry += chunk
        elif not carry and cut == len(chunk):
            yield _bound_lines(chunk)
        else:
            yield _bound_lines(b"".join((carry, memoryview(chunk)[:cut])))
            carry = chunk[cut:]
        while len(carry) >= MAX_LINE:
            # No newline for a long stretch: a pasted log with its line breaks lost, or junk.
            cut = _soft_cut(carry, 0)
            yield carry[:cut] + b"\n"
            carry = carry[cut:]
    if carry:
        yield carry + b"\n"


_WIDE = 64 << 10  # a span newlines counts with replace


def newlines(data: bytes, lo: int, hi: int) -> int:
    """data.count(b"\n", lo, hi), at nearly twice the speed on a wide span: count tests every
    byte, replace finds each line end with memchr (a log's lines are 100-200 bytes apart)."""
    if hi - lo < _WIDE:
        return data.count(b"\n", lo, hi)
    part = data if lo == 0 and hi == len(data) else data[lo:hi]
    return len(part) - len(part.replace(b"\n", b""))


NUL_HOLE = re.compile(rb"\x00{16,}")


# Bytes a text log holds: tab, newline, CR, form feed, ESC, printable ASCII, and UTF-8's upper half.
_TEXT_BYTES = bytes([9, 10, 13, 12, 27, *range(32, 127), *range(128, 256)])


def looks_binary(sample: bytes) -> bool:
    """NUL bytes or mostly non-text bytes in the first block: not a log."""
    if not sample:
        return False
    window = sample[:8192]
    if b"\x00" in window:
        # A run of NULs is a hole two writers left in a text file (runs.py); lone NULs are not.
        window = NUL_HOLE.sub(b"", window)
        if b"\x00" in window or not window:
            return True
    other = len(window.translate(None, _TEXT_BYTES))  # in C: the bytes that are not text
    return (len(window) - other) / len(window) < 0.85
