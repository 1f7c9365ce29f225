"""The typed `compare` report: modes, per-offload comparisons, the verdict.

`CompareReport.to_dict()` is report.json schema 1 (keys in their historical order; keys added
since are written only when set) and `from_dict()` reads it back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from vllm_offload_doctor.analyze.model import Facts
from vllm_offload_doctor.compare.hostmem import HostMemory
from vllm_offload_doctor.compare.records import (
    GpuSnapshot,
    Json,
    Latency,
    ModeAnalysis,
    Served,
    Stop,
    log_facts_dict,
    log_facts_from_dict,
    pack,
)
from vllm_offload_doctor.output.formats import SCHEMA_VERSION


class CompareStatus(StrEnum):
    """Ordered from best to worst: the report's verdict is the worst comparison."""

    EFFECTIVE = "effective"
    INCONCLUSIVE = "inconclusive"
    IGNORED = "ignored"
    FAILED = "failed"

    @property
    def rank(self) -> int:
        return list(CompareStatus).index(self)


class ModeStatus(StrEnum):
    STARTING = "starting"
    NOT_STARTED = "not_started"
    OK = "ok"
    EXITED = "exited"
    TIMEOUT = "timeout"
    REQUESTS_FAILED = "requests_failed"
    INTERRUPTED = "interrupted"
    UNAUTHORIZED = "unauthorized"  # ready, but /v1 refused us: an API key is missing or wrong


class Role(StrEnum):
    BASELINE = "baseline"
    OFFLOAD = "offload"
    VERIFY_FIX = "verify_fix"  # the offload mode again, with the prescribed fix applied


@dataclass(frozen=True, slots=True)
class ModeResult:
    label: str
    offload_gb: float
    role: Role
    command: tuple[str, ...]
    log: str
    status: ModeStatus
    reason: str | None = None
    pid: int | None = None
    startup_s: float | None = None
    phase: str | None = None
    returncode: int | None = None
    served: Served | None = None
    stop: Stop | None = None
    leftover_pids: tuple[int, ...] | None = None
    log_facts: Facts | None = None  # analyze's facts of the mode's log
    analysis: ModeAnalysis | None = None
    analysis_error: str | None = None
    last_error_line: str | None = None
    env: Mapping[str, str] | None = None  # environment this mode alone got (the verified fix)
    host_memory: HostMemory | None = None  # sampled every second from launch to stop

    def to_dict(self) -> Json:
        out: Json = {}
        for name, value in pack(self, [f.name for f in fields(self)]).items():
            if name == "served":
                out.update(value)
            elif name == "log_facts":
                out[name] = log_facts_dict(value)
            else:
                out[name] = value
        return out

    @classmethod
    def from_dict(cls, d: Json) -> ModeResult:
        lf, an, stop = d.get("log_facts"), d.get("analysis"), d.get("stop")
        hm = d.get("host_memory")
        left = d.get("leftover_pids")
        served = Served.from_dict(d) if "requests" in d or "latency" in d else None
        return cls(
            label=d["label"],
            offload_gb=d["offload_gb"],
            role=Role(d.get("role", "offload")),
            command=tuple(d.get("command") or ()),
            log=d.get("log", ""),
            status=ModeStatus(d.get("status", "starting")),
            reason=d.get("reason"),
            pid=d.get("pid"),
            startup_s=d.get("startup_s"),
            phase=d.get("phase"),
            returncode=d.get("returncode"),
            served=served,
            stop=Stop.from_dict(stop) if isinstance(stop, dict) else None,
            leftover_pids=tuple(left) if left is not None else None,
            log_facts=log_facts_from_dict(lf) if isinstance(lf, dict) else None,
            analysis=ModeAnalysis.from_dict(an) if isinstance(an, dict) else None,
            analysis_error=d.get("analysis_error"),
            last_error_line=d.get("last_error_line"),
            env=d.get("env"),
            host_memory=HostMemory.from_dict(hm) if isinstance(hm, dict) else None,
        )

    @property
    def ok(self) -> bool:
        return self.status == ModeStatus.OK

    @property
    def latency(self) -> Latency | None:
        return self.served.latency if self.served else None

    @property
    def gpu(self) -> GpuSnapshot | None:
        return self.served.gpu if self.served else None


