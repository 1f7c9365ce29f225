"""Extract facts (version, args, runner, offload, memory, readiness) from parsed log lines.

Adding a fact: declare its pattern with `declare(pattern, *words)` (patterns.py), where the
words are literals of which every match contains one. They are analyze's prefilter words and
the pattern's gate on every path, so nothing else needs editing (no keyword list elsewhere).
Adding a start-up phase: a row of PHASE_TABLE (compare's live display reads the same table).
"""

from __future__ import annotations

import ast
import functools
import re
from collections import deque
from typing import Any

from vllm_offload_doctor.analyze.model import Facts, RankOffload
from vllm_offload_doctor.analyze.normalize import Line
from vllm_offload_doctor.analyze.patterns import (
    MAX_TEXT,
    Declared,
    declare,
    declared,
    literal_matcher,
    span_finder,
)
from vllm_offload_doctor.redact import scrub_cut

_VERSION = (
    declare(r"^vLLM (?:API )?server version (?P<v>v?\d+\.\d+[\w.+-]*)", "version"),
    declare(r"(?<!\s)\s{2,}+version\s++(?P<v>\d+\.\d+\.\d+[\w.+-]*+)\s*$", "version"),
    declare(r"Initializing an? (?:V1 )?LLM engine \(v(?P<v>\d+\.\d+[^)]*)\)", "LLM engine (v"),
    declare(
        r"\bvllm(?:==|-| version:? v?)(?P<v>\d+\.\d+\.\d+[\w.+-]*)",
        "vllm==",
        "vllm version",
        *(f"vllm-{d}" for d in "0123456789"),
    ),
)
_MODEL = (
    declare(r"^vLLM server version \S+, serving model (?P<m>.+)$", "serving model"),
    # The banner pads `model` to the width of `version`: at least two blanks on each side.
    declare(r"(?<!\s)\s{2,}+model\s{2,}+(?P<m>\S+)\s*$", "model  ", "model\t", "model \t"),
)
_ARGS = declare(r"^non-default args: (?P<d>\{.*)$", "non-default args: ")
_NAMESPACE = declare(r"^args: Namespace\((?P<d>.*)\)?$", "args: Namespace(")
_NS_ITEM = re.compile(r"(?<!\w)(\w++)=('[^']*'|[^,]+)")
_ENGINE_CFG = declare(r"Initializing an? (?:V1 )?LLM engine", "LLM engine")
_CFG_ITEM = re.compile(
    r"\b(?P<k>tensor_parallel_size|enforce_eager|dtype|max_seq_len|device_config|model)="
    r"(?P<v>'[^']*'|[^,\s)]+)"
)
_CLI = declare(
    r"(?:vllm serve|vllm\.entrypoints|api_server|LLM\()",
    "vllm serve",
    "vllm.entrypoints",
    "api_server",
    "LLM(",
)
_CLI_FLAG = re.compile(
    r"--(?P<k>cpu-offload-gb|gpu-memory-utilization|max-model-len|tensor-parallel-size|"
    r"offload-backend|offload-group-size|dtype|device|enforce-eager|enable-lora|quantization)(?:[= ]+(?P<v>[^\s-][^\s]*))?"
)
_PY_KW = re.compile(
    r"\b(?P<k>cpu_offload_gb|gpu_memory_utilization|max_model_len|tensor_parallel_size)"
    r"\s*=\s*(?P<v>[\d.]+)"
)
_RUNNER_V2 = declare(r"^Using V2 Model Runner", "Using V2 Model Runner")
_RUNNER_V2_LOAD = declare(r"^Loading model from scratch\.\.\.", "Loading model from scratch")
_RUNNER_V1_LOAD = declare(r"^Starting to load model ", "Starting to load model")
_RUNNER_FALLBACK = declare(
    r"^Model [Rr]unner [Vv]2 (?:does not yet support .*|requires Triton); using the [Vv]1 model runner",
    "model runner",
    icase=True,
)
_OFFLOADER = declare(r"^Offloader set to (?P<c>\w+)", "Offloader set to")
_TOTAL = declare(r"^Total CPU offloaded parameters: (?P<g>[\d.]+)", "Total CPU offloaded")
_PREFETCH = declare(
    r"^\[PrefetchOffloader\] Initialized \d+ modules\. Total GPU memory saved: (?P<g>[\d.]+) GB",
    "[PrefetchOffloader]",
)
_LOADING = declare(
    r"^Model loading took (?P<g>-?[\d.]+) GiB(?P<mem> memory)? and", "Model loading took"
)
# 'GB' up to 0.8.2 (V0 'Loading model weights took' <=0.7.3, 'Model loading took ... GB and' 0.8.0-0.8.2).
_LOADING_OLD = declare(
    r"^(?:Loading model weights|Model loading) took (?P<g>[\d.]+) Gi?B\b",
    "Loading model weights took",
    "Model loading took",
)
_KV_MEM = declare(r"^Available KV cache memory: (?P<g>-?[\d.]+) GiB", "Available KV cache memory")
_KV_TOK = declare(r"KV cache size: (?P<t>[\d,]+) tokens", "KV cache size: ")
_KV_OLD = declare(
    r"the rest of the memory reserved for KV Cache is (?P<g>-?[\d.]+) ?GiB", "reserved for KV Cache"
)
_PLATFORM = declare(r"^Automatically detected platform (?P<p>\w+)\.", "detected platform")
# torch's CUDA OOM message: what was asked for, the GPU's total and free memory, this process's use.
_CUDA_OOM = declare(
    r"(?:Tried to allocate (?P<tried>[\d.]{1,12} (?:bytes|[KMG]iB))\. )?"
    r"GPU (?P<idx>\d+) has a total capac(?:i)?ty of (?P<tot>[\d.]+ [KMG]iB) of which (?P<free>[\d.]+ [KMG]iB) is free"
    r"(?:\. Including non-PyTorch memory, this process has (?P<used>[\d.]{1,12} (?:bytes|[KMG]iB)) memory in use)?",
    "has a total capac",
)
_KV_NEEDED = declare(
    r"\((?P<need>[\d.]{1,12}) GiB KV cache is needed, which is larger than the available KV cache "
    r"memory \((?P<avail>-?[\d.]{1,12}) GiB\)",
    "KV cache is needed",
)
_FREE_ON_DEVICE = declare(
    r"Free memory on device (?:\S+ )?\((?P<free>[\d.]+)/(?P<tot>[\d.]+) GiB\)",
    "Free memory on device",
)
_GPU_NAME = declare(
    r"(?:Your (?P<a>.{1,120}?) GPU has compute capability|device '(?P<b>[^']+)' \(with compute capability"
    r"|GPU \d+: (?P<c>NVIDIA [^,(]+))",
    "compute capability",
    ": NVIDIA ",
)
_WSL = declare(
    r"WSL is detected|microsoft-standard-WSL|--cpu-offload-gb is enabled with CUDA graphs on WSL2",
    "WSL",
)
_SERVED = declare(
    r'"(?:POST|GET) /v1/(?:chat/)?completions HTTP/1\.[01]" 200',
    "/completions HTTP/1.",
    until_served=True,
)
_SERVING_SETUP = declare(
    r"^(?:Available routes are|Route: /v1/|Started server process|Waiting for application startup"
    r"|init engine \(profile, create kv cache, warmup model\) took|Starting vLLM (?:API )?server)",
    "Available routes are",
    "Route: /v1/",
    "Started server process",
    "Waiting for application startup",
    "init engine (profile",
    "Starting vLLM",
)
# The engine core's start-up wrapper: the engine died, whatever the log shows above it.
_ENGINE_GONE = declare(
    r"Engine core initialization failed|Failed core proc\(s\): \{\}",
    "Engine core initialization failed",
    "Failed core proc(s): {}",
)
_COPY_OFFLOAD = declare(r"Falling back to standard CPU offloading", "standard CPU offloading")
_SHUTDOWN = declare(
    r"^(?:Application shutdown complete|Shutting down|Finished server process)",
    "Application shutdown complete",
    "Shutting down",
    "Finished server process",
)
# Python tracebacks, faulthandler dumps (no comma before "in") and frames whose start was cut off.
_FRAME = declare(r'(?:^|File ")(?P<path>[^"]*)"?, line \d+,? in (?P<fn>[\w<>]+)', ", line ")
# V0 names the platform: '# GPU blocks' <=0.6.6, '# CUDA blocks' (dispatch key) 0.7.0-0.7.2, '# cuda blocks'
# or '# rocm blocks' (device name) 0.7.3-0.11.0.
_GPU_BLOCKS = declare(
    r"# (?:gpu|cuda|rocm|xpu|tpu|hpu) blocks: (?P<n>\d+)",
    *(
        "# gpu blocks",
        "# cuda blocks",
        "# rocm blocks",
        "# xpu blocks",
        "# tpu blocks",
        "# hpu blocks",
    ),
    icase=True,
    flags=re.I,
)
# The engine ran requests: V0/V1 throughput lines, an offline run's prompt progress past zero.
_ENGINE_RUNNING = declare(
    r"Avg prompt throughput: [\d.]+ tokens/s|^Processed prompts:\s+\d+%.*?\b[1-9]\d*/\d+ \[",
    "Avg prompt throughput",
    "Processed prompts:",
    until_served=True,
)
# The engine finished start-up: graph capture done (V0 line, V1 progress bars at 100%).
_ENGINE_UP = declare(
    r"^Graph capturing finished in|^Capturing CUDA graphs \([^)]*\): 100%|^init engine \(profile, create kv cache",
    "Graph capturing finished in",
    "Capturing CUDA graphs (",
    "init engine (profile",
)

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
# Start-up phases in order, shared by analyze (key: rules' `phase` / `error_phase`) and by
# compare's live display (display). A row with key None only moves the display.
PHASE_TABLE: tuple[tuple[str | None, str, Declared], ...] = (
    (
        None,
        "starting",
        declare(
            r"^non-default args:|Initializing an? (?:V1 )?LLM engine",
            "non-default args:",
            "LLM engine",
        ),
    ),
    (
        "loading",
        "loading weights",
        declare(
            r"^(?:Starting to load model|Loading model from scratch|Loading weights|Loading safetensors)",
            *(
                "Starting to load model",
                "Loading model from scratch",
                "Loading weights",
                "Loading safetensors",
            ),
        ),
    ),
    (
        "loaded",
        "loading weights",
        declare(
            r"^(?:Model loading took|Loading model weights took)",
            "Model loading took",
            "Loading model weights took",
        ),
    ),
    (
        None,
        "torch.compile",
        declare(
            r"Dynamo bytecode transform|Compiling a graph|torch\.compile took",
            *("Dynamo bytecode transform", "Compiling a graph", "torch.compile took"),
        ),
    ),
    (
        "profiling",
        "profiling",
        declare(
            r"(?i)memory profiling|^Memory profiling takes|^Initial profiling/warmup run"
            r"|^Profiling CUDA graph memory",
            *("memory profiling", "initial profiling/warmup run", "profiling cuda graph memory"),
            icase=True,
        ),
    ),
    (
        "kv_cache",
        "KV cache",
        declare(
            # The pool is 'GPU' up to 0.29, then the device ('GPU', 'XPU', 'GPU + host').
            r"^(?:Available KV cache memory|[A-Z]+(?: \+ host)? KV cache size: |# (?:gpu|cuda|rocm|xpu|tpu|hpu|cpu) blocks)",
            *(
                "available kv cache memory",
                "kv cache size: ",
                "# gpu blocks",
                "# cpu blocks",
                "# cuda blocks",
            ),
            *("# rocm blocks", "# xpu blocks", "# tpu blocks", "# hpu blocks"),
            icase=True,
            flags=re.I,
        ),
    ),
    (
        "graphs",
        "CUDA graphs",
        declare(
            r"(?i)^(?:Capturing (?:CUDA graph|cudagraphs|the model for CUDA graphs)|Graph capturing finished)",
            "capturing ",
            "graph capturing finished",
            icase=True,
        ),
    ),
    (
        None,
        "starting API server",
        declare(
            r"^(?:init engine \(profile|Starting vLLM (?:API )?server|Available routes)",
            *("init engine (profile", "Starting vLLM", "Available routes"),
        ),
    ),
    (
        "ready",
        "ready",
        declare(
            r"^(?:Application startup complete|Uvicorn running on)",
            "Application startup complete",
            "Uvicorn running on",
        ),
    ),
)
CODE_HINTS = (
    (
        declare(
            r"\blogits\b|sampler|topk_topp|\.sample\(|execute_model|generate\(",
            *("logits", "sampler", "topk_topp", ".sample(", "execute_model", "generate("),
        ),
        "runtime",
    ),
    (
        declare(
            r"load_weights|weight_loader|load_model\(",
            "load_weights",
            "weight_loader",
            "load_model(",
        ),
        "loading",
    ),
    (declare(r"cuda\.graph|capture", "cuda.graph", "capture"), "graphs"),
    (declare(r"kv_cache", "kv_cache"), "kv_cache"),
)
MAX_FRAMES = 5000
MAX_FIRST_FRAMES = 1000
_NOT_FED = (_FRAME, *(rx for rx, _ in CODE_HINTS))  # frames are replayed; hints read the context


