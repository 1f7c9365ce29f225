"""Secrets by structure, and masked before evidence is cut (issue 20)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_offload_doctor.redact import scrub_cut, scrub_text

SHAPES = [
    ("curl -u alice:Sup3rS3cretPw https://h/x", "Sup3rS3cretPw"),
    ("curl --user=alice:Sup3rS3cretPw https://h/x", "Sup3rS3cretPw"),
    ("DB_PASS=Sup3rS3cretPw", "Sup3rS3cretPw"),
    ("MYSQL_PWD=Sup3rS3cretPw", "Sup3rS3cretPw"),
    ("connecting with pass=Sup3rS3cretPw", "Sup3rS3cretPw"),
    ("https://alice%3ASup3rS3cretPw@mirror.example/x", "Sup3rS3cretPw"),
    ("https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX", "XXXXXXXXXXXX"),
    ("https://discord.com/api/webhooks/123456789/abcdefghijklmnopqrstuvwxyz", "abcdefghijkl"),
]


@pytest.mark.parametrize(("line", "secret"), SHAPES)
def test_shape_masked(line: str, secret: str) -> None:
    assert secret not in scrub_text(line)


def test_harmless_pass_words_kept() -> None:
    assert scrub_text("tests pass=true") == "tests pass=true"


def test_cut_after_masking() -> None:
    # Cut first, `https://u:pw` (no `@` left) and `hf_` prefixes kept their secrets.
    line = "x" * 380 + " https://u:Sup3rS3cretPwLongEnough@host/path"
    assert "Sup3rS3" not in scrub_cut(line, 400)
    line = "x" * 590 + " hf_abcdefghijklmnopqrstuvwxyzABCD"
    assert "hf_abcdefg" not in scrub_cut(line, 600)


def test_analyze_json_masks_cut_evidence(tmp_path: Path) -> None:
    log = tmp_path / "v.log"
    pad = "y" * 570
    log.write_text(
        "INFO 11-29 15:14:24 [api_server.py:1] vLLM API server version 0.11.0\n"
        f"ERROR 11-29 15:14:25 [core.py:1] RuntimeError: CUDA out of memory {pad}"
        " https://u:Sup3rS3cretPwLongEnough@host/x\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", "analyze", "--format", "json", str(log)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    json.loads(out)
    assert "Sup3rS3" not in out


@pytest.mark.parametrize(
    "line",
    [
        "--api-key k3J9sQ-first VLLM_API_KEY='k3J9sQ-second'",
        '--api-key k3J9sQ-first HF_TOKEN="k3J9sQ-second"',
        "--api-key k3J9sQ-first OPENAI_API_KEY=k3J9sQ-second --port 8000",
        "token=x --api-key k3J9sQ-first (VLLM_API_KEY='k3J9sQ-second'",
        "--api-key k3J9sQ-first :|= {HF_TOKEN='k3J9sQ-second'",
    ],
)
def test_assignment_after_multi_valued_api_key_is_masked(line: str) -> None:
    # The option's mask once swallowed the next field's name, leaving its value to no pass.
    out = scrub_text(line)
    assert "first" not in out and "second" not in out, out


def test_base64_padded_api_keys_are_all_values() -> None:
    out = scrub_text("--api-key YWJjZA== YWJjZGU= --port 8000")
    assert "YWJj" not in out and "--port 8000" in out, out
