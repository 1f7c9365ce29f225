"""Extract facts (version, args, runner, offload, memory, readiness) from parsed log lines."""

from __future__ import annotations

import ast
import re
from collections import deque
from typing import Any

from vllm_offload_doctor.model import Facts, RankOffload
from vllm_offload_doctor.normalize import Line

_VERSION = (
    re.compile(r"^vLLM (?:API )?server version (?P<v>v?\d+\.\d+[\w.+-]*)"),
    re.compile(r"\s{2,}version\s+(?P<v>\d+\.\d+\.\d+[\w.+-]*)\s*$"),
    re.compile(r"Initializing an? (?:V1 )?LLM engine \(v(?P<v>\d+\.\d+[^)]*)\)"),
    re.compile(r"\bvllm(?:==|-| version:? v?)(?P<v>\d+\.\d+\.\d+[\w.+-]*)"),
)
_MODEL = (
    re.compile(r"^vLLM server version \S+, serving model (?P<m>.+)$"),
    re.compile(r"\s{2,}model\s+(?P<m>\S+)\s*$"),
)
_ARGS = re.compile(r"^non-default args: (?P<d>\{.*)$")
_NAMESPACE = re.compile(r"^args: Namespace\((?P<d>.*)\)?$")
_ENGINE_CFG = re.compile(r"Initializing an? (?:V1 )?LLM engine")
_CFG_ITEM = re.compile(
    r"\b(?P<k>tensor_parallel_size|enforce_eager|dtype|max_seq_len|device_config|model)="
    r"(?P<v>'[^']*'|[^,\s)]+)"
)
_CLI = re.compile(r"(?:vllm serve|vllm\.entrypoints|api_server|LLM\()")
_CLI_FLAG = re.compile(
    r"--(?P<k>cpu-offload-gb|gpu-memory-utilization|max-model-len|tensor-parallel-size|"
    r"offload-backend|offload-group-size|dtype|device|enforce-eager|enable-lora|quantization)(?:[= ]+(?P<v>[^\s-][^\s]*))?"
)
_PY_KW = re.compile(
    r"\b(?P<k>cpu_offload_gb|gpu_memory_utilization|max_model_len|tensor_parallel_size)"
    r"\s*=\s*(?P<v>[\d.]+)"
)
_RUNNER_V2 = re.compile(r"^Using V2 Model Runner")
_RUNNER_V2_LOAD = re.compile(r"^Loading model from scratch\.\.\.")
_RUNNER_V1_LOAD = re.compile(r"^Starting to load model ")
_RUNNER_FALLBACK = re.compile(
    r"^Model [Rr]unner [Vv]2 (?:does not yet support .*|requires Triton); using the [Vv]1 model runner"
)
_OFFLOADER = re.compile(r"^Offloader set to (?P<c>\w+)")
_TOTAL = re.compile(r"^Total CPU offloaded parameters: (?P<g>[\d.]+)")
_PREFETCH = re.compile(
    r"^\[PrefetchOffloader\] Initialized \d+ modules\. Total GPU memory saved: (?P<g>[\d.]+) GB"
)
_LOADING = re.compile(r"^Model loading took (?P<g>-?[\d.]+) GiB(?P<mem> memory)? and")
_LOADING_OLD = re.compile(r"^Loading model weights took (?P<g>[\d.]+) GB")
_KV_MEM = re.compile(r"^Available KV cache memory: (?P<g>-?[\d.]+) GiB")
_KV_TOK = re.compile(r"KV cache size: (?P<t>[\d,]+) tokens")
_KV_OLD = re.compile(r"the rest of the memory reserved for KV Cache is (?P<g>[\d.]+) ?GiB")
_PLATFORM = re.compile(r"^Automatically detected platform (?P<p>\w+)\.")
_CUDA_OOM = re.compile(
    r"GPU (?P<idx>\d+) has a total capac(?:i)?ty of (?P<tot>[\d.]+ [KMG]iB) of which (?P<free>[\d.]+ [KMG]iB) is free"
)
_FREE_ON_DEVICE = re.compile(
    r"Free memory on device (?:\S+ )?\((?P<free>[\d.]+)/(?P<tot>[\d.]+) GiB\)"
)
_GPU_NAME = re.compile(
    r"(?:Your (?P<a>.+?) GPU has compute capability|device '(?P<b>[^']+)' \(with compute capability"
    r"|GPU \d+: (?P<c>NVIDIA [^,(]+))"
)
_WSL = re.compile(
    r"WSL is detected|microsoft-standard-WSL|--cpu-offload-gb is enabled with CUDA graphs on WSL2"
)
_SERVED = re.compile(r'"(?:POST|GET) /v1/(?:chat/)?completions HTTP/1\.[01]" 200')
_SERVING_SETUP = re.compile(
    r"^(?:Available routes are|Route: /v1/|Started server process|Waiting for application startup"
    r"|init engine \(profile, create kv cache, warmup model\) took|Starting vLLM (?:API )?server)"
)
_COPY_OFFLOAD = re.compile(r"Falling back to standard CPU offloading")
_SHUTDOWN = re.compile(r"^(?:Application shutdown complete|Shutting down|Finished server process)")
_FRAME = re.compile(r'^File "(?P<path>[^"]+)", line \d+, in (?P<fn>[\w<>]+)')