@functools.cache
def _fact_words() -> Any:
    """Every word a fact pattern of this module other than those needs: a line holding none of
    them (in its text, which contains its message) changes no fact, whatever `feed` is asked.
    Made on first use, so a pattern declared anywhere in this module counts."""
    return span_finder(
        literal_matcher(
            sorted(
                {
                    (w, d.icase)
                    for d in declared()
                    if d.owner == __name__ and d not in _NOT_FED
                    for w in d.words
                }
            )
        )
    )


PHASES = ("start", *dict.fromkeys(k for k, _, _ in PHASE_TABLE if k), "runtime")


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
    return value * {"bytes": 2**-30, "KiB": 2**-20, "MiB": 2**-10, "GiB": 1.0}.get(unit, 1.0)


def _gib3(text: str | None) -> float | None:
    """GiB to three places (a unitless number is GiB)."""
    value = _gib(text) if text is not None else None
    return None if value is None else round(value, 3)


# What a line says about the facts: (what, value...) steps that FactCollector.apply takes in
# order. A pure function of the message and text (never of pid, time or line number), so the
# engine keeps it with the line's plan and applies it again for a repeat of the line.
Ops = tuple[tuple[Any, ...], ...]


def frame_of(msg: str) -> tuple[str, str] | None:
    """(function, path) of a traceback frame line."""
    if ", line " in msg:
        fm = _FRAME.search(msg)
        if fm:
            return fm.group("fn"), fm.group("path")
    return None


