"""Progress while a mode is measured: request k of n, tokens so far, the running median."""

from __future__ import annotations

import io
import json
from pathlib import Path

from test_compare_e2e import run_compare

from vllm_offload_doctor.compare.measure import RequestResult
from vllm_offload_doctor.compare.progress import Progress, RequestProgress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def feed(stream: io.StringIO) -> None:
    rp = RequestProgress(Progress("2/2 offload 8 GiB", stream))
    rp(True, 1, 1, None)
    rp(True, 1, 1, RequestResult(True, 200, 2.0, completion_tokens=32))
    for k, latency in ((1, 1.0), (2, 3.0), (3, 2.5)):
        rp(False, k, 3, None)
        rp(False, k, 3, RequestResult(True, 200, latency, completion_tokens=32))


def test_on_a_terminal_one_line_is_rewritten() -> None:
    tty = Tty()
    feed(tty)
    text = tty.getvalue()
    assert "\n" not in text  # rewritten in place with \r
    last = text.rsplit("\r", 1)[-1].rstrip()
    # the warm-up counts no tokens; the median of 1.0, 3.0, 2.5 is 2.5
    assert last == "[2/2 offload 8 GiB] request 3/3: 2.50 s, 96 tokens so far, median 2.50 s"
    assert "request 2/3 ..., 32 tokens so far" in text  # shown while request 2 runs


def test_elsewhere_one_plain_line_per_request() -> None:
    plain = io.StringIO()
    feed(plain)
    lines = plain.getvalue().splitlines()
    assert lines == [
        "[2/2 offload 8 GiB] warm-up 1/1: 2.00 s",
        "[2/2 offload 8 GiB] request 1/3: 1.00 s, 32 tokens so far, median 1.00 s",
        "[2/2 offload 8 GiB] request 2/3: 3.00 s, 64 tokens so far, median 2.00 s",
        "[2/2 offload 8 GiB] request 3/3: 2.50 s, 96 tokens so far, median 2.50 s",
    ]
    assert "\r" not in plain.getvalue()


def test_a_failed_request_says_so_and_leaves_the_median_alone() -> None:
    plain = io.StringIO()
    rp = RequestProgress(Progress("1/2 offload 0 GiB", plain))
    rp(False, 1, 2, RequestResult(True, 200, 1.5, completion_tokens=8))
    rp(False, 2, 2, RequestResult(False, 500, 0.1, error="HTTP 500"))
    assert (
        plain.getvalue()
        .splitlines()[-1]
        .endswith("request 2/2: failed, 8 tokens so far, median 1.50 s")
    )


def test_the_real_run_reports_each_request_on_stderr_and_keeps_json_clean(tmp_path: Path) -> None:
    proc, _ = run_compare(tmp_path, "effective", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)  # nothing but the report on stdout
    for label in ("1/2 offload 0 GiB", "2/2 offload 0.5 GiB"):
        assert f"[{label}] request 1/2: " in proc.stderr
        assert f"[{label}] request 2/2: " in proc.stderr
    assert "tokens so far, median" in proc.stderr