# Traceback frames and log lines that say which start-up phase a failure belongs to.
PHASE_FRAMES = {
    "loading": (
        "load_model",
        "load_weights",
        "make_layers",
        "initialize_model",
        "_initialize_model",
        "maybe_offload_to_cpu",
        "wrap_modules",
        "get_model",
        "_init_model",
        "create_weights",
        "init_device",
        "process_weights_after_loading",
    ),
    "profiling": (
        "profile_run",
        "determine_available_memory",
        "determine_num_available_blocks",
        "_dummy_run",
        "_dummy_sampler_run",
        "_dummy_pooler_run",
        "profile",
    ),
    "kv_cache": (
        "check_enough_kv_cache_memory",
        "_check_enough_kv_cache_memory",
        "raise_if_cache_size_invalid",
        "initialize_kv_cache",
        "_initialize_kv_caches",
        "get_kv_cache_config",
        "initialize_cache",
        "_allocate_kv_cache_tensors",
        "allocate_kv_cache",
        "_allocate_kv_cache",
        "initialize_from_config",
    ),
    "graphs": (
        "capture_model",
        "capture",
        "capture_end",
        "_capture_cudagraphs",
        "compile_or_warm_up_model",
    ),
    "runtime": ("execute_model", "sample_tokens", "step", "_process_engine_step", "run_busy_loop"),
}
_FRAME_PHASE = {fn: phase for phase, fns in PHASE_FRAMES.items() for fn in fns}
_PHASE_LINES = (
    (
        re.compile(
            r"^(?:Starting to load model|Loading model from scratch|Loading weights|Loading safetensors)"
        ),
        "loading",
    ),
    (re.compile(r"^(?:Model loading took|Loading model weights took)"), "loaded"),
    (re.compile(r"(?i)memory profiling|^Memory profiling takes"), "profiling"),
    (
        re.compile(
            r"^(?:Available KV cache memory|GPU KV cache size|# GPU blocks|# cpu blocks)", re.I
        ),
        "kv_cache",
    ),
    (
        re.compile(
            r"(?i)^(?:Capturing (?:CUDA graph|cudagraphs|the model for CUDA graphs)|Graph capturing finished)"
        ),
        "graphs",
    ),
    (re.compile(r"^(?:Application startup complete|Uvicorn running on)"), "ready"),
)
CODE_HINTS = (
    (re.compile(r"\blogits\b|sampler|topk_topp|\.sample\(|execute_model|generate\("), "runtime"),
    (re.compile(r"load_weights|weight_loader|load_model\("), "loading"),
    (re.compile(r"cuda\.graph|capture"), "graphs"),
    (re.compile(r"kv_cache"), "kv_cache"),
)
MAX_FRAMES = 5000
PHASES = ("start", "loading", "loaded", "profiling", "kv_cache", "graphs", "ready", "runtime")


def _num(value: str) -> float | None:
    try:
        return float(value.replace(",", ""))
    except ValueError:
        return None


def _gib(text: str) -> float | None:
    num, _, unit = text.partition(" ")
    value = _num(num)
    if value is None:
        return None
    return value * {"KiB": 2**-20, "MiB": 2**-10, "GiB": 1.0}.get(unit, 1.0)


