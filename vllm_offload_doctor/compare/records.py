"""Typed measurement records of one mode (GPU, host RSS, requests, latency, log facts).

`compare.measure` builds these records directly. Each record's `to_dict()` writes the
report.json schema 1 keys in their historical order (the JSON renderer's job); `from_dict()` only
reads a saved report back (`CompareReport.from_dict`), values kept as read so a round trip is
byte-identical.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, TypeVar

from vllm_offload_doctor.analyze.model import (
    Category,
    Facts,
    OffloadStatus,
    RankOffload,
    Severity,
)

Json = dict[str, Any]  # parsed report.json objects, read only inside from_dict()


def pack(obj: object, omit_none: Iterable[str] = ()) -> Json:
    """Fields in declaration order; nested records, tuples and mappings converted."""
    skip = set(omit_none)
    out: Json = {}
    for f in fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if value is None and f.name in skip:
            continue
        out[f.name] = _plain(value)
    return out


def _plain(value: object) -> object:
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, slots=True)
class Pcie:
    current_gen: int | None
    current_width: int | None
    max_gen: int | None
    max_width: int | None
    bandwidth_gbs: float | None
    current_bandwidth_gbs: float | None = None

    def to_dict(self) -> Json:
        return pack(self, ("current_bandwidth_gbs",))

    @classmethod
    def from_dict(cls, d: Json) -> Pcie:
        return cls(**{f.name: d.get(f.name) for f in fields(cls)})


@dataclass(frozen=True, slots=True)
class GpuProc:
    pid: int
    name: str | None
    used_mib: int | None

    def to_dict(self) -> Json:
        return pack(self)

    @classmethod
    def from_dict(cls, d: Json) -> GpuProc:
        return cls(d["pid"], d.get("name"), d.get("used_mib"))


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int
    name: str | None
    used_mib: int | None
    total_mib: int | None
    tree_processes: tuple[GpuProc, ...]
    tree_used_mib: int | None
    other_processes: int
    pcie: Pcie | None

    def to_dict(self) -> Json:
        return pack(self)

    @classmethod
    def from_dict(cls, d: Json) -> GpuDevice:
        pcie = d.get("pcie")
        return cls(
            index=d["index"],
            name=d.get("name"),
            used_mib=d.get("used_mib"),
            total_mib=d.get("total_mib"),
            tree_processes=tuple(GpuProc.from_dict(p) for p in d.get("tree_processes") or []),
            tree_used_mib=d.get("tree_used_mib"),
            other_processes=d.get("other_processes", 0),
            pcie=Pcie.from_dict(pcie) if isinstance(pcie, dict) else None,
        )


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    available: bool
    reason: str | None
    devices: tuple[GpuDevice, ...]
    tree_used_mib: int | None = None
    has_tree_total: bool = True  # the key is written only when NVML answered

    def to_dict(self) -> Json:
        out: Json = {
            "available": self.available,
            "reason": self.reason,
            "devices": [d.to_dict() for d in self.devices],
        }
        if self.has_tree_total:
            out["tree_used_mib"] = self.tree_used_mib
        return out

    @classmethod
    def from_dict(cls, d: Json) -> GpuSnapshot:
        return cls(
            available=bool(d.get("available")),
            reason=d.get("reason"),
            devices=tuple(GpuDevice.from_dict(x) for x in d.get("devices") or []),
            tree_used_mib=d.get("tree_used_mib"),
            has_tree_total="tree_used_mib" in d,
        )

    def server_devices(self) -> tuple[GpuDevice, ...]:
        """The devices the server's processes use, or all when none is visible."""
        return tuple(d for d in self.devices if d.tree_processes) or self.devices


@dataclass(frozen=True, slots=True)
class ProcRss:
    pid: int
    name: str | None
    rss_mib: float

    def to_dict(self) -> Json:
        return pack(self)


@dataclass(frozen=True, slots=True)
class HostRss:
    total_mib: float
    processes: tuple[ProcRss, ...]

    def to_dict(self) -> Json:
        return pack(self)

    @classmethod
    def from_dict(cls, d: Json) -> HostRss:
        procs = tuple(
            ProcRss(p["pid"], p.get("name"), p["rss_mib"]) for p in d.get("processes") or []
        )
        return cls(d.get("total_mib", 0.0), procs)


