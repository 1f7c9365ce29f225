"""vLLM's version facts every command reasons with: the Model Runner V2 offload bug, defaults.

vLLM 0.12.0-0.27.1 never install the weight offloader under Model Runner V2, so `--cpu-offload-gb`
is silently ignored (vLLM issue #51396); 0.28.0 fixed it (PR #51413). V2 is the default for dense
models from 0.25, and from 0.22 `VLLM_USE_V2_MODEL_RUNNER=0` selects the V1 runner, which offloads.
(`../shared/reference/vllm-offload-0.33.md`.)
"""

from __future__ import annotations

from packaging.version import Version

V2_IGNORES_FROM = Version(
    "0.12.0"
)  # the first release whose V2 runner never installs the offloader
FIXED_IN = Version("0.28.0")  # PR #51413
V1_ESCAPE_FROM = Version("0.22")  # VLLM_USE_V2_MODEL_RUNNER=0 picks V1 from here
WINDOW = "0.12.0-0.27.1"  # the releases that ignore the flag under V2, as the messages say it


def ignores_under_v2(version: Version) -> bool:
    """Whether this release's V2 runner ignores `--cpu-offload-gb`."""
    return V2_IGNORES_FROM <= version < FIXED_IN


def has_escape_hatch(version: Version) -> bool:
    """Whether `VLLM_USE_V2_MODEL_RUNNER=0` undoes the bug here (it defaults to V2 and lets V1 back)."""
    return V1_ESCAPE_FROM <= version < FIXED_IN


# vllm/config/cache.py: --gpu-memory-utilization defaults to 0.92 from 0.20.0, 0.9 before.
GPU_UTIL_RAISED_IN = Version("0.20.0")


def default_gpu_memory_utilization(version: Version | None) -> float:
    """vLLM's default --gpu-memory-utilization for a release; an unknown one gets today's."""
    return 0.9 if version is not None and version < GPU_UTIL_RAISED_IN else 0.92
