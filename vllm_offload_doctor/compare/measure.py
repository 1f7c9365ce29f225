"""Measurements of a running server: GPU memory (NVML), host RSS, /metrics, /version, requests.

GPU memory is read per device and per process with NVML and summed over the server's process
tree (the API server, `VLLM::EngineCore` and, with tensor parallelism, `Worker_TPn`). When NVML is
unavailable (CI, no driver) the figures are null and the reason is recorded.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_offload_doctor.machine.pcie import pcie_bandwidth_gbs
from vllm_offload_doctor.machine.probes import GpuInfo, NvmlInfo, read_nvml

MIB = 1024 * 1024
UNAUTHORIZED = (
    "the server wants an API key (give it with `-- --api-key KEY` or VLLM_API_KEY) "
    "or rejected the one sent"
)


# ---------------------------------------------------------------------------- host RSS


def host_rss(pids: list[int]) -> dict[str, Any]:
    """Resident memory of each process in the tree and the sum, MiB."""
    import psutil

    procs: list[dict[str, Any]] = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            rss = round(p.memory_info().rss / MIB, 1)
            procs.append({"pid": pid, "name": p.name(), "rss_mib": rss})
        except psutil.Error:
            continue
    return {"total_mib": round(sum(p["rss_mib"] for p in procs), 1), "processes": procs}


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


def gpu_snapshot(pids: list[int], info: NvmlInfo | None = None) -> dict[str, Any]:
    """Per device: memory used/total, the tree's processes on it, PCIe link. Never raises.

    NVML is read by `probes.read_nvml`, the same reader `check` uses.
    """
    if info is None:
        try:
            info = read_nvml()
        except Exception as exc:  # a broken pynvml must not end a measured run
            return {"available": False, "reason": f"NVML unavailable: {exc}", "devices": []}
    if info.error:
        return {"available": False, "reason": info.error, "devices": []}
    tree = set(pids)
    names = process_names(pids)
    devices = []
    seen_any_process = False
    for g in info.gpus:
        mine: list[dict[str, Any]] = []
        for p in g.processes:
            seen_any_process = True
            if p.pid in tree:
                mine.append(
                    {
                        "pid": p.pid,
                        "name": names.get(p.pid) or p.name,
                        "used_mib": round(p.used_bytes / MIB) if p.used_bytes is not None else None,
                    }
                )
        known = [m["used_mib"] for m in mine if m["used_mib"] is not None]
        devices.append(
            {
                "index": g.index,
                "name": g.name,
                "used_mib": round(g.memory_used / MIB) if g.memory_used is not None else None,
                "total_mib": round(g.memory_total / MIB) if g.memory_total is not None else None,
                "tree_processes": mine,
                "tree_used_mib": sum(known) if known else (0 if not mine else None),
                "other_processes": len(g.processes) - len(mine),
                "pcie": _pcie(g),
            }
        )
    used_by_tree = [d for d in devices if d["tree_processes"]]
    note = None
    if devices and seen_any_process and not used_by_tree:
        note = (
            "NVML lists compute processes but none of the server's pids: the server may run in "
            "another pid namespace (container); per-process figures are unavailable"
        )
    return {
        "available": True,
        "reason": note,
        "devices": devices,
        "tree_used_mib": sum(d["tree_used_mib"] or 0 for d in devices) if used_by_tree else None,
    }


def _pcie(g: GpuInfo) -> dict[str, Any]:
    cur_gen, cur_w, max_gen, max_w = g.pcie_gen, g.pcie_width, g.pcie_gen_max, g.pcie_width_max
    # Idle GPUs drop to a lower link generation; the bound uses the link's maximum.
    bw = pcie_bandwidth_gbs(max_gen, max_w) if max_gen and max_w else None
    cur_bw = pcie_bandwidth_gbs(cur_gen, cur_w) if cur_gen and cur_w else None
    return {
        "current_gen": cur_gen,
        "current_width": cur_w,
        "max_gen": max_gen,
        "max_width": max_w,
        "bandwidth_gbs": bw,
        "current_bandwidth_gbs": cur_bw,
    }


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


def kv_metrics(text: str) -> dict[str, Any]:
    """KV-cache figures from vLLM's /metrics: cache_config_info labels and usage."""
    res: dict[str, Any] = {
        "num_gpu_blocks": None,
        "block_size": None,
        "kv_cache_tokens": None,
        "gpu_memory_utilization": None,
        "kv_cache_usage_perc": None,
    }
    for name, labels, value in parse_prometheus(text):
        if name == "vllm:cache_config_info":
            res["num_gpu_blocks"] = _int(labels.get("num_gpu_blocks"))
            res["block_size"] = _int(labels.get("block_size"))
            res["gpu_memory_utilization"] = _float(labels.get("gpu_memory_utilization"))
            if res["num_gpu_blocks"] and res["block_size"]:
                res["kv_cache_tokens"] = res["num_gpu_blocks"] * res["block_size"]
        elif name in _USAGE_SERIES and value is not None:
            res["kv_cache_usage_perc"] = value
    return res


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


def fetch_info(
    base_url: str, timeout_s: float = 10.0, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """GET /version and /metrics; errors are recorded, not raised."""
    import httpx

    out: dict[str, Any] = {"version": None, "metrics": None, "errors": []}
    with httpx.Client(timeout=timeout_s, trust_env=False, headers=headers or {}) as c:
        try:
            status, body = bounded_get(c, f"{base_url}/version", timeout_s)
            out["version"] = _json(body).get("version") if status == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError, AnswerBound) as exc:
            out["errors"].append(f"/version: {exc}")
        try:
            status, body = bounded_get(c, f"{base_url}/metrics", timeout_s)
            if status == 200:
                out["metrics"] = kv_metrics(body.decode("utf-8", "replace"))
            else:
                out["errors"].append(f"/metrics: HTTP {status}")
        except (httpx.HTTPError, AnswerBound) as exc:
            out["errors"].append(f"/metrics: {exc}")
    return out


# ---------------------------------------------------------------------------- requests


@dataclass(slots=True)
class RequestResult:
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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["latency_s"] = round(self.latency_s, 4)
        if self.ttft_s is not None:
            d["ttft_s"] = round(self.ttft_s, 4)
        d["itl_ms"] = [round(x, 2) for x in self.itl_ms]
        return d


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


def latency_stats(results: list[RequestResult]) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    lat = sorted(r.latency_s for r in ok)
    out: dict[str, Any] = {"n": len(results), "ok": len(ok)}
    if not lat:
        return out | {"median_s": None, "p95_s": None, "min_s": None, "mean_s": None}
    out["median_s"] = round(statistics.median(lat), 4)
    out["p95_s"] = round(percentile(lat, 95), 4)
    out["min_s"] = round(lat[0], 4)
    out["mean_s"] = round(statistics.fmean(lat), 4)
    tps = [r.completion_tokens / r.latency_s for r in ok if r.completion_tokens and r.latency_s > 0]
    out["tokens_per_s"] = round(statistics.median(tps), 2) if tps else None
    toks = [r.completion_tokens for r in ok if r.completion_tokens is not None]
    out["completion_tokens_median"] = statistics.median(toks) if toks else None
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    out["ttft_median_s"] = round(statistics.median(ttft), 4) if ttft else None
    itl = [x for r in ok for x in r.itl_ms]
    out["itl_median_ms"] = round(statistics.median(itl), 2) if itl else None
    return out


def percentile(sorted_values: list[float], pct: float) -> float:
    """Linear-interpolated percentile of already sorted values."""
    if not sorted_values:
        raise ValueError("no values")
    k = (len(sorted_values) - 1) * pct / 100
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)
