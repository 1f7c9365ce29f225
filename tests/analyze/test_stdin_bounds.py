"""Standard input is bounded like a file (issue 20 item 5): `--max-bytes` caps it, a stream of
NUL bytes (`< /dev/zero`) or binary is refused with one line and exit 2, never read forever."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DOCTOR = [sys.executable, "-m", "vllm_offload_doctor", "analyze"]
LINE = "ERROR 11-29 15:14:25 [core.py:1] RuntimeError: boom\n"


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero on this system")
@pytest.mark.parametrize("flags", [(), ("--max-bytes", "0"), ("--max-bytes", "4M")])
def test_dev_zero_on_stdin_is_refused_quickly(flags: tuple[str, ...]) -> None:
    with open("/dev/zero", "rb") as zero:
        proc = subprocess.run(
            [*DOCTOR, *flags, "-"], stdin=zero, capture_output=True, text=True, timeout=120
        )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "binary input" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_binary_stdin_is_refused(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(bytes(range(1, 32)) * 4096)
    with blob.open("rb") as fh:
        proc = subprocess.run([*DOCTOR, "-"], stdin=fh, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "binary" in proc.stderr


def test_max_bytes_caps_stdin_and_says_so(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_text(LINE * 20_000)  # about 1 MB
    with log.open("rb") as fh:
        proc = subprocess.run(
            [*DOCTOR, "--max-bytes", "64K", "--format", "json", "-"],
            stdin=fh, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    result = json.loads(proc.stdout)["results"][0]
    assert "stopped reading stdin after 64 KiB" in result["error"]
    assert result["lines_read"] < 2_000  # stopped at the cap, not at the end
