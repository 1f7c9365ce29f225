"""The fake vLLM behaves like `vllm serve` from the outside."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest
from server_procs import free_port

FAKE = Path(__file__).resolve().parents[1] / "fake-vllm"
PREFIX = re.compile(r"^\((APIServer|EngineCore|Worker_TP\d) pid=(\d+)\) ")


STARTED: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _reap_servers() -> object:
    """Whatever a test asserted, no fake server outlives it and every Popen is waited for (a
    Popen dropped while running warns in whichever later test the garbage collector runs)."""
    yield
    while STARTED:
        proc = STARTED.pop()
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def start(
    tmp_path: Path, scenario: str, offload: str, *extra: str, **env: str
) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    log = tmp_path / f"{scenario}-{offload}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [
                str(FAKE),
                "serve",
                "/tmp/model",
                "--cpu-offload-gb",
                offload,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--max-model-len",
                "2048",
                "--served-model-name",
                "S",
                "--unknown-flag",
                "x",
                *extra,
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(os.environ, FAKE_VLLM_SCENARIO=scenario, **env),
        )
    STARTED.append(proc)
    return proc, port, log


def wait_ready(port: int, proc: subprocess.Popen[bytes], limit: float = 60) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        assert proc.poll() is None, "fake exited"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise AssertionError("not ready")


def stop(proc: subprocess.Popen[bytes]) -> list[int]:
    tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    _gone, alive = psutil.wait_procs(
        [psutil.Process(p) for p in tree if psutil.pid_exists(p)], timeout=5
    )
    for p in alive:
        p.kill()
    return [p.pid for p in alive]


def test_effective_offload_real_format_and_endpoints(tmp_path: Path) -> None:
    proc, port, log = start(tmp_path, "effective", "0.5")
    try:
        wait_ready(port, proc)
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/v1/models").json()["data"][0]["id"] == "S"
        assert httpx.get(f"{base}/version").json() == {"version": "0.25.1"}
        assert 'vllm:cache_config_info{block_size="16"' in httpx.get(f"{base}/metrics").text
        r = httpx.post(
            f"{base}/v1/chat/completions",
            json={"model": "S", "messages": [{"role": "user", "content": "q"}], "max_tokens": 32},
        )
        assert r.json()["choices"][0]["message"]["content"] == "Париж."
        assert httpx.post(f"{base}/v1/chat/completions", json={"model": "other"}).status_code == 404
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) == 1
    finally:
        assert stop(proc) == []
    text = log.read_text()
    for line in text.splitlines():
        assert PREFIX.match(line), line
    assert "non-default args: {'model_tag': '/tmp/model'" in text
    assert "'cpu_offload_gb': 0.5}" in text
    assert "[base.py:123] Offloader set to UVAOffloader" in text
    assert "[uva.py:58] Total CPU offloaded parameters: 0.51" in text
    assert re.search(r"\[gpu_model_runner\.py:5306\] Model loading took 0\.62 GiB memory and", text)
    assert "INFO:     Application startup complete." in text
    assert f"(EngineCore pid={children[0].pid})" in text


def test_ignored_is_v2_without_offloader_lines(tmp_path: Path) -> None:
    proc, port, log = start(tmp_path, "ignored", "0.5")
    try:
        wait_ready(port, proc)
    finally:
        stop(proc)
    text = log.read_text()
    assert "[gpu_worker.py:360] Using V2 Model Runner" in text
    assert "Model loading took 1.12 GiB and " in text
    assert "Offloader" not in text and "Total CPU offloaded" not in text


def test_tp2_has_two_worker_grandchildren_with_rank_lines(tmp_path: Path) -> None:
    proc, port, log = start(tmp_path, "effective", "0.5", "--tensor-parallel-size", "2")
    try:
        wait_ready(port, proc)
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert len(tree) == 3
    finally:
        assert stop(proc) == []
    text = log.read_text()
    for rank in (0, 1):
        assert re.search(
            rf"\(Worker_TP{rank} pid=\d+\) .*Total CPU offloaded parameters: 0\.51", text
        )


@pytest.mark.parametrize(
    ("scenario", "needle"),
    [
        ("oom-load", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 924.00 MiB."),
        ("port-taken", "OSError: [Errno 98] Address already in use"),
    ],
)
def test_failing_scenarios_only_hit_the_offload_mode(
    tmp_path: Path, scenario: str, needle: str
) -> None:
    proc, port, log = start(tmp_path, scenario, "0")
    try:
        wait_ready(port, proc)
    finally:
        stop(proc)
    proc, _port, log = start(tmp_path, scenario, "0.5")
    assert proc.wait(timeout=60) == 1
    text = log.read_text()
    assert needle in text
    if scenario == "oom-load":
        assert "Engine core initialization failed. See root cause above." in text


def test_real_bind_failure(tmp_path: Path) -> None:
    proc, port, _log = start(tmp_path, "effective", "0")
    try:
        wait_ready(port, proc)
        with open(tmp_path / "second.log", "wb") as f:
            second = subprocess.run(
                [str(FAKE), "serve", "m", "--host", "127.0.0.1", "--port", str(port)],
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=10,
            )
        assert second.returncode == 1
        assert "[Errno 98] Address already in use" in (tmp_path / "second.log").read_text()
    finally:
        stop(proc)


@pytest.mark.parametrize(
    ("offload", "env", "needle"),
    [
        ("0", {}, "torch.OutOfMemoryError: CUDA out of memory."),
        ("0.7", {}, "(0.7 GiB KV cache is needed, which is larger than the available KV cache"),
        ("0.6", {}, "ValueError: No available memory for the cache blocks."),
        ("1", {"FAKE_VLLM_SCENARIO": "needs-offload-ignored"}, "Using V2 Model Runner"),
    ],
)
def test_needs_offload_fails_below_the_minimum(
    tmp_path: Path, offload: str, env: dict[str, str], needle: str
) -> None:
    scenario = env.pop("FAKE_VLLM_SCENARIO", "needs-offload")
    proc, _port, log = start(tmp_path, scenario, offload, FAKE_VLLM_MIN_OFFLOAD_GB="1.31", **env)
    assert proc.wait(timeout=60) == 1
    text = log.read_text()
    assert needle in text
    assert "Engine core initialization failed" in text
    honoured = scenario == "needs-offload" and offload != "0"
    assert ("Offloader set to UVAOffloader" in text) == honoured


def test_needs_offload_serves_at_the_minimum_and_v1_runner_honours_it(tmp_path: Path) -> None:
    for scenario, env in (
        ("needs-offload", {}),
        ("needs-offload-ignored", {"VLLM_USE_V2_MODEL_RUNNER": "0"}),
    ):
        proc, port, log = start(tmp_path, scenario, "1", FAKE_VLLM_MIN_OFFLOAD_GB="1", **env)
        try:
            wait_ready(port, proc)
        finally:
            assert stop(proc) == []
        text = log.read_text()
        assert "Total CPU offloaded parameters: 1.02" in text
        assert "V2 Model Runner" not in text


def test_api_key_guards_v1_and_is_echoed_like_vllm(tmp_path: Path) -> None:
    key = "sk-echoedkey0123456789abcdef"
    proc, port, log = start(tmp_path, "effective", "0", "--api-key", key, "--enforce-eager")
    try:
        wait_ready(port, proc)
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/v1/models").status_code == 401
        auth = {"authorization": f"Bearer {key}"}
        assert httpx.get(f"{base}/v1/models", headers=auth).status_code == 200
        assert httpx.get(f"{base}/version").status_code == 200  # open, as in vLLM
    finally:
        assert stop(proc) == []
    text = log.read_text()
    assert f"'api_key': ['{key}']" in text
    assert "'unknown_flag': 'x', 'enforce_eager': True" in text


def test_host_oom_grows_shared_memory_then_dies_with_no_exception(tmp_path: Path) -> None:
    proc, _port, log = start(tmp_path, "host-oom", "8", FAKE_VLLM_HOST_GROW_MB="64")
    engine = None
    peak_shmem = 0
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            kids = psutil.Process(proc.pid).children()
            engine = kids[0] if kids else engine
            if engine is not None:
                peak_shmem = max(peak_shmem, engine.memory_info().shared)
        time.sleep(0.1)
    assert proc.returncode == 1
    assert engine is not None and not engine.is_running()
    assert peak_shmem > 32 * 2**20  # the engine really held host memory before it died
    text = log.read_text()
    lines = text.splitlines()
    assert lines[-1].endswith(
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}"
    )
    assert "Offloader set to UVAOffloader" in text
    assert not [ln for ln in lines if "(EngineCore" in ln and "ERROR" in ln]  # no exception
    # The baseline of the same scenario still serves.
    proc, port, _log = start(tmp_path, "host-oom", "0")
    try:
        wait_ready(port, proc)
    finally:
        stop(proc)
