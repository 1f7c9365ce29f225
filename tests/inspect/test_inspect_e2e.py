"""End-to-end: `offload-doctor inspect` against a running tests/fake-vllm tells effective from ignored."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.compare.test_compare_e2e import free_port

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "fake-vllm"
OFFLOAD = "0.3"  # GiB: small, yet well above the shared-memory baseline


@contextlib.contextmanager
def fake_server(scenario: str, *extra: str, tp: int = 1) -> Iterator[tuple[int, int]]:
    port = free_port()
    env = dict(os.environ, FAKE_VLLM_SCENARIO=scenario)
    env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    argv = [
        sys.executable,
        str(FAKE),
        "serve",
        "m",
        "--cpu-offload-gb",
        OFFLOAD,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "-tp",
        str(tp),
        *extra,
    ]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            pytest.fail("the fake vLLM did not become ready")
        yield proc.pid, port
    finally:
        proc.terminate()  # the fake stops its EngineCore and workers on SIGTERM
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def run_inspect(*args: str) -> tuple[int, dict]:
    out = subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", "inspect", *args, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return out.returncode, json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_effective_and_ignored_told_apart():
    with fake_server("effective") as (pid, port):
        rc, data = run_inspect("--port", str(port))
        [srv] = data["servers"]
        assert (rc, srv["verdict"]) == (0, "effective")
        assert srv["server"]["pid"] == pid
        assert srv["ranks"][0]["process"] == "EngineCore"
        assert srv["ranks"][0]["shmem_gib"] >= 0.3
        assert srv["server"]["http"]["version"] == "0.25.1"
    with fake_server("ignored") as (pid, port):
        rc, data = run_inspect(str(pid))
        [srv] = data["servers"]
        assert (rc, srv["verdict"]) == (1, "ignored")
        assert srv["server"]["vllm_version"] == "0.25.1"  # /version: no vllm package here
        assert "VLLM_USE_V2_MODEL_RUNNER=0" in srv["fix"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_tp2_every_rank_holds_its_share():
    with fake_server("effective", tp=2) as (_pid, port):
        rc, data = run_inspect("--url", f"http://127.0.0.1:{port}")
        [srv] = data["servers"]
        assert (rc, srv["verdict"]) == (0, "effective")
        assert [r["process"] for r in srv["ranks"]] == ["Worker_TP0", "Worker_TP1"]
