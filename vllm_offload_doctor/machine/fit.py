"""How much GPU memory `vllm serve` needs per GPU, and how much it must offload to fit.

Pure arithmetic on config.json numbers, used by `check`'s fit check (and meant for compare's advice).
vLLM's start-up (V1 `determine_available_memory`): load the weights, run one dummy forward pass over
`max_num_batched_tokens` tokens and a dummy sampler pass, then give what is left of
`gpu_memory_utilization x total` to the KV cache; start-up fails unless that cache holds one request of
`max_model_len` tokens. So the smallest budget that serves is

    weights/TP - offload + KV(max_model_len) + activation peak + non-torch overhead

- KV bytes per token per GPU = 2 (K and V) x layers x max(1, KV heads / TP) x head dim x KV dtype bytes
  (head dim = hidden / heads when config.json has none; KV dtype: the model's unless vLLM's
  --kv-cache-dtype says otherwise). MLA models (DeepSeek) cache one latent of
  kv_lora_rank + qk_rope_head_dim per layer instead. Sliding-window layers hold at most their window.
  Mamba/linear-attention layers are not modelled: the KV cache is then unknown and left out.
- Activation peak: the dummy pass's MLP holds the residual and normed input (2 x hidden) plus gate_up
  (2 x intermediate / TP) and its product (intermediate / TP) for every batched token, in the model
  dtype. On the H200 (vLLM 0.25.1) the load without offload died allocating exactly 924.00 MiB =
  8192 x 2 x 29568 x 2 bytes: the gate_up output of 8192 tokens, vLLM's serve default for GPUs of
  70 GiB or more (2048 below).
- Non-torch overhead: 1.0 GiB, the H200 residual: budget 128.62 GiB - model loading 121.17 GiB - KV
  4.86 GiB - activation 1.60 GiB = 0.99 GiB (CUDA context growth, cuBLAS/Triton workspaces and the
  sampler's dummy pass over max_num_seqs x vocab). Measured with --enforce-eager: CUDA graphs take more.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

GIB = 1 << 30
NON_TORCH_BYTES = 1 * GIB
LARGE_GPU_BYTES = 70 * GIB  # vLLM's threshold for the larger serve defaults
DTYPE_BYTES = {
    "bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4,
    "float8": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}  # fmt: skip
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2")
_MAX_LEN_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
    "max_sequence_length", "max_seq_length", "seq_len",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What config.json says about the memory a model needs beyond its weights."""

    layers: int
    hidden: int
    intermediate: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    max_model_len: int | None  # the model's own limit
    mla_dim: int | None = None  # kv_lora_rank + qk_rope_head_dim for MLA models
    sliding: tuple[int, int] | None = None  # (sliding layers, window)
    kv_unknown: str = ""  # why the KV cache cannot be estimated, if it cannot
    kv_dtype_bytes: int | None = None  # --kv-cache-dtype's, when not the model's

    def kv_bytes_per_token(self, tp: int = 1) -> int | None:
        """KV cache bytes per token per GPU with every layer full (None when unknown)."""
        if self.kv_unknown:
            return None
        size = self.kv_dtype_bytes or self.dtype_bytes
        if self.mla_dim is not None:  # the latent is replicated on every rank
            return self.layers * self.mla_dim * size
        return 2 * self.layers * max(1, self.kv_heads // tp) * self.head_dim * size

    def kv_bytes(self, tokens: int, tp: int = 1) -> int | None:
        """KV cache for one request of `tokens` tokens, per GPU."""
        per_token = self.kv_bytes_per_token(tp)
        if per_token is None:
            return None
        if self.sliding is None:
            return per_token * tokens
        layers_sliding, window = self.sliding
        per_layer = per_token // self.layers
        full = self.layers - layers_sliding
        return per_layer * (full * tokens + layers_sliding * min(window, tokens))


def model_shape(cfg: Mapping[str, Any], dtype: str | None) -> ModelShape | None:
    """Read the shape from a (text) config; None when the basic fields are missing."""
    try:
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        return None
    experts_per_token = int(cfg.get("num_experts_per_tok") or 0)
    moe_inter = cfg.get("moe_intermediate_size")
    if experts_per_token and moe_inter:
        intermediate = experts_per_token * int(moe_inter)
    else:
        intermediate = int(cfg.get("intermediate_size") or 4 * hidden)
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)
    lengths = [int(cfg[k]) for k in _MAX_LEN_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 0]
    sliding, unknown = _layer_kinds(cfg)
    return ModelShape(
        layers=layers,
        hidden=hidden,
        intermediate=intermediate,
        kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        dtype_bytes=DTYPE_BYTES.get((dtype or "bfloat16").lower(), 2),
        max_model_len=min(lengths) if lengths else None,
        mla_dim=mla,
        sliding=sliding,
        kv_unknown=unknown,
    )