@dataclass(frozen=True, slots=True)
class Latency:
    n: int
    ok: int
    median_s: float | None = None
    p95_s: float | None = None
    min_s: float | None = None
    mean_s: float | None = None
    tokens_per_s: float | None = None
    completion_tokens_median: float | None = None
    ttft_median_s: float | None = None
    itl_median_ms: float | None = None
    keys: tuple[str, ...] = ()  # the keys present when read back (older reports lack some)

    def to_dict(self) -> Json:
        names = self.keys or tuple(f.name for f in fields(self) if f.name != "keys")
        if not self.keys and self.median_s is None:
            names = ("n", "ok", "median_s", "p95_s", "min_s", "mean_s")
        return {k: getattr(self, k) for k in names}

    @classmethod
    def from_dict(cls, d: Json) -> Latency:
        known = {f.name for f in fields(cls)} - {"keys"}
        return cls(**{k: v for k, v in d.items() if k in known}, keys=tuple(d))


@dataclass(frozen=True, slots=True)
class Request:
    ok: bool
    status: int | None
    latency_s: float
    prompt_tokens: int | None
    completion_tokens: int | None
    has_choices: bool
    answer: str | None
    matched: bool | None
    finish_reason: str | None
    error: str | None
    ttft_s: float | None
    itl_ms: tuple[float, ...]

    def to_dict(self) -> Json:
        return pack(self)

    @classmethod
    def from_dict(cls, d: Json) -> Request:
        values = {f.name: d.get(f.name) for f in fields(cls)}
        return cls(**values | {"itl_ms": tuple(d.get("itl_ms") or ())})


@dataclass(frozen=True, slots=True)
class Answer:
    answer: str
    count: int

    def to_dict(self) -> Json:
        return pack(self)


@dataclass(frozen=True, slots=True)
class AnswersMatched:
    matched: int
    checked: int

    def to_dict(self) -> Json:
        return pack(self)


@dataclass(frozen=True, slots=True)
class KvMetrics:
    """The KV-cache figures of vLLM's /metrics (`vllm:cache_config_info` labels and usage)."""

    num_gpu_blocks: int | None = None
    block_size: int | None = None
    kv_cache_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_usage_perc: float | None = None

    def to_dict(self) -> Json:
        return pack(self)

    @classmethod
    def from_dict(cls, d: Json) -> KvMetrics:
        return cls(**{f.name: d.get(f.name) for f in fields(cls)})


@dataclass(frozen=True, slots=True)
class Process:
    pid: int
    name: str | None

    def to_dict(self) -> Json:
        return pack(self)


@dataclass(frozen=True, slots=True)
class Served:
    """What was measured while a mode served (absent when it never became ready)."""

    processes: tuple[Process, ...]
    gpu: GpuSnapshot
    host_rss: HostRss
    server_version: str | None
    metrics: KvMetrics | None
    info_errors: tuple[str, ...] | None
    warmup_requests: tuple[Request, ...]
    requests: tuple[Request, ...]
    latency: Latency
    answers: tuple[Answer, ...]
    answers_matched: AnswersMatched

    def to_dict(self) -> Json:
        return pack(self, ("info_errors",))

    @classmethod
    def from_dict(cls, d: Json) -> Served:
        am = d.get("answers_matched") or {}
        errors = d.get("info_errors")
        metrics = d.get("metrics")
        return cls(
            processes=tuple(Process(p["pid"], p.get("name")) for p in d.get("processes") or []),
            gpu=GpuSnapshot.from_dict(d.get("gpu") or {}),
            host_rss=HostRss.from_dict(d.get("host_rss") or {}),
            server_version=d.get("server_version"),
            metrics=KvMetrics.from_dict(metrics) if isinstance(metrics, dict) else None,
            info_errors=tuple(errors) if errors is not None else None,
            warmup_requests=tuple(Request.from_dict(r) for r in d.get("warmup_requests") or []),
            requests=tuple(Request.from_dict(r) for r in d.get("requests") or []),
            latency=Latency.from_dict(d.get("latency") or {"n": 0, "ok": 0}),
            answers=tuple(Answer(a["answer"], a["count"]) for a in d.get("answers") or []),
            answers_matched=AnswersMatched(am.get("matched", 0), am.get("checked", 0)),
        )


@dataclass(frozen=True, slots=True)
class Stop:
    stop_s: float
    signals: tuple[str, ...]
    returncode: int | None
    swept: tuple[int, ...]
    survivors: tuple[int, ...]
    port_free: bool | None
    log_flood: str | None = None  # "the server wrote N MB of log in M s" when its log was cut

    def to_dict(self) -> Json:
        return pack(self, omit_none=("log_flood",))

    @classmethod
    def from_dict(cls, d: Json) -> Stop:
        return cls(
            d.get("stop_s", 0.0),
            tuple(d.get("signals") or ()),
            d.get("returncode"),
            tuple(d.get("swept") or ()),
            tuple(d.get("survivors") or ()),
            d.get("port_free"),
            d.get("log_flood"),
        )