@dataclass(frozen=True, slots=True)
class Pair:
    baseline: float | None
    offload: float | None

    def to_dict(self) -> Json:
        return pack(self)

    @classmethod
    def from_dict(cls, d: Json) -> Pair:
        return cls(d.get("baseline"), d.get("offload"))


@dataclass(frozen=True, slots=True)
class RankView:
    offloaded_gib: float | None
    model_loading_gib: Pair
    weights_delta_gib: float | None
    status: str

    def to_dict(self) -> Json:
        return pack(self)

    @classmethod
    def from_dict(cls, d: Json) -> RankView:
        return cls(
            d.get("offloaded_gib"),
            Pair.from_dict(d.get("model_loading_gib") or {}),
            d.get("weights_delta_gib"),
            d.get("status", "unknown"),
        )


@dataclass(frozen=True, slots=True)
class Figures:
    """The log figures of a pair of modes that both served."""

    ranks: Mapping[str, RankView]
    requested_gib: float
    weights_on_gpu_gib: Pair
    weights_delta_gib: float | None
    offloaded_gib: float | None

    def to_dict(self) -> Json:
        return pack(self)

    @classmethod
    def from_dict(cls, d: Json) -> Figures:
        return cls(
            {k: RankView.from_dict(v) for k, v in (d.get("ranks") or {}).items()},
            d.get("requested_gib", 0.0),
            Pair.from_dict(d.get("weights_on_gpu_gib") or {}),
            d.get("weights_delta_gib"),
            d.get("offloaded_gib"),
        )


@dataclass(frozen=True, slots=True)
class Link:
    desc: str | None = None
    bandwidth_gbs: float | None = None
    device: int | None = None
    current_gen: int | None = None
    current_width: int | None = None
    reason: str | None = None  # set alone when the link is unknown

    def to_dict(self) -> Json:
        if self.reason is not None:
            return {"reason": self.reason}
        return pack(self, ("reason",))

    @classmethod
    def from_dict(cls, d: Json) -> Link:
        return cls(**{f.name: d.get(f.name) for f in fields(cls)})


_PERF_OPTIONAL = (
    "slowdown",
    "extra_ms_per_token",
    "link",
    "offloaded_delta_gib",
    "link_bound_ms_per_token",
    "link_floor_ms_per_token",
    "measured_vs_bound",
    "implied_gbs",
    "consistent",
)


@dataclass(frozen=True, slots=True)
class Performance:
    notes: tuple[str, ...] = ()
    slowdown: float | None = None
    extra_ms_per_token: float | None = None
    link: Link | None = None
    offloaded_delta_gib: float | None = None  # the extra bytes the slowdown is charged to
    link_bound_ms_per_token: float | None = None
    link_floor_ms_per_token: float | None = None
    measured_vs_bound: float | None = None
    implied_gbs: float | None = None
    consistent: bool | None = None  # False: faster than the raw link allows
    text: str = ""

    def to_dict(self) -> Json:
        return pack(self, _PERF_OPTIONAL)

    @classmethod
    def from_dict(cls, d: Json) -> Performance:
        link = d.get("link")
        known = {f.name for f in fields(cls)} - {"notes", "link"}
        return cls(
            notes=tuple(d.get("notes") or ()),
            link=Link.from_dict(link) if isinstance(link, dict) else None,
            **{k: v for k, v in d.items() if k in known},
        )


