"""Odd inputs to `offload-doctor analyze`: every one ends in a verdict or a one-line error."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from shared_corpus import CORPUS, NOT_FOUND

from vllm_offload_doctor.analyze import logread

OOM_LOG = """\
INFO 11-24 14:37:21 api_server.py:528] vLLM API server version 0.6.3
INFO 11-24 14:37:22 model_runner.py:1056] Starting to load model meta-llama/Llama-3.1-8B...
ERROR 11-24 14:37:40 engine.py:366] CUDA out of memory. Tried to allocate 224.00 MiB. GPU 0 \
has a total capacity of 23.64 GiB of which 25.06 MiB is free.
Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/vllm/worker/model_runner.py", line 1058, in load_model
    self.model = get_model(vllm_config=self.vllm_config)
  File "/usr/lib/python3/site-packages/vllm/model_executor/model_loader/loader.py", line 1, \
in load_weights
    param.data.copy_(loaded_weight)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB. GPU 0 has a total \
capacity of 23.64 GiB of which 25.06 MiB is free.
"""


def run(
    *args: str, stdin: bytes | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "OFFLOAD_DOCTOR_DEBUG"}
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", "analyze", *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )
    assert b"Traceback" not in proc.stderr, proc.stderr.decode(errors="replace")
    return proc


def category(proc: subprocess.CompletedProcess[bytes], index: int = 0) -> str:
    lines = proc.stdout.decode().splitlines()
    return str(json.loads(lines[index])["verdict"]["category"])


def one_line_error(proc: subprocess.CompletedProcess[bytes], *words: str) -> None:
    err = proc.stderr.decode()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("offload-doctor: error: ")
    for word in words:
        assert word in lines[0]


def corpus_log(name: str) -> bytes:
    path = CORPUS / name
    if not path.is_file():
        pytest.skip(NOT_FOUND)
    return path.read_bytes()


@cache
def expected(name: str) -> str:
    """The category the tool gives the untouched corpus log."""
    return category(run("--format", "jsonl", str(CORPUS / name)))


@pytest.fixture
def oom(tmp_path: Path) -> Path:
    path = tmp_path / "oom.log"
    path.write_text(OOM_LOG)
    return path


def test_oom_fixture_is_a_failure(oom: Path) -> None:
    proc = run("--format", "jsonl", str(oom))
    assert proc.returncode == 1
    assert category(proc).startswith("oom_")


# -- unreadable inputs -----------------------------------------------------------------------
def test_missing_file(tmp_path: Path) -> None:
    proc = run(str(tmp_path / "nope.log"))
    assert proc.returncode == 2
    one_line_error(proc, "nope.log", "no such file")


def test_path_through_a_file(oom: Path) -> None:
    proc = run(str(oom / "inner.log"))
    assert proc.returncode == 2
    one_line_error(proc, "inner.log")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_fifo_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    proc = run(str(fifo))
    assert proc.returncode == 2
    one_line_error(proc, "not a regular file")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root can read a mode-000 file")
def test_unreadable_file(oom: Path) -> None:
    oom.chmod(0)
    try:
        proc = run(str(oom))
    finally:
        oom.chmod(0o644)
    assert proc.returncode == 2
    one_line_error(proc, "permission denied")


def test_directory_with_no_logs(tmp_path: Path) -> None:
    (tmp_path / "readme.md").write_text("hello")
    proc = run(str(tmp_path))
    assert proc.returncode == 2
    one_line_error(proc, "holds no log files (*.log")


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "core.log"
    path.write_bytes(bytes(range(256)) * 64)
    proc = run(str(path))
    assert proc.returncode == 2
    one_line_error(proc, "binary")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.log"
    path.write_bytes(b"")
    proc = run(str(path))
    assert proc.returncode == 2
    one_line_error(proc, "empty")


def test_bad_input_does_not_stop_the_batch(tmp_path: Path, oom: Path) -> None:
    (tmp_path / "empty.log").write_bytes(b"")
    proc = run("--format", "jsonl", str(tmp_path / "empty.log"), "missing.log", str(oom))
    assert proc.returncode == 2
    assert category(proc).startswith("oom_")
    assert len(proc.stderr.decode().strip().splitlines()) == 2


# -- size ------------------------------------------------------------------------------------
def test_50mb_single_line_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "one-line.log"
    with path.open("wb") as f:
        for _ in range(50):
            f.write(b"x" * (1 << 20))
        f.write(b" torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    probe = (
        "import resource, subprocess, sys\n"
        "p = subprocess.run([sys.executable, '-m', 'vllm_offload_doctor', 'analyze', "
        "'--format', 'jsonl', sys.argv[1]], capture_output=True, timeout=120)\n"
        "sys.stdout.buffer.write(p.stdout)\n"
        "sys.stderr.buffer.write(p.stderr)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
        "sys.exit(p.returncode)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, timeout=150
    )
    err = proc.stderr.decode().strip().splitlines()
    peak_kib = int(err[-1])
    assert not any("Traceback" in line for line in err)
    assert peak_kib < 150 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB"
    if proc.stdout.strip():
        assert proc.returncode in (0, 1)
        assert category(proc)  # a verdict
    else:
        assert proc.returncode == 2 and len(err) == 2


def test_iter_blocks_cuts_long_lines_and_keeps_bytes() -> None:
    data = b"a\n" + b"x" * (3 * logread.MAX_LINE + 5) + b"\nb\n" + b"y" * (5 * logread.MAX_LINE)
    blocks = list(logread.iter_blocks(io.BytesIO(data)))
    out = b"".join(blocks)
    assert all(block.endswith(b"\n") for block in blocks)
    assert max(len(line) for line in out.split(b"\n")) <= logread.MAX_LINE
    assert out.replace(b"\n", b"") == data.replace(b"\n", b"")


# -- gzip ------------------------------------------------------------------------------------
def test_gzip_same_verdict_as_plain(tmp_path: Path, oom: Path) -> None:
    gz = tmp_path / "oom.log.gz"
    gz.write_bytes(gzip.compress(oom.read_bytes()))
    plain = run("--format", "jsonl", str(oom))
    packed = run("--format", "jsonl", str(gz))
    assert packed.returncode == plain.returncode == 1
    a, b = (json.loads(p.stdout) for p in (plain, packed))
    assert a["verdict"] == b["verdict"]
    assert a["lines_read"] == b["lines_read"]


def test_gzip_without_gz_suffix_is_read(tmp_path: Path, oom: Path) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(gzip.compress(oom.read_bytes()))
    proc = run("--format", "jsonl", str(path))
    assert proc.returncode == 1 and category(proc).startswith("oom_")


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_truncated_gzip_gives_verdict_and_note_or_one_line_error(
    tmp_path: Path, oom: Path, keep: float
) -> None:
    body = "\n".join(
        f"INFO 11-24 14:37:{i % 60:02d} llm_engine.py:1] step {i}" for i in range(3000)
    )
    packed = gzip.compress((body + "\n" + OOM_LOG).encode())
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(packed[: int(len(packed) * keep)])
    proc = run("--format", "jsonl", str(cut), str(oom))
    lines = proc.stdout.decode().splitlines()
    if len(lines) == 2:
        first = json.loads(lines[0])
        assert "ended early" in (first["error"] or "")
        assert first["lines_read"] > 0
        assert proc.returncode in (0, 1)
    else:
        assert proc.returncode == 2
        one_line_error(proc, "cut.log.gz")
    assert category(proc, -1).startswith("oom_")  # the other file is still analysed


def test_truncated_gzip_text_shows_note(tmp_path: Path, oom: Path) -> None:
    packed = gzip.compress(OOM_LOG.encode() * 50)
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(packed[: len(packed) - 10])
    proc = run(str(cut))
    assert proc.returncode == 1
    assert "note:" in proc.stdout.decode()


def test_corrupt_gzip(tmp_path: Path) -> None:
    path = tmp_path / "bad.log.gz"
    path.write_bytes(b"\x1f\x8b" + os.urandom(4000))
    proc = run(str(path))
    assert proc.returncode in (0, 1, 2)
    if proc.returncode == 2:
        one_line_error(proc, "bad.log.gz")


# -- stdin -----------------------------------------------------------------------------------
def test_stdin(oom: Path) -> None:
    proc = run("--format", "jsonl", "-", stdin=oom.read_bytes())
    assert proc.returncode == 1
    obj = json.loads(proc.stdout)
    assert obj["file"] == "-"
    assert obj["verdict"]["category"].startswith("oom_")


def test_stdin_gzip(oom: Path) -> None:
    proc = run("--format", "jsonl", "-", stdin=gzip.compress(oom.read_bytes()))
    assert proc.returncode == 1 and category(proc).startswith("oom_")


def test_empty_stdin() -> None:
    proc = run("-", stdin=b"")
    assert proc.returncode == 2
    one_line_error(proc, "empty")


# -- line endings, colour, collectors --------------------------------------------------------
def transformed(name: str, fn: object, tmp_path: Path) -> subprocess.CompletedProcess[bytes]:
    assert callable(fn)
    lines = corpus_log(name).decode("utf-8", "replace").splitlines()
    path = tmp_path / f"t-{name}"
    path.write_text(fn(lines), encoding="utf-8")
    return run("--format", "jsonl", str(path))


def _crlf(lines: list[str]) -> str:
    return "\r\n".join(lines) + "\r\n"


def _caret_m(lines: list[str]) -> str:
    return "\n".join(line + "^M" for line in lines) + "\n"


def _bare_cr(lines: list[str]) -> str:
    return "\n".join(line + "\r" for line in lines) + "\n"


def _joined(lines: list[str]) -> str:
    return " ".join(lines)


def _real_ansi(lines: list[str]) -> str:
    out = []
    for line in lines:
        for level in ("ERROR", "WARNING", "INFO"):
            line = line.replace(f"{level} ", f"\x1b[1;31m{level}\x1b[0m ", 1)
        out.append(f"\x1b[32m{line}\x1b[0m")
    return "\n".join(out) + "\n"


def _caret_ansi(lines: list[str]) -> str:
    out = []
    for line in lines:
        for level in ("ERROR", "WARNING", "INFO"):
            line = line.replace(f"{level} ", f"^[[31m{level}^[[0m ", 1)
        out.append(line)
    return "\n".join(out) + "\n"


def _ray_repeat(lines: list[str]) -> str:
    return (
        "\n".join(
            f"{line} [repeated 30x across cluster]" if line.strip() else line for line in lines
        )
        + "\n"
    )


def _prefix(prefix: str):  # type: ignore[no-untyped-def]
    def fn(lines: list[str]) -> str:
        return "\n".join(prefix + line for line in lines) + "\n"

    return fn


TRANSFORMS = {
    "crlf": _crlf,
    "caret-M": _caret_m,
    "bare-CR": _bare_cr,
    "real-ansi": _real_ansi,
    "caret-ansi": _caret_ansi,
    "ray-repeat": _ray_repeat,
    "compose": _prefix("vllm-server-1  | "),
    "k8s-timestamps": _prefix("2024-11-24T14:37:21.123456789Z "),
    "k8s-prefix": _prefix("[pod/vllm-0/vllm] "),
    "k8s-cri": _prefix("2024-11-24T14:37:21.123456789Z stdout F "),
    "journald": _prefix("Nov 24 14:37:21 gpu-host vllm[1234]: "),
    "iso": _prefix("2024-11-24 14:37:21,123 "),
}
LOGS = ["A-012.log", "B-005.log", "H-002.log", "H-003.log", "B-021.log"]


@pytest.mark.parametrize("name", LOGS)
@pytest.mark.parametrize("kind", sorted(TRANSFORMS))
def test_collector_and_terminal_noise_keep_the_category(
    tmp_path: Path, name: str, kind: str
) -> None:
    proc = transformed(name, TRANSFORMS[kind], tmp_path)
    want = expected(name)
    assert category(proc) == want
    assert proc.returncode == (0 if want == "healthy" else 1)
    assert "\x1b" not in proc.stdout.decode()
    assert "^[[" not in proc.stdout.decode()


@pytest.mark.parametrize(
    "name",
    ["A-002.log", "A-012.log", "B-005.log", "B-021.log", "H-001.log", "H-002.log", "H-013.log"],
)
def test_paste_with_line_breaks_lost(tmp_path: Path, name: str) -> None:
    proc = transformed(name, _joined, tmp_path)
    assert category(proc) == expected(name)


def test_cr_progress_bar_line(tmp_path: Path, oom: Path) -> None:
    bar = "".join(f"\rLoading safetensors checkpoint shards: {i}% Completed" for i in range(100))
    path = tmp_path / "bar.log"
    path.write_text(bar + "\n" + OOM_LOG)
    proc = run("--format", "jsonl", str(path))
    assert proc.returncode == 1 and category(proc).startswith("oom_")


def test_invalid_utf8_is_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "latin1.log"
    path.write_bytes(OOM_LOG.encode().replace(b"Tried", b"Tri\xe9d\xff"))
    proc = run("--format", "jsonl", str(path))
    assert proc.returncode == 1 and category(proc).startswith("oom_")