def touches(text: str) -> bool:
    """Whether a line with this text could change a fact other than the traceback frames."""
    return _fact_words()(text.encode(), 0) is not None


def extract(msg: str, text: str) -> Ops:
    """The steps a line other than a frame takes on the facts (see Ops)."""
    if not touches(text):
        return ()  # one scan for every fact word: most lines hold none
    ops: list[tuple[Any, ...]] = []
    for phase, _, rx in PHASE_TABLE:
        if phase and rx.search(msg):
            ops.append(("phase", phase))
            break
    _identity(msg, text, ops)
    _runner_and_offload(msg, ops)
    _memory(msg, ops)
    if _WSL.search(msg):
        ops.append(("wsl", "pin_memory=False" in msg))
    if _SERVING_SETUP.match(msg):
        ops.append(("serving_setup",))
    if _ENGINE_GONE.search(msg):
        ops.append(("engine_gone",))
    if _COPY_OFFLOAD.search(msg):
        ops.append(("copy_offload",))
    if _SERVED.search(msg) or _ENGINE_RUNNING.search(msg):
        ops.append(("served",))
    if _ENGINE_UP.search(msg):
        ops.append(("serving_setup",))
    if _SHUTDOWN.match(msg):
        ops.append(("shutdown",))
    return tuple(ops)