@dataclass(frozen=True, slots=True)
class Finding:
    """A status with its explanation: the body of a comparison and of the verdict."""

    status: CompareStatus
    title: str
    summary: str
    remedy: str = ""
    links: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Comparison:
    offload_gb: float | None
    baseline_gb: float
    finding: Finding
    figures: Figures | None = None
    performance: Performance | None = None
    failed_mode: str | None = None
    needed_gib: float | None = None  # estimated offload that would make the model fit
    fix_verified: bool | None = None  # --verify-fix: did the prescribed fix make offload work

    @property
    def status(self) -> CompareStatus:
        return self.finding.status

    def to_dict(self) -> Json:
        out: Json = {"offload_gb": self.offload_gb, "baseline_gb": self.baseline_gb}
        if self.figures is not None:
            out.update(self.figures.to_dict())
        if self.performance is not None:
            out["performance"] = self.performance.to_dict()
        out.update(pack(self.finding))
        for key in ("failed_mode", "needed_gib", "fix_verified"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_dict(cls, d: Json) -> Comparison:
        perf = d.get("performance")
        return cls(
            offload_gb=d.get("offload_gb"),
            baseline_gb=d.get("baseline_gb", 0.0),
            finding=_finding(d),
            figures=Figures.from_dict(d) if "requested_gib" in d else None,
            performance=Performance.from_dict(perf) if isinstance(perf, dict) else None,
            failed_mode=d.get("failed_mode"),
            needed_gib=d.get("needed_gib"),
            fix_verified=d.get("fix_verified"),
        )


def _finding(d: Json) -> Finding:
    return Finding(
        status=CompareStatus(d.get("status", "inconclusive")),
        title=d.get("title", ""),
        summary=d.get("summary", ""),
        remedy=d.get("remedy", ""),
        links=tuple(d.get("links") or ()),
        notes=tuple(d.get("notes") or ()),
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    finding: Finding
    per_offload: Mapping[str, str] | None = None

    @property
    def status(self) -> CompareStatus:
        return self.finding.status

    def to_dict(self) -> Json:
        out = pack(self.finding)
        if self.per_offload is not None:
            out["per_offload"] = dict(self.per_offload)
        return out

    @classmethod
    def from_dict(cls, d: Json) -> Verdict:
        return cls(_finding(d), d.get("per_offload"))


@dataclass(frozen=True, slots=True)
class ReportConfig:
    vllm_cmd: tuple[str, ...]
    model: str
    revision: str | None
    served_model_name: str
    baseline_gb: float
    offload_gb: tuple[float, ...]
    max_model_len: int
    host: str
    port: int
    repeats: int
    warmup: int
    stream: bool
    timeout_s: float
    tensor_parallel_size: int
    extra_args: tuple[str, ...]
    request: Mapping[str, Any]
    expect: tuple[str, ...]
    verify_fix: bool | None = None
    exposed: str | None = None  # the --host warning: the servers were reachable from the network

    def to_dict(self) -> Json:
        return pack(self, ("verify_fix", "exposed"))

    @classmethod
    def from_dict(cls, d: Json) -> ReportConfig:
        seq = {"vllm_cmd", "offload_gb", "extra_args", "expect"}
        values: Json = {
            f.name: tuple(d.get(f.name) or ()) if f.name in seq else d.get(f.name)
            for f in fields(cls)
        }
        return cls(**values)


@dataclass(frozen=True, slots=True)
class CompareReport:
    tool_version: str
    started_at: str
    config: ReportConfig
    environment: Mapping[str, str]
    finished_at: str | None = None
    complete: bool = False
    interrupted: bool = False
    modes: tuple[ModeResult, ...] = ()
    comparisons: tuple[Comparison, ...] = ()
    verdict: Verdict = field(
        default_factory=lambda: Verdict(
            Finding(CompareStatus.INCONCLUSIVE, "not finished", "the run has not finished")
        )
    )
    error: str | None = None
    preflight: Json | None = None  # the host and fit questions asked before any server started

    def to_dict(self) -> Json:
        out: Json = {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "offload-doctor", "version": self.tool_version},
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "complete": self.complete,
            "interrupted": self.interrupted,
            "config": self.config.to_dict(),
            "environment": dict(self.environment),
            "modes": [m.to_dict() for m in self.modes],
            "comparisons": [c.to_dict() for c in self.comparisons],
            "verdict": self.verdict.to_dict(),
        }
        if self.error is not None:
            out["error"] = self.error
        if self.preflight is not None:
            out["preflight"] = self.preflight
        return out

    @classmethod
    def from_dict(cls, d: Json) -> CompareReport:
        return cls(
            tool_version=(d.get("tool") or {}).get("version", "?"),
            started_at=d.get("started_at", ""),
            config=ReportConfig.from_dict(d.get("config") or {}),
            environment=d.get("environment") or {},
            finished_at=d.get("finished_at"),
            complete=bool(d.get("complete")),
            interrupted=bool(d.get("interrupted")),
            modes=tuple(ModeResult.from_dict(m) for m in d.get("modes") or []),
            comparisons=tuple(Comparison.from_dict(c) for c in d.get("comparisons") or []),
            verdict=Verdict.from_dict(d.get("verdict") or {}),
            error=d.get("error"),
            preflight=d.get("preflight"),
        )