# The log facts report.json keeps of analyze's `Facts`, in their historical order; the figures of
# a CUDA OOM and a KV cache shortfall nest under "oom" (report key: Facts field).
LOG_FACTS = (
    "vllm_version",
    "model_runner",
    "model_runner_evidence",
    "cpu_offload_gb",
    "tensor_parallel_size",
    "offloader",
    "offloaded_gib",
    "model_loading_gib",
    "kv_cache_gib",
    "kv_cache_tokens",
    "reached_ready",
)
RANK_FACTS = ("offloader", "offloaded_gib", "model_loading_gib")
OOM_FACTS = {
    "tried_gib": "oom_tried_gib",
    "total_gib": "oom_total_gib",
    "free_gib": "oom_free_gib",
    "in_use_gib": "oom_in_use_gib",
    "kv_needed_gib": "kv_needed_gib",
    "kv_available_gib": "kv_available_gib",
}
_OOM_OMIT_NONE = ("kv_needed_gib", "kv_available_gib")


def log_facts_dict(f: Facts) -> Json:
    """A mode's `log_facts` in report.json."""
    out: Json = {k: getattr(f, k) for k in LOG_FACTS}
    out["ranks"] = {
        name: {**{k: getattr(r, k) for k in RANK_FACTS}, "status": r.status}
        for name, r in sorted(f.ranks.items())
    }
    for k in ("gpu_total_gib", "gpu_free_gib"):
        if getattr(f, k) is not None:
            out[k] = getattr(f, k)
    if f.oom_tried_gib is not None or f.kv_needed_gib is not None:
        oom = {k: getattr(f, name) for k, name in OOM_FACTS.items()}
        out["oom"] = {k: v for k, v in oom.items() if v is not None or k not in _OOM_OMIT_NONE}
    return out


def log_facts_from_dict(d: Json) -> Facts:
    """`log_facts` of a report.json on disk, as analyze's facts (the keys it has, as read)."""
    known = set(LOG_FACTS) | {"gpu_total_gib", "gpu_free_gib"}
    f = Facts(**{k: v for k, v in d.items() if k in known})
    for name, r in (d.get("ranks") or {}).items():
        f.ranks[name] = RankOffload(
            name,
            offloader=r.get("offloader"),
            offloaded_gib=r.get("offloaded_gib"),
            model_loading_gib=r.get("model_loading_gib"),
            status=member(OffloadStatus, r.get("status"), OffloadStatus.UNKNOWN),
        )
    oom = d.get("oom")
    if isinstance(oom, dict):
        for k, name in OOM_FACTS.items():
            setattr(f, name, oom.get(k))
    return f


E = TypeVar("E", bound=StrEnum)


def member(kind: type[E], value: object, default: E) -> E:
    """An enum member from report.json, or `default` for a value this version does not know."""
    try:
        return kind(str(value))
    except ValueError:
        return default


@dataclass(frozen=True, slots=True)
class ModeAnalysis:
    """The analyze engine's verdict on a mode's log."""

    category: Category
    rule_id: str | None
    title: str
    summary: str
    severity: Severity
    remedy: str
    links: tuple[str, ...]
    offload_status: OffloadStatus
    offload_explanation: str
    ranks_disagree: bool
    evidence: tuple[tuple[int, str], ...] = ()  # (line number, text): the lines it failed on

    def to_dict(self) -> Json:
        out = pack(self)
        del out["evidence"]
        if self.evidence:  # absent when empty: earlier reports stay byte-identical
            out["evidence"] = [{"line": n, "text": t} for n, t in self.evidence]
        return out

    @classmethod
    def from_dict(cls, d: Json) -> ModeAnalysis:
        return cls(
            category=member(Category, d.get("category"), Category.UNKNOWN),
            rule_id=d.get("rule_id"),
            title=d.get("title", ""),
            summary=d.get("summary", ""),
            severity=member(Severity, d.get("severity"), Severity.INFO),
            remedy=d.get("remedy", ""),
            links=tuple(d.get("links") or ()),
            offload_status=member(OffloadStatus, d.get("offload_status"), OffloadStatus.UNKNOWN),
            offload_explanation=d.get("offload_explanation", ""),
            ranks_disagree=bool(d.get("ranks_disagree")),
            evidence=tuple(
                (int(e.get("line", 0)), str(e.get("text", "")))
                for e in d.get("evidence") or ()
                if isinstance(e, dict)
            ),
        )
