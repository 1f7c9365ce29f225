"""Pure data for `analyze`: facts read from a log, findings, the verdict and the offload status."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from vllm_offload_doctor.output.formats import SCHEMA_VERSION


class Category(StrEnum):
    HEALTHY = "healthy"
    OFFLOAD_IGNORED = "offload_ignored"
    OFFLOAD_ERROR = "offload_error"
    OOM_WEIGHTS = "oom_weights"
    OOM_KV_CACHE = "oom_kv_cache"
    OOM_GPU_UTIL = "oom_gpu_util"
    OOM_RUNTIME = "oom_runtime"
    OOM_HOST = "oom_host"
    PORT_IN_USE = "port_in_use"
    MODEL_DOWNLOAD = "model_download"
    UNSUPPORTED_GPU = "unsupported_gpu"
    DRIVER_CUDA = "driver_cuda"
    WSL = "wsl"
    PYTHON_ENV = "python_env"
    BAD_ARGS = "bad_args"
    DISTRIBUTED = "distributed"
    TOKENIZER_TEMPLATE = "tokenizer_template"
    CRASH_OTHER = "crash_other"
    UNKNOWN = "unknown"


class OffloadStatus(StrEnum):
    EFFECTIVE = "effective"
    IGNORED = "ignored"
    ERROR = "error"
    NOT_REQUESTED = "not_requested"
    UNKNOWN = "unknown"


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


@dataclass(frozen=True, slots=True)
class Evidence:
    line: int  # 1-based line number in the input as read
    text: str


@dataclass(frozen=True, slots=True)
class Finding:
    rule_id: str
    title: str
    severity: Severity
    category: Category
    message: str
    remedy: str
    links: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    precedence: int = 0
    # The library message of the stack catalogue the finding rests on: library, file, versions.
    library_message: dict[str, Any] | None = None


@dataclass(slots=True)
class RankOffload:
    """What one process (rank) logged about offloading."""

    process: str
    pid: int | None = None
    offloader: str | None = None
    offloaded_gib: float | None = None
    model_loading_gib: float | None = None
    status: OffloadStatus = OffloadStatus.UNKNOWN


@dataclass(slots=True)
class Facts:
    vllm_version: str | None = None
    model: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    cpu_offload_gb: float | None = None
    offload_backend: str | None = None
    offload_group_size: int | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    tensor_parallel_size: int | None = None
    enforce_eager: bool | None = None
    dtype: str | None = None
    platform: str | None = None
    device_cpu: bool = False
    enable_lora: bool = False
    quantization: str | None = None
    model_runner: str = "unknown"  # v1 | v2 | unknown
    model_runner_evidence: str | None = None
    # 'Model loading took X GiB memory and': V1 from 0.12, V2 from 0.28; without "memory": V2
    # 0.12-0.27.1 (or V1 up to 0.11).
    loading_says_memory: bool | None = None
    offloader: str | None = None
    offloaded_gib: float | None = None  # largest per rank
    prefetch_saved_gb: float | None = None
    model_loading_gib: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_tokens: int | None = None
    gpu_blocks: int | None = None  # '# GPU blocks: N' (V0)
    block_size: int | None = None
    gpu_name: str | None = None
    torch_version: str | None = None  # from pasted collect-env / pip list / check output
    driver_version: str | None = None
    cuda_version: str | None = None
    pasted_reports: list[str] = field(default_factory=list)  # kinds of pasted blocks seen
    gpu_total_gib: float | None = None
    gpu_free_gib: float | None = None
    wsl: bool = False
    pin_memory_disabled: bool = False
    reached_ready: bool = False
    shut_down: bool = False
    stayed_up: bool | None = None  # always null: kept so analyze's JSON keeps its keys (schema 1)
    ranks: dict[str, RankOffload] = field(default_factory=dict)
    # The last CUDA OOM message (GiB): the allocation that failed, the GPU's total and free
    # memory, and what the process held, when the message says.
    oom_tried_gib: float | None = None
    oom_total_gib: float | None = None
    oom_free_gib: float | None = None
    oom_in_use_gib: float | None = None
    # A KV cache shortfall: 'X GiB KV cache is needed, which is larger than ... (Y GiB)'.
    kv_needed_gib: float | None = None
    kv_available_gib: float | None = None
    # 'Engine core initialization failed' / 'Failed core proc(s): {}': the engine core died.
    engine_core_failed: bool = False


@dataclass(frozen=True, slots=True)
class Verdict:
    category: Category
    rule_id: str | None
    title: str
    summary: str
    severity: Severity
    remedy: str = ""
    links: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Offload:
    status: OffloadStatus
    requested_gib: float | None
    offloaded_gib: float | None
    explanation: str
    ranks_disagree: bool = False


@dataclass(frozen=True, slots=True)
class Run:
    """One server start in a log (a restart appended, a crash loop, two writers in one file)."""

    first_line: int
    last_line: int
    verdict: Verdict
    offload: Offload
    facts: Facts
    starts: int = 1  # consecutive starts that ended the same way, merged into this entry


@dataclass(frozen=True, slots=True)
class Analysis:
    file: str
    verdict: Verdict
    offload: Offload
    facts: Facts
    findings: tuple[Finding, ...]
    lines_read: int
    notable: tuple[Evidence, ...] = ()  # most relevant lines when nothing matched
    error: str | None = None  # input problem that still produced a verdict (e.g. truncated gzip)
    notes: tuple[str, ...] = ()  # what the analysis could not do (a rule that timed out)
    # Every start, in order; the fields above are the last start's (the last that decides, when
    # the last is cut off before it shows anything).
    runs: tuple[Run, ...] = ()

    @property
    def failed(self) -> bool:
        return self.verdict.category not in (
            Category.HEALTHY,
            Category.UNKNOWN,
        ) or self.offload.status in (
            OffloadStatus.IGNORED,
            OffloadStatus.ERROR,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["schema_version"] = SCHEMA_VERSION
        return data
