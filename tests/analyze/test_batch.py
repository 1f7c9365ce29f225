"""`analyze --jobs`: a pool of workers gives what one process gives, in input order."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from vllm_offload_doctor import cli
from vllm_offload_doctor.analyze import batch
from vllm_offload_doctor.analyze.logread import Source

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Twenty-odd logs of every kind, one of them gzipped and one that cannot be read."""
    out = tmp_path_factory.mktemp("batch")
    logs = sorted(FIXTURES.rglob("*.log"))
    assert len(logs) >= 5
    for i in range(24):
        src = logs[i % len(logs)]
        shutil.copyfile(src, out / f"{i:02d}-{src.name}")
    (out / "25-packed.log.gz").write_bytes(
        gzip.compress((FIXTURES / "oom-weights-0.25.1.log").read_bytes())
    )
    (out / "26-binary.log").write_bytes(b"\x00\x01\x02" * 4096)
    return out


def run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        cli.main(["analyze", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.mark.parametrize("fmt", ["text", "json", "jsonl", "markdown", "html"])
def test_a_pool_prints_what_one_process_prints(folder, fmt, capsys):
    one = run(capsys, str(folder), "--format", fmt, "--jobs", "1")
    pool = run(capsys, str(folder), "--format", fmt, "--jobs", "3")
    assert one[0] == pool[0] == 2  # the binary file is an input error
    assert pool == one
    assert "26-binary.log" in one[2]
    assert len(one[1]) > 1000


def test_workers_are_sized_to_the_batch():
    files = [Source(f"{i}.log", Path(f"{i}.log")) for i in range(40)]
    assert batch.workers_for(4, files) == 4
    assert batch.workers_for(4, files[:9]) == 2  # a pool is not worth it for a few inputs
    assert batch.workers_for(4, files[:3]) == 1
    assert batch.workers_for(None, files) == min(batch.cpu_count(), 10)
    stdin = [*files, Source("-", None)]
    assert batch.workers_for(4, stdin) == 1  # stdin belongs to this process


def test_jobs_must_be_positive(folder, capsys):
    code, _, err = run(capsys, str(folder), "--jobs", "0")
    assert code == 2 and "--jobs" in err


def test_ctrl_c_stops_the_pool_cleanly(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    import psutil

    log = (FIXTURES / "oom-weights-0.25.1.log").read_bytes()
    for i in range(3000):
        (tmp_path / f"{i:04d}.log").write_bytes(log)
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm_offload_doctor", "analyze", str(tmp_path), "--jobs", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONWARNINGS": "error::DeprecationWarning"},
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # the first result is out: the workers are running
    workers = psutil.Process(proc.pid).children(recursive=True)
    assert workers
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert b"Traceback" not in err and b"interrupted" in err
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive


def test_redact_numbers_places_across_the_whole_batch(tmp_path, capsys):
    # A dozen logs naming the same address: one placeholder for it in all, whatever --jobs says.
    text = (
        "(APIServer pid=1) INFO 12-02 10:00:00 [api_server.py:1] vLLM API server version 0.25.1\n"
        "(APIServer pid=1) ERROR 12-02 10:00:01 [launcher.py:1] OSError: [Errno 98] error while "
        "attempting to bind on address ('10.1.2.3', 8000): address already in use\n"
    )
    for i in range(12):
        (tmp_path / f"{i:02d}.log").write_text(text)
    one = run(capsys, str(tmp_path), "--redact", "--jobs", "1")
    pool = run(capsys, str(tmp_path), "--redact", "--jobs", "3")
    assert pool == one
    assert "10.1.2.3" not in one[1] and one[1].count("<ip-1>") >= 12 and "<ip-2>" not in one[1]


@pytest.mark.parametrize("count", [0, 1, 5])
@pytest.mark.parametrize("errs", [[], ["a.log: cannot read", "b.log: binary"]])
def test_streamed_json_is_the_document_json_renders(count, errs):
    from vllm_offload_doctor.analyze.engine import Engine
    from vllm_offload_doctor.analyze.render import Renderer

    logs = sorted(FIXTURES.rglob("*.log"))[:count]
    eng = Engine()
    analyses = [eng.analyze_file(p) for p in logs]
    r = Renderer()
    stream = r.json_stream()
    text = stream.head() + "".join(stream.item(a) for a in analyses) + stream.tail(errs)
    assert text == Renderer().json(analyses, errs)