class FactCollector:
    """Feeds on lines in order; keeps only bounded state."""

    def __init__(self) -> None:
        self.facts = Facts()
        self.phase = "start"
        self.frames: deque[tuple[int, str]] = deque(maxlen=MAX_FRAMES)
        self.served_requests = 0
        self.cli_args: dict[str, Any] = {}
        self.serving_setup = False
        self.args_evidence: tuple[int, str] | None = None
        self.copy_offload = False

    def feed(self, line: Line) -> None:
        msg = line.msg
        f = self.facts
        if msg.startswith("File "):
            fm = _FRAME.match(msg)
            if fm:
                self.frames.append((line.no, fm.group("fn")))
            return
        for rx, phase in _PHASE_LINES:
            if rx.search(msg):
                if phase == "ready":
                    f.reached_ready = True
                if PHASES.index(phase) > PHASES.index(self.phase):
                    self.phase = phase
                break
        self._identity(line)
        self._runner_and_offload(line)
        self._memory(line)
        if _WSL.search(msg):
            f.wsl = True
            if "pin_memory=False" in msg:
                f.pin_memory_disabled = True
        if _SERVING_SETUP.match(msg):
            self.serving_setup = True
        if _COPY_OFFLOAD.search(msg):
            f.offloader = f.offloader or "copy-per-forward fallback"
            self.copy_offload = True
        if _SERVED.search(msg):
            self.served_requests += 1
        if _SHUTDOWN.match(msg) and f.reached_ready:
            f.shut_down = True

    def _identity(self, line: Line) -> None:
        msg, f = line.msg, self.facts
        if f.vllm_version is None and ("ersion" in msg or "LLM engine" in msg or "vllm" in msg):
            for rx in _VERSION:
                m = rx.search(msg)
                if m:
                    f.vllm_version = m.group("v").lstrip("v")
                    break
        if f.model is None:
            for rx in _MODEL:
                m = rx.search(msg)
                if m:
                    f.model = m.group("m").strip()
        m = _ARGS.match(msg)
        if m:
            self._apply_args(_parse_dict(m.group("d")))
            self.args_evidence = (line.no, line.text[:600])
            return
        m = _NAMESPACE.match(msg)
        if m:
            self._apply_args(
                {k: _literal(v) for k, v in re.findall(r"(\w+)=('[^']*'|[^,]+)", m.group("d"))}
            )
            return
        if _ENGINE_CFG.search(msg):
            for cm in _CFG_ITEM.finditer(msg):
                k, v = cm.group("k"), cm.group("v").strip("'")
                if k == "device_config" and v == "cpu":
                    f.device_cpu = True
                elif k == "model" and f.model is None:
                    f.model = v
                elif k == "tensor_parallel_size" and f.tensor_parallel_size is None:
                    f.tensor_parallel_size = int(v) if v.isdigit() else None
                elif k == "enforce_eager" and f.enforce_eager is None:
                    f.enforce_eager = v == "True"
                elif k == "dtype" and f.dtype is None:
                    f.dtype = v.replace("torch.", "")
                elif k == "max_seq_len" and f.max_model_len is None and v.isdigit():
                    f.max_model_len = int(v)
            return
        if _CLI.search(line.text):
            args: dict[str, Any] = {}
            for fm in _CLI_FLAG.finditer(line.text):
                key = fm.group("k").replace("-", "_")
                args[key] = _literal(fm.group("v")) if fm.group("v") else True
            for km in _PY_KW.finditer(line.text):
                args[km.group("k")] = _literal(km.group("v"))
            if args:
                self.cli_args.update(args)
        m = _PLATFORM.match(msg)
        if m:
            f.platform = m.group("p")

    def _apply_args(self, args: dict[str, Any]) -> None:
        f = self.facts
        f.args.update(args)
        if f.model is None and isinstance(args.get("model"), str):
            f.model = args["model"]

    def _runner_and_offload(self, line: Line) -> None:
        msg, f = line.msg, self.facts
        if _RUNNER_V2.match(msg) or _RUNNER_V2_LOAD.match(msg):
            if f.model_runner != "v1" or _RUNNER_V2.match(msg):
                f.model_runner, f.model_runner_evidence = "v2", f"{line.no}: {msg}"
            return
        if _RUNNER_V1_LOAD.match(msg) or _RUNNER_FALLBACK.match(msg):
            f.model_runner, f.model_runner_evidence = "v1", f"{line.no}: {msg}"
            return
        m = _OFFLOADER.match(msg)
        if m:
            cls = m.group("c")
            if cls != "NoopOffloader" or f.offloader is None:
                f.offloader = cls
            self._rank(line).offloader = cls
            return
        m = _TOTAL.match(msg)
        if m:
            gib = _num(m.group("g"))
            rank = self._rank(line)
            if gib is not None:
                rank.offloaded_gib = max(rank.offloaded_gib or 0.0, gib)
                f.offloaded_gib = max(f.offloaded_gib or 0.0, gib)
            return
        m = _PREFETCH.match(msg)
        if m:
            f.prefetch_saved_gb = _num(m.group("g"))
            f.offloader = f.offloader or "PrefetchOffloader"

    def _memory(self, line: Line) -> None:
        msg, f = line.msg, self.facts
        m = _LOADING.match(msg) or _LOADING_OLD.match(msg)
        if m:
            gib = _num(m.group("g"))
            if gib is not None:
                self._rank(line).model_loading_gib = gib
                f.model_loading_gib = (
                    gib if f.model_loading_gib is None else max(f.model_loading_gib, gib)
                )
            if m.re is _LOADING and not m.group("mem") and f.model_runner == "unknown":
                # V2 spells it without "memory" in 0.12-0.27.1; V1 did so only up to 0.11.
                f.model_runner_evidence = f"{line.no}: {msg}"
                f.model_runner = "v2?"
            return
        m = _KV_MEM.match(msg) or _KV_OLD.search(msg)
        if m:
            f.kv_cache_gib = _num(m.group("g"))
            return
        m = _KV_TOK.search(msg)
        if m:
            tokens = _num(m.group("t"))
            f.kv_cache_tokens = int(tokens) if tokens is not None else None
            return
        m = _CUDA_OOM.search(msg)
        if m:
            f.gpu_total_gib = _gib(m.group("tot"))
            f.gpu_free_gib = _gib(m.group("free"))
            return
        m = _FREE_ON_DEVICE.search(msg)
        if m:
            f.gpu_free_gib = _num(m.group("free"))
            f.gpu_total_gib = _num(m.group("tot"))
        m = _GPU_NAME.search(msg)
        if m and f.gpu_name is None:
            f.gpu_name = (m.group("a") or m.group("b") or m.group("c") or "").strip() or None

    def _rank(self, line: Line) -> RankOffload:
        # Names like Worker_TP1 or "VllmWorker rank=3" identify a rank; Ray/V0 workers need the pid.
        key = line.proc or "main"
        if line.pid is not None and not any(ch.isdigit() for ch in key) and key != "EngineCore":
            key = f"{key} pid={line.pid}"
        rank = self.facts.ranks.get(key)
        if rank is None:
            if len(self.facts.ranks) >= 64:
                return RankOffload(key)
            rank = self.facts.ranks[key] = RankOffload(key, line.pid)
        return rank

    def _merge_ranks(self) -> None:
        """Records logged before a worker is named (`Worker pid=N`) belong to the rank with that pid."""
        ranks = self.facts.ranks
        named = {r.pid: r for k, r in ranks.items() if " pid=" not in k and r.pid is not None}
        for key in [k for k in ranks if " pid=" in k]:
            early = ranks[key]
            target = named.get(early.pid) if early.pid is not None else None
            if target is None:
                continue
            target.offloader = target.offloader or early.offloader
            if early.offloaded_gib is not None:
                target.offloaded_gib = max(target.offloaded_gib or 0.0, early.offloaded_gib)
            if target.model_loading_gib is None:
                target.model_loading_gib = early.model_loading_gib
            del ranks[key]

    def finish(self) -> Facts:
        """Resolve the args from all sources into typed facts."""
        f = self.facts
        self._merge_ranks()
        args = {**self.cli_args, **f.args}
        f.cpu_offload_gb = _float(args.get("cpu_offload_gb"))
        f.offload_backend = _str(args.get("offload_backend"))
        group = _float(args.get("offload_group_size"))
        f.offload_group_size = int(group) if group is not None else None
        f.gpu_memory_utilization = _float(args.get("gpu_memory_utilization"))
        mml = _float(args.get("max_model_len"))
        if mml is not None:
            f.max_model_len = int(mml)
        tp = _float(args.get("tensor_parallel_size"))
        if tp is not None:
            f.tensor_parallel_size = int(tp)
        if "enforce_eager" in args:
            f.enforce_eager = bool(args["enforce_eager"])
        if isinstance(args.get("dtype"), str):
            f.dtype = args["dtype"]
        if args.get("device") == "cpu":
            f.device_cpu = True
        f.enable_lora = bool(args.get("enable_lora"))
        if isinstance(args.get("quantization"), str):
            f.quantization = args["quantization"]
        if f.reached_ready or self.served_requests:
            f.reached_ready = True
        return f


def _parse_dict(text: str) -> dict[str, Any]:
    text = text.strip()
    try:
        value = ast.literal_eval(text)
        if isinstance(value, dict):
            return {str(k): v for k, v in value.items()}
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    # Truncated or wrapped: take the simple key/value pairs we can read.
    out: dict[str, Any] = {}
    for k, v in re.findall(r"'(\w+)': ('[^']*'|[-\d.e]+|True|False|None)", text):
        out[k] = _literal(v)
    return out


def _literal(value: str) -> Any:
    value = value.strip().rstrip(",")
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return _num(value)
    return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def phase_of_frames(frames: list[str]) -> str | None:
    """The start-up phase named by the innermost recognisable frame."""
    for fn in reversed(frames):
        phase = _FRAME_PHASE.get(fn)
        if phase:
            return phase
    return None
