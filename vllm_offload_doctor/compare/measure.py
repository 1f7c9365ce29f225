"""Measurements of a running server: GPU memory (NVML), host RSS, /metrics, /version, requests.

Each reading returns its record (`compare.records`); `measure` gathers them into a mode's
`Served`. GPU memory is read per device and per process with NVML and summed over the server's
process tree (the API server, `VLLM::EngineCore` and, with tensor parallelism, `Worker_TPn`).
When NVML is unavailable (CI, no driver) the figures are null and the reason is recorded.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_offload_doctor.compare.records import (
    Answer,
    AnswersMatched,
    GpuDevice,
    GpuProc,
    GpuSnapshot,
    HostRss,
    KvMetrics,
    Latency,
    Pcie,
    Process,
    ProcRss,
    Request,
    Served,
)
from vllm_offload_doctor.machine.pcie import pcie_bandwidth_gbs
from vllm_offload_doctor.machine.probes import GpuInfo, NvmlInfo, read_nvml

if TYPE_CHECKING:
    from vllm_offload_doctor.compare.config import CompareConfig
    from vllm_offload_doctor.compare.server import ServerProcess

MIB = 1024 * 1024
UNAUTHORIZED = (
    "the server wants an API key (give it with `-- --api-key KEY` or VLLM_API_KEY) "
    "or rejected the one sent"
)


# ---------------------------------------------------------------------------- host RSS


def host_rss(pids: list[int]) -> HostRss:
    """Resident memory of each process in the tree and the sum, MiB."""
    import psutil

    procs: list[ProcRss] = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            rss = round(p.memory_info().rss / MIB, 1)
            procs.append(ProcRss(pid, p.name(), rss))
        except psutil.Error:
            continue
    return HostRss(round(sum(p.rss_mib for p in procs), 1), tuple(procs))


def process_names(pids: list[int]) -> dict[int, str]:
    import psutil

    names = {}
    for pid in pids:
        try:
            names[pid] = psutil.Process(pid).name()
        except psutil.Error:
            continue
    return names


# ---------------------------------------------------------------------------- NVML


def gpu_snapshot(pids: list[int], info: NvmlInfo | None = None) -> GpuSnapshot:
    """Per device: memory used/total, the tree's processes on it, PCIe link. Never raises.

    NVML is read by `probes.read_nvml`, the same reader `check` uses.
    """
    if info is None:
        try:
            info = read_nvml()
        except Exception as exc:  # a broken pynvml must not end a measured run
            return _no_gpu(f"NVML unavailable: {exc}")
    if info.error:
        return _no_gpu(info.error)
    tree = set(pids)
    names = process_names(pids)
    devices = []
    seen_any_process = False
    for g in info.gpus:
        mine: list[GpuProc] = []
        for p in g.processes:
            seen_any_process = True
            if p.pid in tree:
                used = round(p.used_bytes / MIB) if p.used_bytes is not None else None
                mine.append(GpuProc(p.pid, names.get(p.pid) or p.name, used))
        known = [m.used_mib for m in mine if m.used_mib is not None]
        devices.append(
            GpuDevice(
                index=g.index,
                name=g.name,
                used_mib=round(g.memory_used / MIB) if g.memory_used is not None else None,
                total_mib=round(g.memory_total / MIB) if g.memory_total is not None else None,
                tree_processes=tuple(mine),
                tree_used_mib=sum(known) if known else (0 if not mine else None),
                other_processes=len(g.processes) - len(mine),
                pcie=_pcie(g),
            )
        )
    used_by_tree = [d for d in devices if d.tree_processes]
    note = None
    if devices and seen_any_process and not used_by_tree:
        note = (
            "NVML lists compute processes but none of the server's pids: the server may run in "
            "another pid namespace (container); per-process figures are unavailable"
        )
    return GpuSnapshot(
        available=True,
        reason=note,
        devices=tuple(devices),
        tree_used_mib=sum(d.tree_used_mib or 0 for d in devices) if used_by_tree else None,
    )


def _no_gpu(reason: str) -> GpuSnapshot:
    return GpuSnapshot(available=False, reason=reason, devices=(), has_tree_total=False)


def _pcie(g: GpuInfo) -> Pcie:
    cur_gen, cur_w, max_gen, max_w = g.pcie_gen, g.pcie_width, g.pcie_gen_max, g.pcie_width_max
    # Idle GPUs drop to a lower link generation; the bound uses the link's maximum.
    bw = pcie_bandwidth_gbs(max_gen, max_w) if max_gen and max_w else None
    cur_bw = pcie_bandwidth_gbs(cur_gen, cur_w) if cur_gen and cur_w else None
    return Pcie(cur_gen, cur_w, max_gen, max_w, bw, cur_bw)


# ---------------------------------------------------------------------------- /metrics


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float | None]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        try:
            value: float | None = float(m.group("value"))
        except ValueError:
            value = None
        out.append((m.group("name"), labels, value))
    return out


_USAGE_SERIES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def kv_metrics(text: str) -> KvMetrics:
    """KV-cache figures from vLLM's /metrics: cache_config_info labels and usage."""
    blocks = size = tokens = None
    utilization = usage = None
    for name, labels, value in parse_prometheus(text):
        if name == "vllm:cache_config_info":
            blocks, size = _int(labels.get("num_gpu_blocks")), _int(labels.get("block_size"))
            utilization = _float(labels.get("gpu_memory_utilization"))
            if blocks and size:
                tokens = blocks * size
        elif name in _USAGE_SERIES and value is not None:
            usage = value
    return KvMetrics(blocks, size, tokens, utilization, usage)


