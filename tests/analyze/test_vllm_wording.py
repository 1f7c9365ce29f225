"""vLLM's wording of the same fact or failure changes across 0.4-0.33 (the message catalogue of the
released wheels): each spelling below must give the same fact, phase, rule or category.

Lines are written from the catalogue's templates with plausible values, in the log prefix of the
versions that print them.
"""

from __future__ import annotations

import pytest

from vllm_offload_doctor.analyze.engine import analyze_lines
from vllm_offload_doctor.analyze.facts import FactCollector
from vllm_offload_doctor.analyze.normalize import parse


def _collect(*lines: str) -> FactCollector:
    collector = FactCollector()
    for no, raw in enumerate(lines, start=1):
        collector.feed(parse(no, raw))
    collector.finish()
    return collector


# -- weights loaded ------------------------------------------------------------------------------

LOADED = [
    # V0 (and V1 0.6.4-0.7.3): 'Loading model weights took X GB', 0.4.0-0.7.3
    ("INFO 04-02 16:40:21 model_runner.py:104] Loading model weights took 13.4966 GB", 13.4966),
    # V0 and V1 0.8.0-0.8.2: 'Model loading took X GB and'
    (
        "INFO 04-01 16:44:11 [model_runner.py:1146] Model loading took 14.2597 GB and 59.536244 seconds",
        14.2597,
    ),
    # XPU 0.8.3-0.9.2: 'Loading model weights took X GiB'
    (
        "INFO 05-06 10:00:00 [xpu_model_runner.py:415] Loading model weights took 14.2597 GiB",
        14.2597,
    ),
    # V1 0.8.3-0.11.0 and V2 0.12.0-0.27.1: GiB without 'memory'
    (
        "INFO 05-06 10:00:00 [gpu_model_runner.py:2653] Model loading took 14.2597 GiB and 6.1 seconds",
        14.2597,
    ),
    # V1 0.11.1-0.33.0: 'GiB memory and'
    (
        "(EngineCore pid=9) INFO 05-06 10:00:00 [gpu_model_runner.py:5088] Model loading took 14.26 GiB memory and 6.1 seconds",
        14.26,
    ),
]


@pytest.mark.parametrize(("line", "gib"), LOADED, ids=[f"loaded-{i}" for i in range(len(LOADED))])
def test_weights_loaded_in_every_spelling(line: str, gib: float) -> None:
    collector = _collect(line)
    assert collector.facts.model_loading_gib == gib
    assert collector.phase == "loaded"


@pytest.mark.parametrize("line", [LOADED[0][0], LOADED[1][0]])
def test_gb_spelling_does_not_date_the_runner(line: str) -> None:
    # Only V2's 0.12-0.27.1 line says 'GiB and' without 'memory'; the GB lines are V0/V1 <= 0.8.2.
    facts = analyze_lines([line]).facts
    assert facts.model_runner == "unknown"
    assert facts.loading_says_memory is None


# -- KV cache numbers ----------------------------------------------------------------------------

BLOCKS = [
    "INFO 03-04 10:12:44 gpu_executor.py:76] # GPU blocks: 0, # CPU blocks: 1365",  # 0.4.0-0.6.6
    "INFO 02-10 18:21:06 executor_base.py:110] # CUDA blocks: 0, # CPU blocks: 1638",  # 0.7.0-0.7.2
    "INFO 04-01 16:44:23 [executor_base.py:111] # cuda blocks: 0, # CPU blocks: 8630",  # 0.7.3-0.11.0
    "INFO 04-01 16:44:23 [executor_base.py:111] # rocm blocks: 0, # CPU blocks: 8630",  # ROCm
]


@pytest.mark.parametrize("line", BLOCKS, ids=["GPU", "CUDA", "cuda", "rocm"])
def test_zero_blocks_in_every_platform_spelling(line: str) -> None:
    collector = _collect(line)
    assert collector.facts.gpu_blocks == 0
    assert collector.phase == "kv_cache"
    a = analyze_lines([line])
    assert a.verdict.rule_id == "OOM007"
    assert a.verdict.category.value == "oom_kv_cache"
    assert "0 KV cache blocks on the GPU" in a.verdict.summary


def test_cpu_blocks_are_not_gpu_blocks() -> None:
    assert (
        _collect("INFO 04-09 10:00:00 cpu_executor.py:186] # CPU blocks: 0").facts.gpu_blocks
        is None
    )


POOLS = [
    "INFO 03-20 10:02:42 [kv_cache_utils.py:566] GPU KV cache size: 90,816 tokens",  # 0.8.0-0.27.1
    "(EngineCore pid=9) INFO 11-02 08:31:01 [kv_cache_utils.py:2464] GPU KV cache size: 1,024 tokens, Maximum concurrency for 32,768 tokens per request: 0.03x",
    "(EngineCore pid=9) INFO 11-02 08:31:01 [kv_cache_utils.py:2327] GPU + host KV cache size: 1,024 tokens, Maximum concurrency for 32,768 tokens per request: 0.03x",
    "(EngineCore pid=9) INFO 11-02 08:31:01 [kv_cache_utils.py:2327] XPU KV cache size: 1,024 tokens, Maximum concurrency for 32,768 tokens per request: 0.03x",
]


@pytest.mark.parametrize("line", POOLS, ids=["GPU-0.8", "GPU-0.30", "GPU+host-0.32", "XPU-0.32"])
def test_kv_cache_size_in_every_pool_name(line: str) -> None:
    collector = _collect(line)
    assert collector.facts.kv_cache_tokens in (1024, 90816)
    assert collector.phase == "kv_cache"


def test_pool_kv_size_below_max_model_len_is_short() -> None:
    a = analyze_lines(
        [
            "(APIServer pid=1) INFO 11-02 08:30:11 [api_utils.py:286] non-default args: {'model': 'Qwen/Qwen3-8B', 'max_model_len': 32768}",
            POOLS[2],
        ]
    )
    assert a.verdict.rule_id == "OOM007"
    assert "1024 tokens, below max_model_len 32768" in a.verdict.summary


# -- failures in older and newer wordings ---------------------------------------------------------

FAILURES = [
    # OOM002: 'GB' 0.7.0-0.8.2
    (
        "oom_kv_cache",
        "OOM002",
        "ERROR 03-20 09:14:43 [core.py:343] ValueError: To serve at least one request with the models's max seq len (131072), (7.00 GB KV cache is needed, which is larger than the available KV cache memory (4.85 GB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
    ),
    # OOM001: bytes 0.5.4-0.15.1, used memory 0.7.0-0.10.2, bare 0.4.0-0.5.3.post1
    (
        "oom_gpu_util",
        "OOM001",
        "AssertionError: Error in memory profiling. Initial free memory 23580753920, current free memory 23849189376. This happens when the GPU memory was not properly cleaned up before initializing the vLLM instance.",
    ),
    (
        "oom_gpu_util",
        "OOM001",
        "[rank0]: AssertionError: Error in memory profiling. Initial used memory 16219373568, currently used memory 15947792384. This happens when the GPU memory was not properly cleaned up before initializing the vLLM instance.",
    ),
    (
        "oom_gpu_util",
        "OOM001",
        "AssertionError: Error in memory profiling. This happens when the GPU memory was not properly cleaned up before initializing the vLLM instance.",
    ),
    (
        "oom_gpu_util",
        "OOM001",
        "(EngineCore pid=5) ERROR 01-02 03:04:05 [core.py:1190] AssertionError: Error in memory profiling. Initial free memory 70.12 GiB, current free memory 71.5 GiB. This happens when other processes sharing the same container release GPU memory while vLLM is profiling during initialization. To fix this, ensure consistent GPU memory allocation or isolate vLLM in its own container.",
    ),
    # OOM008: auto-fit 0.14.0-0.33.0
    (
        "oom_kv_cache",
        "OOM008",
        "(EngineCore_DP0 pid=4177) ERROR 11-05 21:11:19 [core.py:843] ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token. Try increasing `gpu_memory_utilization`.",
    ),
    # OOM009: external weights 0.32.0-0.33.0
    (
        "oom_gpu_util",
        "OOM009",
        "(EngineCore pid=812) ERROR 01-15 16:20:23 [core.py:1190] ValueError: Externally held weights on device cuda:0 (66.31/79.19 GiB) exceed the desired GPU memory utilization (0.5, 39.6 GiB). Increase GPU memory utilization or reduce GPU memory used by other processes.",
    ),
    # ARG002: plain (<= 0.9) and inside pydantic's ValidationError (VllmConfig, later versions)
    (
        "bad_args",
        "ARG002",
        "ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).",
    ),
    (
        "bad_args",
        "ARG002",
        "(APIServer pid=1)   Value error, Total number of attention heads (28) must be divisible by tensor parallel size (8). [type=value_error, input_value=ArgsKwargs((), {'model_co...}), input_type=ArgsKwargs]",
    ),
    (
        "bad_args",
        "ARG002",
        "ValueError: Total number of hidden layers (30) must be divisible by pipeline parallel size (4).",
    ),
    # DL002: no weight files 0.4.1-0.33.0, safetensors-only loaders 0.6.6-0.33.0
    (
        "model_download",
        "DL002",
        "RuntimeError: Cannot find any model weights with `/data/models/Qwen2.5-7B-Instruct`",
    ),
    (
        "model_download",
        "DL002",
        "(EngineCore pid=3) ERROR 01-02 03:04:05 [core.py:1190] RuntimeError: Cannot find any safetensors model weights with `/models/llama`",
    ),
    # DL001 through the exception map: 'Invalid repository ID or local directory' 0.8.0-0.33.0
    (
        "model_download",
        "DL001",
        "(APIServer pid=7) ValueError: Invalid repository ID or local directory specified: '/models/Llama-3.1-8B-Instruct'.",
    ),
    # TOK001: chat-template path errors (0.5.3-0.33.0), a tokenizer without a template (0.14.0-0.33.0)
    (
        "tokenizer_template",
        "TOK001",
        "(APIServer pid=1) ValueError: The supplied chat template string (templates/llama3.jinja) appears path-like, but doesn't exist! Tried: templates/llama3.jinja and /usr/local/lib/python3.12/dist-packages/vllm/transformers_utils/chat_templates/templates/llama3.jinja",
    ),
    (
        "tokenizer_template",
        "TOK001",
        "(APIServer pid=1) vllm.exceptions.VLLMValidationError: The supplied chat template (./tpl.jinja) looks like a file path, but it failed to be opened. Tried: ./tpl.jinja and /usr/lib/python3/dist-packages/vllm/transformers_utils/chat_templates/tpl.jinja. Reason: [Errno 21] Is a directory: './tpl.jinja'",
    ),
    (
        "tokenizer_template",
        "TOK001",
        "FileNotFoundError: the supplied chat template path doesn't exist",
    ),
    (
        "tokenizer_template",
        "TOK001",
        "(APIServer pid=1) ValueError: No chat template available. Provide `chat_template` explicitly.",
    ),
]


@pytest.mark.parametrize(
    ("category", "rule", "line"), FAILURES, ids=[f"{r}-{i}" for i, (_, r, _) in enumerate(FAILURES)]
)
def test_failure_wording(category: str, rule: str, line: str) -> None:
    a = analyze_lines([line])
    assert a.verdict.category.value == category
    assert a.verdict.rule_id == rule


def test_kv_needed_gb_numbers_reach_the_message() -> None:
    a = analyze_lines([FAILURES[0][2]])
    assert "needed 7.00 GiB, available 4.85 GiB" in a.verdict.summary


def test_profiling_bytes_are_never_shown_as_gib() -> None:
    summary = analyze_lines([FAILURES[1][2]]).verdict.summary
    assert "23580753920 GiB" not in summary
    newer = analyze_lines([FAILURES[4][2]]).verdict.summary
    assert "70.12 GiB" in newer


def test_jinja_errors_after_vllm_compile_message_are_tokenizer_template() -> None:
    # vLLM logs 'Error when compiling Jinja template' (0.6.5-0.33.0) with jinja2's traceback.
    prefix = "(APIServer pid=1) ERROR 11-20 09:30:02 [hf.py:574]"
    a = analyze_lines(
        [
            f"{prefix} Error when compiling Jinja template",
            f"{prefix} Traceback (most recent call last):",
            f'{prefix}   File "/usr/local/lib/python3.12/dist-packages/jinja2/environment.py", line 771, in _parse',
            f"{prefix}     return Parser(self, source, name, filename).parse()",
            f"{prefix} jinja2.exceptions.TemplateSyntaxError: expected token 'end of print statement', got 'message'",
        ]
    )
    assert a.verdict.category.value == "tokenizer_template"


def test_auto_fit_reduced_is_no_failure() -> None:
    a = analyze_lines(
        [
            "(EngineCore pid=3398) INFO 11-08 07:46:30 [kv_cache_utils.py:2477] Auto-fit max_model_len: reduced from 40960 to 36000 to fit in available KV cache memory (8.79 GiB GPU)",
            "(EngineCore pid=3398) INFO 11-08 07:45:31 [utils.py:751] Weights are held outside this process: of the 75.23 GiB utilization budget, 66.31 GiB is externally held and 8.92 GiB remains for the engine's own allocations.",
        ]
    )
    assert a.findings == ()