def _identity(msg: str, text: str, ops: list[tuple[Any, ...]]) -> None:
    if "ersion" in msg or "LLM engine" in msg or "vllm" in msg:
        for rx in _VERSION:
            m = rx.search(msg)
            if m:
                ops.append(("version", m.group("v").lstrip("v")))
                break
    model = None
    for rx in _MODEL:
        m = rx.search(msg)
        if m:
            model = m.group("m").strip()  # the last pattern's that matches
    if model is not None:
        ops.append(("model", model))
    m = _ARGS.match(msg)
    if m:
        ops.append(("args", _parse_dict(m.group("d")), True))
        return
    m = _NAMESPACE.match(msg)
    if m:
        ops.append(("args", {k: _literal(v) for k, v in _ns_items(m.group("d"))}, False))
        return
    if _ENGINE_CFG.search(msg):
        ops.append(("cfg", _cfg_items(msg[:MAX_TEXT])))
        return
    if _CLI.search(text):
        args: dict[str, Any] = {}
        for fm in _CLI_FLAG.finditer(text[:MAX_TEXT]):
            key = fm.group("k").replace("-", "_")
            args[key] = _literal(fm.group("v")) if fm.group("v") else True
        for km in _PY_KW.finditer(text[:MAX_TEXT]):
            args[km.group("k")] = _literal(km.group("v"))
        if args:
            ops.append(("cli", args))
    m = _PLATFORM.match(msg)
    if m:
        ops.append(("platform", m.group("p")))


