"""`compare`: run `vllm serve` with offload 0 and offload X one after the other, measure, decide.

The verdict uses two independent kinds of evidence: the logs (through the `analyze` engine:
offloader lines, `Total CPU offloaded parameters` per rank, the model runner, `Model loading
took`) and the measurements (weights on GPU, decode latency, GPU memory, host RSS, KV cache).
A baseline that runs out of GPU memory is the case offload is for: the offload modes still run.

Modules: config (what to run), model/records (the typed report), decide and performance (the
verdict), run and measure (the modes and their readings), artifacts (the run folder), render, cli.
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use so that `offload-doctor --help` does not import packaging, psutil, httpx.
_WHERE = {
    "atomic_write": "artifacts",
    "commands_text": "artifacts",
    "relevant_env": "artifacts",
    "DEFAULT_MODEL": "config",
    "DEFAULT_PROMPT": "config",
    "DEFAULT_REVISION": "config",
    "MANAGED_FLAGS": "config",
    "CompareConfig": "config",
    "fmt_gb": "config",
    "MRV2_LINKS": "decide",
    "MRV2_REMEDY": "decide",
    "compare_pair": "decide",
    "CompareRun": "run",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
