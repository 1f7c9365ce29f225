"""compare's artifacts hold no secret of the new shapes (issue 20 item 1): URL credentials with
`@` or `/` in the password, percent-encoded userinfo, terse secret variables, in the model, the
environment and the server's own log; every file under --out and the console are searched."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "fake-vllm"
SECRETS = {
    "HF_ENDPOINT": "https://mirror-user:Pa55@w0rd/Zq9fLw@hf-mirror.acme.corp",
    "PIP_INDEX_URL": "https://alice%3AKp7Wd2Lx9Qv4Zr8M@pypi.acme.corp/simple",
    "VLLM_PRIVATE_KEY_ID": "b7e2c9a41f0d3e58a6c2",
    "HF_TOKEN": "hf_Q7vX2kLp9RtZ4mWb8NcYs3Hf6Jd1GqUe5A",
}
NEEDLES = ["Pa55@w0rd/Zq9fLw", "Zq9fLw", "Kp7Wd2Lx9Qv4Zr8M", "b7e2c9a41f0d3e58a6c2", "GqUe5A"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_no_new_shape_reaches_any_compare_artifact(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "FAKE_VLLM_SCENARIO": "effective", **SECRETS}
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", "compare", "--vllm-cmd", str(FAKE),
         "--model", "https://bob:Sup3r@S3cr3tPw@models.acme.corp/llama", "--port", str(_port()),
         "--repeats", "1", "--warmup", "0", "--grace", "3", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "report.json" for p in files), proc.stderr
    texts = {str(p): p.read_text(errors="replace") for p in files}
    texts["console"] = proc.stdout + proc.stderr
    for where, text in texts.items():
        for needle in [*NEEDLES, "S3cr3tPw"]:
            assert needle not in text, (where, needle)
