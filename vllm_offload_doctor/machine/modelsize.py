"""How many bytes of weights a local model has: from safetensors when present, else estimated.

Only local files are read: a directory, or a repo id already in the Hugging Face cache.
Nothing is ever downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_offload_doctor.errors import ProbeError
from vllm_offload_doctor.machine.fit import DTYPE_BYTES, ModelShape, model_shape


class ModelNotFoundError(ProbeError):
    """The model is neither a local directory nor in the local Hugging Face cache."""


class ModelSizeUnknownError(ProbeError):
    """The model is local but its size cannot be read or estimated."""


@dataclass(frozen=True, slots=True)
class ModelSize:
    path: str
    total_bytes: int
    source: str  # "safetensors index", "safetensors files", "estimate from config.json"
    estimated: bool
    architectures: tuple[str, ...] = ()
    dtype: str | None = None
    quantized: bool = False
    shape: ModelShape | None = None  # None: config.json lacks the fields (KV cache unknown)


def inspect_model(model: str, env: Mapping[str, str], home: Path) -> ModelSize:
    """Find the model locally and size it; raises ModelNotFoundError/ModelSizeUnknownError."""
    path = locate_model(model, env, home)
    if path is None:
        raise ModelNotFoundError(
            f"{model} is not a local directory and not in the local Hugging Face cache "
            "(check never downloads)"
        )
    return size_model(path)


def locate_model(model: str, env: Mapping[str, str], home: Path) -> Path | None:
    """A local directory, or the newest snapshot of `org/name` in the Hugging Face cache."""
    direct = Path(model).expanduser()
    if direct.is_dir():
        return direct
    if model.count("/") != 1 or model.startswith(("/", ".", "~")):
        return None
    folder = "models--" + model.replace("/", "--")
    for hub in hub_dirs(env, home):
        repo = hub / folder
        snapshot = _snapshot(repo)
        if snapshot is not None:
            return snapshot
    return None


def hub_dirs(env: Mapping[str, str], home: Path) -> list[Path]:
    """Cache roots in the order huggingface_hub resolves them."""
    dirs: list[Path] = []
    if env.get("HF_HUB_CACHE"):
        dirs.append(Path(env["HF_HUB_CACHE"]).expanduser())
    if env.get("HF_HOME"):
        dirs.append(Path(env["HF_HOME"]).expanduser() / "hub")
    if env.get("XDG_CACHE_HOME"):
        dirs.append(Path(env["XDG_CACHE_HOME"]).expanduser() / "huggingface" / "hub")
    dirs.append(home / ".cache" / "huggingface" / "hub")
    return dirs


def _snapshot(repo: Path) -> Path | None:
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        pinned = snapshots / ref.read_text().strip()
        if pinned.is_dir():
            return pinned
    candidates = [p for p in snapshots.iterdir() if p.is_dir()]
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def size_model(path: Path) -> ModelSize:
    """Weights in bytes: index metadata, else safetensors file sizes, else a config estimate."""
    config = _load_json(path / "config.json") or {}
    text_cfg = _text_config(config)
    dtype = text_cfg.get("torch_dtype") or config.get("torch_dtype") or text_cfg.get("dtype")
    total, source = _measure(path, config, text_cfg, str(dtype) if dtype else None)
    return ModelSize(
        path=str(path),
        total_bytes=total,
        source=source,
        estimated=source.startswith("estimate"),
        architectures=tuple(str(a) for a in config.get("architectures") or ()),
        dtype=str(dtype) if dtype else None,
        quantized=bool(config.get("quantization_config")),
        shape=model_shape(text_cfg, str(dtype) if dtype else None),
    )


def _measure(
    path: Path, config: Mapping[str, Any], text_cfg: Mapping[str, Any], dtype: str | None
) -> tuple[int, str]:
    index = _load_json(path / "model.safetensors.index.json") or {}
    total = (index.get("metadata") or {}).get("total_size")
    if isinstance(total, int) and total > 0:
        return total, "safetensors index"
    files = sorted(path.glob("*.safetensors"))
    if files:
        try:
            size = sum(f.stat().st_size for f in files)  # follows the cache's blob symlinks
        except OSError as exc:
            raise ModelSizeUnknownError(f"incomplete download in {path}: {exc}") from exc
        # A safetensors header is small JSON; the file size is a good bound on the weights.
        return size, "safetensors files"
    if not config:
        raise ModelSizeUnknownError(f"no config.json or *.safetensors in {path}")
    estimate = estimate_bytes(text_cfg, dtype)
    if estimate is None:
        raise ModelSizeUnknownError(
            f"no safetensors in {path} and config.json is not a dense decoder that can be "
            "estimated (mixture-of-experts or missing fields)"
        )
    return estimate, "estimate from config.json"


def estimate_bytes(cfg: Mapping[str, Any], dtype: str | None) -> int | None:
    """Parameter bytes of a dense Llama-style decoder; None for MoE or incomplete configs."""
    if any(cfg.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts")):
        return None
    try:
        h = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        inter = int(cfg["intermediate_size"])
        vocab = int(cfg["vocab_size"])
        heads = int(cfg["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        return None
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or h // heads)
    attention = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2  # q, o + k, v
    mlp = 3 * h * inter  # gate, up, down
    per_layer = attention + mlp + 2 * h  # two norms
    embeddings = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    params = layers * per_layer + embeddings + h
    return params * DTYPE_BYTES.get((dtype or "bfloat16").lower(), 2)


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal configs keep the language model's shape under `text_config`."""
    nested = config.get("text_config")
    if "hidden_size" not in config and isinstance(nested, dict):
        return nested
    return config


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