def _int(v: str | None) -> int | None:
    try:
        return None if v is None or v == "None" else int(v)
    except ValueError:
        return None


def _float(v: str | None) -> float | None:
    try:
        return None if v is None or v == "None" else float(v)
    except ValueError:
        return None


# -------------------------------------------------------------------- bounded answers

# Bytes of one answer kept: a chat completion is a few KiB, /metrics some 100 KiB. A server
# that sends more (a bug, or a hostile one) is cut off, never held in memory whole.
MAX_ANSWER_BYTES = 16 << 20
MAX_LINE_BYTES = 1 << 20  # one server-sent event line
# Asked of every server: a compressed answer could expand past any cap in one read.
IDENTITY = {"accept-encoding": "identity"}


class AnswerBound(Exception):
    """An answer past a bound: larger than its cap, or not complete by its deadline."""


def bounded_chunks(
    r: Any, deadline: float, timeout_s: float, limit: int = MAX_ANSWER_BYTES
) -> Iterator[bytes]:
    """The raw body of `r` (de-chunked, never decompressed), checked against `limit` bytes and
    the request's total `deadline` (time.monotonic) at every piece: a trickle ends there."""
    enc = r.headers.get("content-encoding", "identity").strip().lower()
    if enc not in ("", "identity"):
        raise AnswerBound(f"the server sent a {enc}-compressed answer though asked not to")
    total = 0
    # A response already read (a transport that answers from memory) gives its bytes as they are.
    chunks = r.iter_bytes() if r.is_stream_consumed else r.iter_raw()
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise AnswerBound(f"the answer passed {limit >> 20} MiB; the rest was not read")
        if time.monotonic() > deadline:
            raise AnswerBound(f"the answer was not complete after {timeout_s:g} s")
        yield chunk


def bounded_get(
    client: Any, url: str, timeout_s: float, limit: int = MAX_ANSWER_BYTES
) -> tuple[int, bytes]:
    """GET `url`: (status, body), the body bounded in size and total time (AnswerBound)."""
    deadline = time.monotonic() + timeout_s
    with client.stream("GET", url, headers=IDENTITY, timeout=timeout_s) as r:
        return r.status_code, b"".join(bounded_chunks(r, deadline, timeout_s, limit))


def _json(body: bytes) -> Any:
    return json.loads(body.decode("utf-8", "replace"))


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What /version and /metrics answered, and why one did not."""

    version: str | None
    metrics: KvMetrics | None
    errors: tuple[str, ...]


def fetch_info(
    base_url: str, timeout_s: float = 10.0, headers: dict[str, str] | None = None
) -> ServerInfo:
    """GET /version and /metrics; errors are recorded, not raised."""
    import httpx

    version: str | None = None
    metrics: KvMetrics | None = None
    errors: list[str] = []
    with httpx.Client(timeout=timeout_s, trust_env=False, headers=headers or {}) as c:
        try:
            status, body = bounded_get(c, f"{base_url}/version", timeout_s)
            version = _json(body).get("version") if status == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError, AnswerBound) as exc:
            errors.append(f"/version: {exc}")
        try:
            status, body = bounded_get(c, f"{base_url}/metrics", timeout_s)
            if status == 200:
                metrics = kv_metrics(body.decode("utf-8", "replace"))
            else:
                errors.append(f"/metrics: HTTP {status}")
        except (httpx.HTTPError, AnswerBound) as exc:
            errors.append(f"/metrics: {exc}")
    return ServerInfo(version, metrics, tuple(errors))


# ---------------------------------------------------------------------------- requests


@dataclass(slots=True)
class RequestResult:
    """One request as it is measured, unrounded (the statistics and the progress line read it)."""

    ok: bool
    status: int | None
    latency_s: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    has_choices: bool = False
    answer: str | None = None
    matched: bool | None = None
    finish_reason: str | None = None
    error: str | None = None
    ttft_s: float | None = None
    itl_ms: list[float] = field(default_factory=list)

    def record(self) -> Request:
        """The report's record: times rounded as report.json keeps them."""
        return Request(
            ok=self.ok,
            status=self.status,
            latency_s=round(self.latency_s, 4),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            has_choices=self.has_choices,
            answer=self.answer,
            matched=self.matched,
            finish_reason=self.finish_reason,
            error=self.error,
            ttft_s=round(self.ttft_s, 4) if self.ttft_s is not None else None,
            itl_ms=tuple(round(x, 2) for x in self.itl_ms),
        )