def _runner_and_offload(msg: str, ops: list[tuple[Any, ...]]) -> None:
    banner = _RUNNER_V2.match(msg) is not None
    if banner or _RUNNER_V2_LOAD.match(msg):
        ops.append(("runner", "v2", banner))
        return
    if _RUNNER_V1_LOAD.match(msg) or _RUNNER_FALLBACK.match(msg):
        ops.append(("runner", "v1", False))
        return
    m = _OFFLOADER.match(msg)
    if m:
        ops.append(("offloader", m.group("c")))
        return
    m = _TOTAL.match(msg)
    if m:
        ops.append(("total", _num(m.group("g"))))
        return
    m = _PREFETCH.match(msg)
    if m:
        ops.append(("prefetch", _num(m.group("g"))))


def _memory(msg: str, ops: list[tuple[Any, ...]]) -> None:
    m = _LOADING.match(msg) or _LOADING_OLD.match(msg)
    if m:
        new = m.re is _LOADING.rx
        ops.append(("loading", _num(m.group("g")), new, new and bool(m.group("mem"))))
        return
    m = _KV_MEM.match(msg) or _KV_OLD.search(msg)
    if m:
        ops.append(("kv_cache_gib", _num(m.group("g"))))
        return
    m = _GPU_BLOCKS.search(msg)
    if m:
        ops.append(("gpu_blocks", int(m.group("n"))))
        return
    m = _KV_TOK.search(msg)
    if m:
        tokens = _num(m.group("t"))
        ops.append(("kv_tokens", int(tokens) if tokens is not None else None))
        return
    m = _KV_NEEDED.search(msg)
    if m:
        ops.append(("kv_needed", _gib3(m.group("need")), _gib3(m.group("avail"))))
        return
    m = _CUDA_OOM.search(msg)
    if m:
        tried = None
        if m.group("tried"):
            tried = (
                _gib3(m.group("tried")),
                _gib3(m.group("tot")),
                _gib3(m.group("free")),
                _gib3(m.group("used")),
            )
        ops.append(("oom", _gib(m.group("tot")), _gib(m.group("free")), tried))
        return
    m = _FREE_ON_DEVICE.search(msg)
    if m:
        ops.append(("free", _num(m.group("free")), _num(m.group("tot"))))
    m = _GPU_NAME.search(msg)
    if m:
        ops.append(
            ("gpu_name", (m.group("a") or m.group("b") or m.group("c") or "").strip() or None)
        )


