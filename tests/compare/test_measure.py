"""Measurement helpers: /metrics parsing, request checks, statistics, NVML absence."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import pytest

from vllm_offload_doctor.compare import measure
from vllm_offload_doctor.compare.measure import (
    RequestResult,
    answer_matches,
    chat_request,
    host_rss,
    kv_metrics,
    latency_stats,
    percentile,
)
from vllm_offload_doctor.compare.records import KvMetrics, Latency, Request

METRICS = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",gpu_memory_utilization="0.92",\
num_cpu_blocks="None",num_gpu_blocks="73932"} 1.0
"""


def test_kv_metrics_from_cache_config_info() -> None:
    m = kv_metrics(METRICS)
    assert m.num_gpu_blocks == 73932 and m.block_size == 16
    assert m.kv_cache_tokens == 73932 * 16
    assert m.gpu_memory_utilization == pytest.approx(0.92)
    assert m.kv_cache_usage_perc == pytest.approx(0.25)


def test_kv_metrics_tolerates_missing_series() -> None:
    assert kv_metrics("garbage\n# only comments\n") == KvMetrics()


def test_answer_matches_case_insensitive_any() -> None:
    assert answer_matches("Столица — ПАРИЖ.", ["Париж", "Paris"]) is True
    assert answer_matches("paris", ["Париж", "Paris"]) is True
    assert answer_matches("Berlin", ["Париж", "Paris"]) is False
    assert answer_matches("anything", []) is None
    assert answer_matches(None, ["x"]) is False


def test_percentile_and_stats() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([1.0, 2.0], 95) == pytest.approx(1.95)
    rs = [
        RequestResult(True, 200, 0.1, 10, 4),
        RequestResult(True, 200, 0.3, 10, 4),
        RequestResult(False, 500, 9.0, error="HTTP 500"),
    ]
    st = latency_stats(rs)
    assert st.n == 3 and st.ok == 2
    assert st.median_s == pytest.approx(0.2) and st.min_s == pytest.approx(0.1)
    assert st.tokens_per_s == pytest.approx((40 + 40 / 3) / 2, rel=1e-3)
    assert latency_stats([RequestResult(False, None, 1.0)]).median_s is None


def _client(handler: Any) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "Назови"}],
    "max_tokens": 32,
    "stream": False,
}


def test_chat_request_ok_and_body_is_utf8() -> None:
    seen: dict[str, Any] = {}

    def handler(req: httpx.Request) -> httpx.Response:
        seen["body"] = json.loads(req.content.decode("utf-8"))
        assert "Назови".encode() in req.content  # Cyrillic kept intact, not \\u-escaped
        return httpx.Response(
            200,
            json={
                "choices": [{"message": {"content": "Париж"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 2},
            },
        )

    with _client(handler) as c:
        r = chat_request(c, "http://x/v1/chat/completions", BODY, ["Париж"], 5)
    assert r.ok and r.status == 200 and r.matched is True
    assert r.prompt_tokens == 12 and r.completion_tokens == 2 and r.has_choices
    assert seen["body"] == BODY


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (httpx.Response(200, content=b'{"choi'), "not valid JSON"),
        (httpx.Response(200, json={"usage": {}}), "no `choices`"),
        (
            httpx.Response(404, json={"error": {"message": "The model `m` does not exist."}}),
            "HTTP 404: The model",
        ),
    ],
)
def test_chat_request_failures(response: httpx.Response, error: str) -> None:
    with _client(lambda req: response) as c:
        r = chat_request(c, "http://x/v1/chat/completions", BODY, ["Париж"], 5)
    assert not r.ok and error in (r.error or "")


def test_chat_request_connection_error() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with _client(handler) as c:
        r = chat_request(c, "http://x/v1/chat/completions", BODY, [], 5)
    assert not r.ok and r.status is None and "ConnectError" in (r.error or "")


