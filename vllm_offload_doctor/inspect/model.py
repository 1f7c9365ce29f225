"""What `inspect` found about one server, and its verdict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    EFFECTIVE = "effective"
    IGNORED = "ignored"
    NOT_REQUESTED = "not_requested"
    CANNOT_TELL = "cannot_tell"


@dataclass(slots=True)
class ProcFacts:
    pid: int
    role: str  # api_server, EngineCore, Worker_TP0, ...
    rss_shmem_kb: int | None = None
    vm_rss_kb: int | None = None
    gpu_bytes: int | None = None
    gpu_index: int | None = None
    error: str | None = None  # why /proc/PID/status could not be read


@dataclass(slots=True)
class HttpFacts:
    base_url: str
    models: list[str] = field(default_factory=list)
    version: str | None = None
    kv_cache_tokens: int | None = None
    errors: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ServerFacts:
    pid: int | None  # the API server; None when only the URL answered
    cmdline: list[str] = field(default_factory=list)
    model: str | None = None
    offload_gb: float | None = None  # --cpu-offload-gb as given; None when absent
    tp: int = 1
    max_model_len: int | None = None
    port: int | None = None
    runner_env: dict[str, str] = field(default_factory=dict)  # VLLM_USE_V2_MODEL_RUNNER etc.
    environ_error: str | None = None
    vllm_version: str | None = None
    version_source: str | None = None  # "package metadata of PATH" or "/version"
    procs: list[ProcFacts] = field(default_factory=list)
    http: HttpFacts | None = None
    error: str | None = None  # why the process facts are missing (not Linux, gone, ...)


@dataclass(slots=True)
class RankResult:
    process: str
    pid: int
    shmem_gib: float | None
    held_gib: float | None  # shared memory above the baseline: what offload holds
    verdict: Verdict
    gpu_gib: float | None = None


@dataclass(slots=True)
class Inspection:
    server: ServerFacts
    verdict: Verdict
    reason: str
    fix: str | None = None
    ranks: list[RankResult] = field(default_factory=list)
    host_held_gib: float | None = None
    host_available_gib: float | None = None
    per_token_ms: float | None = None  # lower bound the link predicts per forward pass
    link: str | None = None  # e.g. "PCIe gen5 x16, 67.3 GB/s"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
