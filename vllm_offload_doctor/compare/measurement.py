"""Measure a mode that is ready: processes, GPU, host RSS, /version, /metrics, the requests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from vllm_offload_doctor.compare.config import CompareConfig
from vllm_offload_doctor.compare.model import Process, Served
from vllm_offload_doctor.compare.records import (
    Answer,
    AnswersMatched,
    GpuSnapshot,
    HostRss,
    Latency,
    Request,
)

if TYPE_CHECKING:
    from vllm_offload_doctor.compare.measure import RequestResult
    from vllm_offload_doctor.compare.server import ServerProcess

# (warm-up?, k, n, the result; None while request k is under way)
OnRequest = Callable[[bool, int, int, "RequestResult | None"], None]


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def measure(
    srv: ServerProcess,
    cfg: CompareConfig,
    api_key: str | None,
    on_request: OnRequest | None = None,
) -> Served:
    import httpx

    from vllm_offload_doctor.compare.measure import (
        chat_request,
        fetch_info,
        gpu_snapshot,
        host_rss,
        latency_stats,
        process_names,
    )

    pids = srv.live_tree()
    names = process_names(pids)
    gpu = GpuSnapshot.from_dict(gpu_snapshot(pids))
    rss = HostRss.from_dict(host_rss(pids))
    info = fetch_info(srv.base_url(), headers=auth_headers(api_key))
    url = f"{srv.base_url()}/v1/chat/completions"
    body = cfg.request_body()
    expect = cfg.expected_answers
    warm: list[RequestResult] = []
    measured: list[RequestResult] = []
    with httpx.Client(trust_env=False, headers=auth_headers(api_key)) as client:
        for n, results in ((cfg.warmup, warm), (cfg.repeats, measured)):
            for k in range(1, n + 1):
                if on_request:
                    on_request(results is warm, k, n, None)
                results.append(chat_request(client, url, body, expect, cfg.request_timeout_s))
                if on_request:
                    on_request(results is warm, k, n, results[-1])
    answers = Counter(r.answer for r in measured if r.answer is not None)
    checked = [r.matched for r in measured if r.matched is not None]
    errors = info["errors"]
    return Served(
        processes=tuple(Process(p, names.get(p)) for p in pids),
        gpu=gpu,
        host_rss=rss,
        server_version=info["version"],
        metrics=info["metrics"],
        info_errors=tuple(errors) if errors else None,
        warmup_requests=tuple(Request.from_dict(r.to_dict()) for r in warm),
        requests=tuple(Request.from_dict(r.to_dict()) for r in measured),
        latency=Latency.from_dict(latency_stats(measured)),
        answers=tuple(Answer(a, c) for a, c in answers.most_common(3)),
        answers_matched=AnswersMatched(sum(checked), len(checked)),
    )