def test_streaming_ttft_and_itl() -> None:
    chunks = [
        {"choices": [{"delta": {"role": "assistant", "content": "Пар"}}]},
        {"choices": [{"delta": {"content": "иж"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
    ]
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"

    with _client(lambda req: httpx.Response(200, content=sse.encode())) as c:
        r = chat_request(c, "http://x", dict(BODY, stream=True), ["париж"], 5)
    assert r.ok and r.answer == "Париж" and r.matched
    assert r.ttft_s is not None and len(r.itl_ms) == 1 and r.completion_tokens == 2
    assert r.finish_reason == "stop"


def test_host_rss_of_own_process() -> None:
    rss = host_rss([os.getpid(), 999_999_999])
    assert rss.total_mib > 0 and [p.pid for p in rss.processes] == [os.getpid()]


def test_gpu_snapshot_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoNvml:
        class NVMLError(Exception):
            pass

        @staticmethod
        def nvmlInit() -> None:
            raise NoNvml.NVMLError("NVML Shared Library Not Found")

    monkeypatch.setitem(__import__("sys").modules, "pynvml", NoNvml)
    snap = measure.gpu_snapshot([os.getpid()])
    assert snap.available is False and "NVML" in (snap.reason or "")
    assert "tree_used_mib" not in snap.to_dict()  # written only when NVML answered


def test_gpu_snapshot_with_fake_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    class Mem:
        used, total, free = 132_279 * 2**20, 143_771 * 2**20, 11_492 * 2**20

    class Proc:
        def __init__(self, pid: int, used: int) -> None:
            self.pid, self.usedGpuMemory = pid, used

    me = os.getpid()

    class FakeNvml:
        class NVMLError(Exception):
            pass

        nvmlInit = nvmlShutdown = staticmethod(lambda: None)
        nvmlSystemGetDriverVersion = staticmethod(lambda: "580.159.04")
        nvmlSystemGetCudaDriverVersion = staticmethod(lambda: 13000)
        nvmlDeviceGetCudaComputeCapability = staticmethod(lambda h: (9, 0))
        nvmlDeviceGetMigMode = staticmethod(lambda h: (0, 0))
        nvmlDeviceGetCount = staticmethod(lambda: 2)
        nvmlDeviceGetHandleByIndex = staticmethod(lambda i: i)
        nvmlDeviceGetName = staticmethod(lambda h: b"NVIDIA H200")
        nvmlDeviceGetMemoryInfo = staticmethod(lambda h: Mem)
        nvmlDeviceGetComputeRunningProcesses = staticmethod(
            lambda h: [Proc(me, 2000 * 2**20), Proc(1, 5 * 2**20)] if h == 0 else []
        )
        nvmlDeviceGetCurrPcieLinkGeneration = staticmethod(lambda h: 1)
        nvmlDeviceGetCurrPcieLinkWidth = staticmethod(lambda h: 16)
        nvmlDeviceGetMaxPcieLinkGeneration = staticmethod(lambda h: 5)
        nvmlDeviceGetMaxPcieLinkWidth = staticmethod(lambda h: 16)

    monkeypatch.setitem(__import__("sys").modules, "pynvml", FakeNvml)
    snap = measure.gpu_snapshot([me])
    assert snap.available and snap.tree_used_mib == 2000
    d0 = snap.devices[0]
    assert d0.name == "NVIDIA H200" and d0.used_mib == 132_279
    assert d0.other_processes == 1 and d0.tree_processes[0].pid == me
    assert d0.pcie is not None and d0.pcie.bandwidth_gbs == pytest.approx(63.0, rel=0.01)
    assert snap.devices[1].tree_processes == ()


def test_gpu_snapshot_survives_a_broken_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        @staticmethod
        def nvmlInit() -> None:
            raise RuntimeError("no NVMLError class either")

    monkeypatch.setitem(__import__("sys").modules, "pynvml", Broken)
    snap = measure.gpu_snapshot([os.getpid()])
    assert snap.available is False and "NVML unavailable" in (snap.reason or "")


def test_gpu_snapshot_reads_nvml_through_the_check_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm_offload_doctor.machine import probes

    calls = []

    def reader() -> probes.NvmlInfo:
        calls.append(1)
        return probes.NvmlInfo(driver_version="580", gpus=())

    monkeypatch.setattr(measure, "read_nvml", reader)
    assert measure.gpu_snapshot([1]).available is True and calls == [1]


def test_a_request_record_rounds_as_the_report_keeps_it() -> None:
    raw = RequestResult(True, 200, 0.123456789, 10, 4, ttft_s=0.0123456, itl_ms=[1.23456, 2.5])
    rec = raw.record()
    assert (rec.latency_s, rec.ttft_s, rec.itl_ms) == (0.1235, 0.0123, (1.23, 2.5))
    assert Request.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec


def test_latency_keys_follow_whether_a_request_succeeded() -> None:
    failed = latency_stats([RequestResult(False, None, 1.0)]).to_dict()
    assert list(failed) == ["n", "ok", "median_s", "p95_s", "min_s", "mean_s"]
    ok = latency_stats([RequestResult(True, 200, 0.5, 1, 3)]).to_dict()
    assert list(ok)[-4:] == [
        "tokens_per_s",
        "completion_tokens_median",
        "ttft_median_s",
        "itl_median_ms",
    ]
    assert Latency.from_dict(ok).to_dict() == ok


def test_measure_gives_records_that_a_saved_report_reads_back_alike(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from vllm_offload_doctor.compare.config import CompareConfig
    from vllm_offload_doctor.compare.records import AnswersMatched, Served
    from vllm_offload_doctor.machine.probes import GpuInfo, GpuProcess, NvmlInfo

    metrics = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0\n'
    auth: list[str | None] = []

    def handler(req: httpx.Request) -> httpx.Response:
        auth.append(req.headers.get("authorization"))
        if req.url.path == "/version":
            return httpx.Response(200, json={"version": "0.25.1"})
        if req.url.path == "/metrics":
            return httpx.Response(200, text=metrics)
        return httpx.Response(
            200,
            json={
                "choices": [{"message": {"content": "Paris"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3},
            },
        )

    real = httpx.Client
    monkeypatch.setattr(
        httpx, "Client", lambda **kw: real(**kw, transport=httpx.MockTransport(handler))
    )
    me = os.getpid()
    gpu = GpuInfo(0, "H200", (9, 0), 2**37, 2**36, processes=(GpuProcess(me, None, 2**30),))
    monkeypatch.setattr(measure, "read_nvml", lambda: NvmlInfo(gpus=(gpu,)))

    class Srv:
        def live_tree(self) -> list[int]:
            return [me]

        def base_url(self) -> str:
            return "http://127.0.0.1:9"

    cfg = CompareConfig(vllm_cmd=["vllm"], out_dir=tmp_path, repeats=3, warmup=1, expect=["paris"])
    served = measure.measure(Srv(), cfg, "key")  # type: ignore[arg-type]
    assert served.gpu.tree_used_mib == 1024 and served.host_rss.processes[0].pid == me
    assert served.metrics == KvMetrics(100, 16, 1600, None, None)
    assert served.server_version == "0.25.1" and served.info_errors is None
    assert len(served.warmup_requests) == 1 and len(served.requests) == 3
    assert served.latency.ok == 3 and served.answers_matched == AnswersMatched(3, 3)
    assert set(auth) == {"Bearer key"}
    text = json.dumps(served.to_dict(), indent=2)
    assert json.dumps(Served.from_dict(json.loads(text)).to_dict(), indent=2) == text