def answer_matches(answer: str | None, expect: list[str]) -> bool | None:
    if not expect:
        return None
    if answer is None:
        return False
    low = answer.casefold()
    return any(e.casefold() in low for e in expect)


def chat_request(
    client: Any, url: str, body: dict[str, Any], expect: list[str], timeout_s: float
) -> RequestResult:
    """POST one chat completion and measure it. Never raises for HTTP or JSON problems."""
    import httpx

    payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
    headers = {"content-type": "application/json", **IDENTITY}
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout_s  # the whole request: connect, first byte, body
    if body.get("stream"):
        return _stream_request(client, url, payload, headers, expect, timeout_s, t0, deadline)
    status: int | None = None
    try:
        with client.stream("POST", url, content=payload, headers=headers, timeout=timeout_s) as r:
            status = r.status_code
            raw = b"".join(bounded_chunks(r, deadline, timeout_s))
    except httpx.HTTPError as exc:
        err = f"{type(exc).__name__}: {exc}"
        return RequestResult(False, None, time.perf_counter() - t0, error=err)
    except AnswerBound as exc:
        return RequestResult(False, status, time.perf_counter() - t0, error=str(exc))
    latency = time.perf_counter() - t0
    res = RequestResult(False, status, latency)
    if status == 401:
        res.error = f"HTTP 401: {UNAUTHORIZED}"
        return res
    try:
        data = _json(raw)
    except ValueError:
        text = raw[:80].decode("utf-8", "replace")
        res.error = f"HTTP {status}: response is not valid JSON ({text!r})"
        return res
    if not isinstance(data, dict):
        res.error = "response JSON is not an object"
        return res
    usage: dict[str, Any] = data["usage"] if isinstance(data.get("usage"), dict) else {}
    res.prompt_tokens = usage.get("prompt_tokens")
    res.completion_tokens = usage.get("completion_tokens")
    choices = data.get("choices")
    res.has_choices = isinstance(choices, list) and len(choices) > 0
    if status != 200:
        api_err = data.get("error")
        detail = api_err.get("message") if isinstance(api_err, dict) else data.get("detail") or data
        res.error = f"HTTP {status}: {detail}"
        return res
    if not res.has_choices:
        res.error = "response has no `choices`"
        return res
    assert isinstance(choices, list)
    first: dict[str, Any] = choices[0] if isinstance(choices[0], dict) else {}
    msg: dict[str, Any] = first["message"] if isinstance(first.get("message"), dict) else {}
    content = msg.get("content")
    res.answer = content if isinstance(content, str) else None
    res.finish_reason = first.get("finish_reason")
    res.matched = answer_matches(res.answer, expect)
    res.ok = True
    return res


def _stream_request(
    client: Any,
    url: str,
    payload: bytes,
    headers: dict[str, str],
    expect: list[str],
    timeout_s: float,
    t0: float,
    deadline: float,
) -> RequestResult:
    import httpx

    res = RequestResult(False, None, 0.0)
    parts: list[str] = []
    last: float | None = None
    saw_choices = False
    try:
        with client.stream("POST", url, content=payload, headers=headers, timeout=timeout_s) as r:
            res.status = r.status_code
            for line in _lines(bounded_chunks(r, deadline, timeout_s)):
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                try:
                    chunk = json.loads(data)
                except ValueError:
                    res.error = "stream chunk is not valid JSON"
                    continue
                if isinstance(chunk.get("usage"), dict):
                    res.prompt_tokens = chunk["usage"].get("prompt_tokens")
                    res.completion_tokens = chunk["usage"].get("completion_tokens")
                for ch in chunk.get("choices") or []:
                    saw_choices = True
                    delta = (ch.get("delta") or {}).get("content")
                    if ch.get("finish_reason"):
                        res.finish_reason = ch["finish_reason"]
                    if delta:
                        if last is None:
                            res.ttft_s = now - t0
                        else:
                            res.itl_ms.append((now - last) * 1e3)
                        last = now
                        parts.append(delta)
    except httpx.HTTPError as exc:
        res.latency_s = time.perf_counter() - t0
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    except AnswerBound as exc:
        res.latency_s = time.perf_counter() - t0
        res.error = str(exc)
        return res
    res.latency_s = time.perf_counter() - t0
    res.has_choices = saw_choices
    res.answer = "".join(parts) if saw_choices else None
    if res.status != 200:
        res.error = res.error or f"HTTP {res.status}"
    elif not saw_choices:
        res.error = res.error or "stream has no `choices`"
    else:
        res.ok = res.error is None
    res.matched = answer_matches(res.answer, expect) if res.ok else None
    return res


