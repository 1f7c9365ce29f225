"""Logs written for this test from vLLM's source messages, in versions, collectors and wordings
the rules were not built on (journald + CRLF, docker compose, Ray `(pid=, ip=)`, k8s ISO time,
ANSI, V0 and V2 runners): the failure class must still be named, and offload never falsely
`ignored`."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_offload_doctor.analyze.engine import analyze_file, analyze_lines

HERE = Path(__file__).parents[1] / "unseen"

CASES = {
    # name: (category, rule or None, offload status, words the summary must hold)
    "wsl2-pinned-crlf-journald.log": ("wsl", "WSL001", None, ()),
    "ray-actor-died.log": (
        "unknown",
        None,
        "not_requested",
        ("died without raising", "OOM killer"),
    ),
    "kv-offload-lmcache-oom.log": (
        "oom_weights",
        "OOM003",
        "not_requested",
        ("KV-cache offloading", "LMCache"),
    ),
    "v0-docker-kv-blocks.log": ("oom_kv_cache", None, "not_requested", ()),
    # LABELING.md: no exception under a large offload is oom_host (the kernel's OOM killer).
    "worker-died-exit-9.log": (
        "oom_host",
        "OOM005",
        "effective",
        ("2 x --cpu-offload-gb", "about 96 GiB", "OOM killer"),
    ),
    "hf-gated-ray-prefix.log": ("model_download", "DL001", "not_requested", ()),
    # Under WSL2 the UVA failure follows from WSL's pinned-memory default (corpus label: wsl).
    "uva-not-available-v2-wsl.log": ("wsl", "WSL001", None, ()),
    "graph-capture-oom-0.33.log": ("oom_runtime", "OOM004", "not_requested", ("CUDA-graph",)),
    "v0-profile-run-oom-0.4.log": ("oom_runtime", "OOM004", "not_requested", ()),
    "nccl-after-oom.log": ("oom_weights", "OOM003", "not_requested", ()),
    "engine-dead-wrapper-only.log": ("unknown", None, "not_requested", ()),
    "healthy-v2-offload-0.33.log": ("healthy", None, "effective", ("10.00 GiB",)),
    "offline-llm-finished-0.8.log": ("healthy", None, "not_requested", ()),
    "ray-v0-negative-kv-budget.log": ("oom_kv_cache", None, "not_requested", ()),
    "wsl-warning-only-0.33.log": ("unknown", None, "not_requested", ()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_unseen_log(name: str) -> None:
    category, rule, offload, words = CASES[name]
    path = HERE / name
    a = analyze_file(path)
    b = analyze_lines(path.read_bytes().decode("utf-8").split("\n"))
    assert a.verdict.category.value == b.verdict.category.value == category
    if rule is not None:
        assert a.verdict.rule_id == rule
    if offload is not None:
        assert a.offload.status.value == offload
    assert a.offload.status.value != "ignored"
    for word in words:
        assert word in a.verdict.summary
    # Every failure verdict shows the lines it rests on.
    if category != "healthy" and (category != "unknown" or a.verdict.severity.value == "error"):
        assert (a.findings and a.findings[0].evidence) or a.notable


def test_the_directory_holds_only_the_listed_logs() -> None:
    assert sorted(p.name for p in HERE.iterdir()) == sorted(CASES)


def test_version_in_the_v2_window_without_runner_evidence_is_not_ignored() -> None:
    path = Path(__file__).parents[2] / "fixtures/rules/OFF001/v0.25-no-runner-evidence.log"
    a = analyze_file(path)
    assert a.offload.status.value == "unknown"
    assert "does not say which runner ran" in a.offload.explanation


def test_kv_offloading_size_is_not_weight_offload() -> None:
    a = analyze_lines(
        [
            "(APIServer pid=9) INFO 10-02 10:00:00 [api_utils.py:297] vLLM server version 0.30.0, serving model m",
            "(APIServer pid=9) INFO 10-02 10:00:00 [api_utils.py:286] non-default args: {'model_tag': 'm', "
            "'kv_offloading_size': 64.0, 'max_model_len': 131072}",
            "(EngineCore pid=80) ERROR 10-02 10:01:00 [core.py:1500] ValueError: To serve at least one request "
            "with the model's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the "
            "available KV cache memory (3.10 GiB).",
        ]
    )
    assert a.verdict.category.value == "oom_kv_cache"
    assert (
        "--kv-offloading-size 64.0" in a.verdict.summary
        and "weight offloading" in a.verdict.summary
    )
    assert a.offload.status.value == "not_requested"


def test_no_kv_offload_note_without_kv_offloading() -> None:
    a = analyze_lines(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB."])
    assert "KV-cache offloading" not in a.verdict.summary


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "0: ",
        "12: ",
        "[1,0]<stderr>:",
        "[0,3]<stdout>: ",
        "May 01 10:00:10 node-7 vllm[2211]: ",
        "2026-05-01T10:00:10.123456789Z stderr F ",
        "vllm-1  | ",
        "(VllmWorker rank=1 pid=2345) ",
    ],
)
def test_launcher_and_collector_prefixes(prefix: str) -> None:
    """srun --label, mpirun --tag-output, journald, CRI, compose, worker prefixes before anchored lines."""
    got = {
        line: analyze_lines([prefix + line]).verdict.category.value
        for line in (
            "RuntimeError: Cannot copy out of meta tensor; no data!",
            "MemoryError",
            "ValueError: `max_num_batched_tokens` (2048) must be greater than or equal to `max_model_len` (8192).",
        )
    }
    assert list(got.values()) == ["crash_other", "oom_host", "bad_args"]


def test_death_with_kv_offloading_names_its_pinned_host_memory() -> None:
    a = analyze_lines(
        [
            "(APIServer pid=3) INFO 10-02 10:00:00 [api_utils.py:286] non-default args: "
            "{'model_tag': 'm', 'kv_offloading_size': 64.0}",
            "Killed",
        ]
    )
    assert a.verdict.title == "The engine died without an exception"
    assert "KV-cache offloading (--kv-offloading-size 64.0)" in a.verdict.summary
    assert [e.text for e in a.notable] == ["Killed"]


READY = [
    "INFO 05-01 10:01:00 [api_server.py:1000] Starting vLLM API server on http://0.0.0.0:8000",
    "INFO:     Application startup complete.",
]


@pytest.mark.parametrize(
    "before",
    [
        # 0.5-era CPU/ROCm builds warn about their missing extension and still serve
        "WARNING 08-31 15:52:50 _custom_ops.py:18] Failed to import from vllm._C with "
        "ModuleNotFoundError(\"No module named 'vllm._C'\")",
        # huggingface_hub retries a HEAD request, then finds the file
        "WARNING 05-01 10:00:00 [_http.py:320] '(MaxRetryError(\"HTTPSConnectionPool(host='huggingface.co', "
        "port=443): Max retries exceeded with url: /x/resolve/main/config.json (Caused by "
        "ConnectTimeoutError(...))\"), '(Request ID: 1)')' thrown while requesting HEAD "
        "https://huggingface.co/x/resolve/main/config.json",
        "NCCL WARN NET/IB : No device found.",
    ],
)
def test_errors_the_server_lived_through_are_not_its_failure(before: str) -> None:
    a = analyze_lines([before, *READY])
    assert a.verdict.category.value == "healthy"


def test_an_error_after_readiness_still_counts() -> None:
    a = analyze_lines(
        [
            *READY,
            "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
        ]
    )
    assert a.verdict.category.value == "port_in_use"


_ROOT = Path(__file__).parents[2]
_ALL_LOGS = sorted(
    [
        *_ROOT.glob("fixtures/rules/*/*.log"),
        *HERE.glob("*.log"),
        *(_ROOT / "tests/pasted").iterdir(),
    ]
)


@pytest.mark.parametrize("path", _ALL_LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_failure_verdict_shows_its_lines(path: Path) -> None:
    a = analyze_file(path)
    if a.findings:
        assert a.findings[0].evidence
    elif a.verdict.severity.value == "error":
        assert a.notable
    if "lines below" in a.verdict.summary:
        assert a.notable


_WSL_CUDA_INIT = [
    "INFO 06-20 21:14:05 [__init__.py:244] Automatically detected platform cuda.",
    "WARNING 06-20 21:14:06 [interface.py:181] Using 'pin_memory=False' as WSL is detected. "
    "This may slow down the performance.",
    "ERROR 06-20 21:14:16 [core.py:586] RuntimeError: Unexpected error from cudaGetDeviceCount(). "
    "Did you run some cuda functions before calling NumCudaDevices() that might have already set an "
    "error? Error 500: named symbol not found",
]


def test_cuda_init_failure_under_wsl_says_where_cuda_comes_from() -> None:
    a = analyze_lines(_WSL_CUDA_INIT)
    assert a.verdict.category.value == "driver_cuda"
    assert "WSL2" in a.verdict.summary and "Windows" in a.verdict.summary


def test_cuda_init_failure_on_linux_has_no_wsl_note() -> None:
    a = analyze_lines([_WSL_CUDA_INIT[0], _WSL_CUDA_INIT[2]])
    assert a.verdict.category.value == "driver_cuda"
    assert "WSL" not in a.verdict.summary