def _layer_kinds(cfg: Mapping[str, Any]) -> tuple[tuple[int, int] | None, str]:
    kinds = cfg.get("layer_types")
    if any(k in cfg for k in ("mamba_d_state", "ssm_cfg", "linear_attn_config")):
        return None, "state-space / linear-attention layers are not modelled"
    if not isinstance(kinds, list):
        return None, ""
    other = {str(k) for k in kinds} - {"full_attention", "sliding_attention"}
    if other:
        return None, f"layer types {', '.join(sorted(other))} are not modelled"
    sliding = sum(1 for k in kinds if k == "sliding_attention")
    window = cfg.get("sliding_window")
    if sliding and isinstance(window, int) and window > 0:
        return (sliding, window), ""
    return None, ""


def kv_dtype_bytes(kv_cache_dtype: str | None) -> int | None:
    """Bytes per element of vLLM's --kv-cache-dtype; None for "auto" (the model's dtype)."""
    if kv_cache_dtype is None or kv_cache_dtype == "auto":
        return None
    return DTYPE_BYTES[kv_cache_dtype]


def batched_tokens(gpu_total: float | None) -> int:
    """vLLM serve's default max_num_batched_tokens: 8192 on GPUs of 70 GiB or more, else 2048."""
    return 8192 if gpu_total is None or gpu_total >= LARGE_GPU_BYTES else 2048


@dataclass(frozen=True, slots=True)
class FitPlan:
    """Bytes per GPU; `budget` is None when no GPU size is known."""

    weights: float
    kv_cache: float | None
    activation: float | None
    overhead: float
    budget: float | None
    max_model_len: int | None
    tokens: int  # max_num_batched_tokens of the dummy pass
    kv_per_token: int | None = None  # KV bytes per token per GPU, every layer full

    @property
    def need(self) -> float:
        """GPU memory to serve without offload (unknown parts counted as zero)."""
        return self.weights + (self.kv_cache or 0) + (self.activation or 0) + self.overhead

    @property
    def to_offload(self) -> float | None:
        """Bytes to offload per GPU; zero or less: it fits."""
        return None if self.budget is None else self.need - self.budget

    @property
    def min_offload_gib(self) -> int | None:
        """The smallest whole --cpu-offload-gb that fits (None without a GPU size or when it fits)."""
        extra = self.to_offload
        return None if extra is None or extra <= 0 else max(1, math.ceil(extra / GIB))

    def kv_tokens(self, offload_bytes: float) -> int | None:
        """How many tokens of KV cache vLLM would get with this much offloaded."""
        if self.budget is None or not self.kv_cache or not self.max_model_len:
            return None
        left = self.budget - (self.need - self.kv_cache) + offload_bytes
        return max(0, int(left / (self.kv_cache / self.max_model_len)))


def plan(
    weights_bytes: float,
    shape: ModelShape | None,
    *,
    tp: int,
    gpu_total: float | None,
    utilization: float,
    max_model_len: int | None,
    kv_cache_dtype: str | None = None,
) -> FitPlan:
    """The per-GPU memory plan for `vllm serve` with these settings."""
    if shape is not None and kv_cache_dtype is not None:
        shape = replace(shape, kv_dtype_bytes=kv_dtype_bytes(kv_cache_dtype))
    length = max_model_len or (shape.max_model_len if shape else None)
    tokens = batched_tokens(gpu_total)
    kv = shape.kv_bytes(length, tp) if shape and length else None
    activation = None
    if shape is not None:
        per_token = 2 * shape.hidden + 3 * shape.intermediate / tp
        activation = tokens * per_token * shape.dtype_bytes
    return FitPlan(
        weights=weights_bytes / tp,
        kv_cache=kv,
        activation=activation,
        overhead=NON_TORCH_BYTES,
        budget=None if gpu_total is None else gpu_total * utilization,
        max_model_len=length,
        tokens=tokens,
        kv_per_token=shape.kv_bytes_per_token(tp) if shape else None,
    )


def longest_fitting_len(
    weights_bytes: float,
    shape: ModelShape | None,
    *,
    tp: int,
    gpu_total: float,
    utilization: float,
    limit: int,
    kv_cache_dtype: str | None = None,
) -> int | None:
    """The longest max_model_len (up to `limit`) that fits with no offload; None when unknown,
    0 when not even one token fits."""

    def fits(length: int) -> bool:
        p = plan(
            weights_bytes, shape, tp=tp, gpu_total=gpu_total, utilization=utilization,
            max_model_len=length, kv_cache_dtype=kv_cache_dtype,
        )  # fmt: skip
        return p.kv_cache is not None and (p.to_offload or 0) <= 0

    if shape is None or shape.kv_bytes_per_token(tp) is None or limit < 1:
        return None
    if not fits(1):
        return 0
    lo, hi = 1, limit  # the KV cache grows with the length: the answer is a boundary
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo
