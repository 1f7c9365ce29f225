"""`compare`: run `vllm serve` with offload 0 and offload X one after the other, measure, decide.

The verdict uses two independent kinds of evidence: the logs (through the `analyze` engine:
offloader lines, `Total CPU offloaded parameters` per rank, the model runner, `Model loading
took`) and the measurements (weights on GPU, decode latency, GPU memory, host RSS, KV cache).
A baseline that runs out of GPU memory is the case offload is for: the offload modes still run.

Modules: config (what to run), model/records (the typed report), decide and performance (the
verdict), run and measurement (the modes), artifacts (the run folder), render, cli.
"""

from vllm_offload_doctor.compare.artifacts import atomic_write, commands_text, relevant_env
from vllm_offload_doctor.compare.config import (
    DEFAULT_MODEL,
    DEFAULT_PROMPT,
    DEFAULT_REVISION,
    MANAGED_FLAGS,
    CompareConfig,
    fmt_gb,
)
from vllm_offload_doctor.compare.decide import MRV2_LINKS, MRV2_REMEDY, compare_pair
from vllm_offload_doctor.compare.run import CompareRun

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_PROMPT",
    "DEFAULT_REVISION",
    "MANAGED_FLAGS",
    "MRV2_LINKS",
    "MRV2_REMEDY",
    "CompareConfig",
    "CompareRun",
    "atomic_write",
    "commands_text",
    "compare_pair",
    "fmt_gb",
    "relevant_env",
]