def _lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """Server-sent event lines, each at most MAX_LINE_BYTES (a longer one is an AnswerBound)."""
    buf = b""
    for chunk in chunks:
        buf += chunk
        *done, buf = buf.split(b"\n")
        for line in done:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
        if len(buf) > MAX_LINE_BYTES:
            raise AnswerBound(f"a stream line passed {MAX_LINE_BYTES >> 20} MiB")
    if buf:
        yield buf.rstrip(b"\r").decode("utf-8", "replace")


def latency_stats(results: list[RequestResult]) -> Latency:
    ok = [r for r in results if r.ok]
    lat = sorted(r.latency_s for r in ok)
    if not lat:
        return Latency(n=len(results), ok=len(ok))
    tps = [r.completion_tokens / r.latency_s for r in ok if r.completion_tokens and r.latency_s > 0]
    toks = [r.completion_tokens for r in ok if r.completion_tokens is not None]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [x for r in ok for x in r.itl_ms]
    return Latency(
        n=len(results),
        ok=len(ok),
        median_s=round(statistics.median(lat), 4),
        p95_s=round(percentile(lat, 95), 4),
        min_s=round(lat[0], 4),
        mean_s=round(statistics.fmean(lat), 4),
        tokens_per_s=round(statistics.median(tps), 2) if tps else None,
        completion_tokens_median=statistics.median(toks) if toks else None,
        ttft_median_s=round(statistics.median(ttft), 4) if ttft else None,
        itl_median_ms=round(statistics.median(itl), 2) if itl else None,
    )


def percentile(sorted_values: list[float], pct: float) -> float:
    """Linear-interpolated percentile of already sorted values."""
    if not sorted_values:
        raise ValueError("no values")
    k = (len(sorted_values) - 1) * pct / 100
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


# ---------------------------------------------------------------------------- a mode

# (warm-up?, k, n, the result; None while request k is under way)
OnRequest = Callable[[bool, int, int, RequestResult | None], None]


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def measure(
    srv: ServerProcess,
    cfg: CompareConfig,
    api_key: str | None,
    on_request: OnRequest | None = None,
) -> Served:
    """Measure a mode that is ready: processes, GPU, host RSS, /version, /metrics, the requests."""
    import httpx

    pids = srv.live_tree()
    names = process_names(pids)
    gpu = gpu_snapshot(pids)
    rss = host_rss(pids)
    headers = auth_headers(api_key)
    info = fetch_info(srv.base_url(), headers=headers)
    url = f"{srv.base_url()}/v1/chat/completions"
    body = cfg.request_body()
    expect = cfg.expected_answers
    warm: list[RequestResult] = []
    measured: list[RequestResult] = []
    with httpx.Client(trust_env=False, headers=headers) as client:
        for n, results in ((cfg.warmup, warm), (cfg.repeats, measured)):
            for k in range(1, n + 1):
                if on_request:
                    on_request(results is warm, k, n, None)
                results.append(chat_request(client, url, body, expect, cfg.request_timeout_s))
                if on_request:
                    on_request(results is warm, k, n, results[-1])
    answers = Counter(r.answer for r in measured if r.answer is not None)
    checked = [r.matched for r in measured if r.matched is not None]
    return Served(
        processes=tuple(Process(p, names.get(p)) for p in pids),
        gpu=gpu,
        host_rss=rss,
        server_version=info.version,
        metrics=info.metrics,
        info_errors=info.errors or None,
        warmup_requests=tuple(r.record() for r in warm),
        requests=tuple(r.record() for r in measured),
        latency=latency_stats(measured),
        answers=tuple(Answer(a, c) for a, c in answers.most_common(3)),
        answers_matched=AnswersMatched(sum(checked), len(checked)),
    )
