"""Hostile and odd encodings of logs: decompression bombs, UTF-16/32, leading NUL bytes.

Every one ends in a verdict (with a note where reading stopped) or a one-line error, exit 2.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import json
import lzma
import os
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from test_inputs import OOM_LOG, category, one_line_error, run

from vllm_offload_doctor.analyze import logread
from vllm_offload_doctor.errors import InputError

FILLER = b"INFO 11-24 14:38:00 [metrics.py:1] idle; nothing to report on this line\n"
MiB = 1 << 20


def _gzip() -> Callable[[bytes], bytes]:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    return lambda data: c.compress(data) if data else c.flush()


def _bz2() -> Callable[[bytes], bytes]:
    c = bz2.BZ2Compressor(9)
    return lambda data: c.compress(data) if data else c.flush()


def _xz() -> Callable[[bytes], bytes]:
    c = lzma.LZMACompressor()
    return lambda data: c.compress(data) if data else c.flush()


COMPRESSORS = {"gz": _gzip, "bz2": _bz2, "xz": _xz}


def write_bomb(path: Path, kind: str, mib: int) -> int:
    """An OOM log then `mib` MiB of filler, compressed a MiB at a time; returns the lines."""
    compress = COMPRESSORS[kind]()
    chunk = FILLER * (MiB // len(FILLER))
    with path.open("wb") as f:
        f.write(compress(OOM_LOG.encode()))
        for _ in range(mib):
            f.write(compress(chunk))
        f.write(compress(b""))
    return OOM_LOG.count("\n") + mib * chunk.count(b"\n")


@pytest.mark.parametrize("kind", sorted(COMPRESSORS))
def test_compressed_log_same_verdict_as_plain(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"oom.log.{kind}"
    compress = COMPRESSORS[kind]()
    path.write_bytes(compress(OOM_LOG.encode()) + compress(b""))
    proc = run("--format", "jsonl", str(path))
    assert proc.returncode == 1 and category(proc).startswith("oom_")
    assert json.loads(proc.stdout)["error"] is None


@pytest.mark.parametrize("kind", sorted(COMPRESSORS))
def test_decompression_bomb_stops_with_a_note_and_keeps_the_verdict(
    tmp_path: Path, kind: str
) -> None:
    bomb = tmp_path / f"bomb.log.{kind}"
    total = write_bomb(bomb, kind, 40)
    assert bomb.stat().st_size * logread.MAX_RATIO < 40 * MiB  # a real bomb: past the ratio
    proc = run("--format", "jsonl", str(bomb))
    assert proc.returncode == 1, proc.stderr
    obj = json.loads(proc.stdout)
    assert obj["verdict"]["category"].startswith("oom_")  # what was read still counts
    assert "decompression bomb" in obj["error"] and "--max-bytes" in obj["error"]
    assert 0 < obj["lines_read"] < total


def test_max_bytes_raises_the_cap_and_lowers_it(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.log.gz"
    total = write_bomb(bomb, "gz", 24)
    whole = json.loads(run("--format", "jsonl", "--max-bytes", "64M", str(bomb)).stdout)
    assert whole["error"] is None and whole["lines_read"] == total
    proc = run("--max-bytes", "1M", str(bomb))
    assert proc.returncode == 1
    text = " ".join(proc.stdout.decode().split())  # the note wraps at 80 columns
    assert "note:" in text and "stopped reading after 1 MiB" in text and "cap of 1 MiB" in text


def test_bomb_on_stdin_stops_too(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.gz"
    write_bomb(bomb, "gz", 24)
    proc = run("--format", "jsonl", "-", stdin=bomb.read_bytes())
    assert proc.returncode == 1
    assert "stopped reading" in json.loads(proc.stdout)["error"]


@pytest.mark.parametrize("value", ["12Q", "-5M", "lots"])
def test_bad_max_bytes_is_a_usage_error(tmp_path: Path, value: str) -> None:
    proc = run("--max-bytes", value, str(tmp_path / "x.log"))
    assert proc.returncode == 2
    assert b"--max-bytes" in proc.stderr


def test_zstd_without_support_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "oom.log.zst"
    path.write_bytes(logread.ZSTD_MAGIC + b"\x00" * 64)
    proc = run(str(path))
    try:
        from compression import zstd  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        assert proc.returncode == 2
        one_line_error(proc, "oom.log.zst", "zstd -d")
    else:
        assert proc.returncode in (0, 1, 2)  # Python 3.14 reads it (or finds it corrupt)


@pytest.mark.parametrize("kind", sorted(COMPRESSORS))
def test_compressed_stream_cut_in_its_first_bytes(tmp_path: Path, kind: str) -> None:
    compress = COMPRESSORS[kind]()
    packed = compress(OOM_LOG.encode() * 20) + compress(b"")
    path = tmp_path / f"cut.log.{kind}"
    path.write_bytes(packed[:40])
    proc = run(str(path))  # a verdict on what came through, or a one-line error
    assert proc.returncode in (0, 1, 2)
    if proc.returncode == 2:
        one_line_error(proc, "cut.log")


# -- encodings ---------------------------------------------------------------------------
ENCODED: dict[str, Callable[[str], bytes]] = {
    "utf-16 BOM LE": lambda t: codecs.BOM_UTF16_LE + t.encode("utf-16-le"),
    "utf-16 BOM BE": lambda t: codecs.BOM_UTF16_BE + t.encode("utf-16-be"),
    "utf-16 LE, no BOM": lambda t: t.encode("utf-16-le"),
    "utf-16 BE, no BOM": lambda t: t.encode("utf-16-be"),
    "utf-32 BOM LE": lambda t: t.encode("utf-32"),
    "utf-8 BOM": lambda t: codecs.BOM_UTF8 + t.encode(),
    "CRLF utf-16 (PowerShell > file)": lambda t: t.replace("\n", "\r\n").encode("utf-16"),
    "leading NULs": lambda t: b"\x00" * 3000 + t.encode(),
    "NULs past the first block": lambda t: b"\x00" * (logread.BLOCK + 12345) + t.encode(),
    "gzip of utf-16": lambda t: gzip.compress(t.encode("utf-16")),
}


@pytest.mark.parametrize("name", list(ENCODED))
def test_encoded_log_same_verdict_as_plain(tmp_path: Path, name: str) -> None:
    path = tmp_path / "oom.log"
    path.write_bytes(ENCODED[name](OOM_LOG))
    proc = run("--format", "jsonl", str(path))
    assert proc.returncode == 1, proc.stderr
    obj = json.loads(proc.stdout)
    assert obj["verdict"]["category"].startswith("oom_")
    assert obj["facts"]["vllm_version"] == "0.6.3"  # the first line was read whole


def test_sparse_nul_prefix_is_skipped(tmp_path: Path) -> None:
    # A log cut by copytruncate while vLLM kept writing at its old offset: a hole, then text.
    path = tmp_path / "oom.log"
    with path.open("wb") as f:
        f.truncate(256 * MiB)
        f.seek(256 * MiB)
        f.write(OOM_LOG.encode())
    proc = run("--format", "jsonl", str(path))
    assert proc.returncode == 1 and category(proc).startswith("oom_")


def test_only_nuls_is_an_empty_log(tmp_path: Path) -> None:
    path = tmp_path / "zeros.log"
    path.write_bytes(b"\x00" * 10_000)
    proc = run(str(path))
    assert proc.returncode == 2
    one_line_error(proc, "zeros.log", "empty")


def test_real_binary_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "core.log"
    path.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 64)
    proc = run(str(path))
    assert proc.returncode == 2
    one_line_error(proc, "binary")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_path_swapped_for_a_fifo_or_device_after_the_check_is_refused(tmp_path: Path) -> None:
    # resolve_inputs saw a regular file; by the time it is opened it is a FIFO or /dev/zero.
    fifo = tmp_path / "swapped.log"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.log"
    zero.symlink_to("/dev/zero")
    for path in (fifo, zero):
        with pytest.raises(InputError, match="not a regular file"):
            logread.open_source(logread.Source(path.name, path))