class FactCollector:
    """Feeds on lines in order; keeps only bounded state."""

    def __init__(self) -> None:
        self.facts = Facts()
        self.phase = "start"
        self.frames: deque[tuple[int, str, str]] = deque(maxlen=MAX_FRAMES)  # line, function, path
        # The first frames too: a crash loop's later tracebacks must not push out the first one,
        # which its findings' first evidence lines point at.
        self.first_frames: list[tuple[int, str, str]] = []
        self.frames_seen = 0
        self.served_requests = 0
        self.cli_args: dict[str, Any] = {}
        self.serving_setup = False
        self.args_evidence: tuple[int, str] | None = None
        self.copy_offload = False
        # The line each number-valued fact came from: evidence for rules that rest on numbers.
        self.number_lines: dict[str, tuple[int, str]] = {}

    def add_frame(self, no: int, fn: str, path: str) -> None:
        frame = (no, fn, path)
        self.frames.append(frame)
        if len(self.first_frames) < MAX_FIRST_FRAMES:
            self.first_frames.append(frame)
        self.frames_seen += 1

    def all_frames(self) -> list[tuple[int, str, str]]:
        """The first and the last frames, in order, each once."""
        overlap = len(self.first_frames) + len(self.frames) - self.frames_seen
        return [*self.first_frames, *list(self.frames)[max(0, overlap) :]]

    def feed(self, line: Line) -> None:
        frame = frame_of(line.msg)
        if frame is not None:
            self.add_frame(line.no, *frame)
            return
        self.apply(extract(line.msg, line.text), line.no, line.text, line.msg, line.proc, line.pid)

    def apply(
        self, ops: Ops, no: int, text: str, msg: str, proc: str | None, pid: int | None
    ) -> None:
        """Do what `extract` found a line to say, on the facts so far (a line's no, cleaned text,
        message, process and pid: what `extract` does not read)."""
        f = self.facts
        for op in ops:
            what = op[0]
            if what == "phase":
                phase = op[1]
                if phase == "ready":
                    f.reached_ready = True
                if PHASES.index(phase) > PHASES.index(self.phase):
                    self.phase = phase
            elif what == "version":
                if f.vllm_version is None:
                    f.vllm_version = op[1]
            elif what == "model":
                if f.model is None:
                    f.model = op[1]
            elif what == "args":
                f.args.update(op[1])
                if f.model is None and isinstance(op[1].get("model"), str):
                    f.model = op[1]["model"]
                if op[2]:
                    self.args_evidence = (no, scrub_cut(text, 600))
            elif what == "cfg":
                self._engine_config(op[1])
            elif what == "cli":
                self.cli_args.update(op[1])
            elif what == "platform":
                f.platform = op[1]
            elif what == "runner":
                # The V2 banner is the telling line: a later "Loading model from scratch" must
                # not replace it.
                if op[1] != "v2" or op[2] or f.model_runner not in ("v1", "v2"):
                    f.model_runner, f.model_runner_evidence = op[1], f"{no}: {msg}"
            elif what == "offloader":
                if op[1] != "NoopOffloader" or f.offloader is None:
                    f.offloader = op[1]
                self._rank(proc, pid).offloader = op[1]
            elif what == "total":
                rank = self._rank(proc, pid)
                if op[1] is not None:
                    rank.offloaded_gib = max(rank.offloaded_gib or 0.0, op[1])
                    f.offloaded_gib = max(f.offloaded_gib or 0.0, op[1])
            elif what == "prefetch":
                f.prefetch_saved_gb = op[1]
                f.offloader = f.offloader or "PrefetchOffloader"
            elif what == "loading":
                _, gib, new, says_memory = op
                if gib is not None:
                    self._rank(proc, pid).model_loading_gib = gib
                    f.model_loading_gib = (
                        gib if f.model_loading_gib is None else max(f.model_loading_gib, gib)
                    )
                if new:
                    f.loading_says_memory = says_memory
                if new and not says_memory and f.model_runner == "unknown":
                    # V2 spells it without "memory" in 0.12-0.27.1; V1 did so only up to 0.11.
                    f.model_runner_evidence = f"{no}: {msg}"
                    f.model_runner = "v2?"
            elif what in ("kv_cache_gib", "gpu_blocks"):
                setattr(f, what, op[1])
                if what not in self.number_lines:
                    self.number_lines[what] = (no, scrub_cut(text, 600))
            elif what == "kv_tokens":
                f.kv_cache_tokens = op[1]
            elif what == "kv_needed":
                f.kv_needed_gib, f.kv_available_gib = op[1], op[2]
            elif what == "oom":
                f.gpu_total_gib, f.gpu_free_gib = op[1], op[2]
                if op[3] is not None:  # the last complete message's figures, to the MiB
                    f.oom_tried_gib, f.oom_total_gib, f.oom_free_gib, f.oom_in_use_gib = op[3]
            elif what == "free":
                f.gpu_free_gib, f.gpu_total_gib = op[1], op[2]
            elif what == "gpu_name":
                if f.gpu_name is None:
                    f.gpu_name = op[1]
            elif what == "wsl":
                f.wsl = True
                if op[1]:
                    f.pin_memory_disabled = True
            elif what == "serving_setup":
                self.serving_setup = True
            elif what == "engine_gone":
                f.engine_core_failed = True
            elif what == "copy_offload":
                f.offloader = f.offloader or "copy-per-forward fallback"
                self.copy_offload = True
            elif what == "served":
                self.served_requests += 1
            elif what == "shutdown" and f.reached_ready:
                f.shut_down = True

    def _engine_config(self, items: tuple[tuple[str, str], ...]) -> None:
        f = self.facts
        for k, v in items:
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

    def _rank(self, proc: str | None, pid: int | None) -> RankOffload:
        # Names like Worker_TP1 or "VllmWorker rank=3" identify a rank; Ray/V0 workers need the pid.
        key = proc or "main"
        if pid is not None and not any(ch.isdigit() for ch in key) and key != "EngineCore":
            key = f"{key} pid={pid}"
        rank = self.facts.ranks.get(key)
        if rank is None:
            if len(self.facts.ranks) >= 64:
                return RankOffload(key)
            rank = self.facts.ranks[key] = RankOffload(key, pid)
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
        block = _float(args.get("block_size"))
        if block is not None:
            f.block_size = int(block)
        if isinstance(args.get("quantization"), str):
            f.quantization = args["quantization"]
        if f.reached_ready or self.served_requests:
            f.reached_ready = True
        return f


@functools.lru_cache(maxsize=16)  # a crash loop logs its config on every restart
def _cfg_items(text: str) -> tuple[tuple[str, str], ...]:
    return tuple((m.group("k"), m.group("v").strip("'")) for m in _CFG_ITEM.finditer(text))


@functools.lru_cache(maxsize=16)
def _ns_items(text: str) -> tuple[tuple[str, str], ...]:
    return tuple(_NS_ITEM.findall(text))


@functools.lru_cache(maxsize=16)  # a crash loop logs the same args on every restart
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
