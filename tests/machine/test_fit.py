"""The fit estimate: KV cache arithmetic per architecture, and the calibration on the real H200 run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_offload_doctor.machine.fit import GIB, FitPlan, model_shape, plan
from vllm_offload_doctor.machine.modelsize import size_model

# The section-6 model of ../shared/device/README.md (Qwen3 scaled up to 81.5 B parameters): the
# config.json vLLM loaded on the H200, kept beside the bisection it was measured with.
BISECT = Path(__file__).resolve().parents[2] / "fixtures" / "h200-compare" / "big-model-bisect"
H200_MODEL = json.loads((BISECT / "big-config.json").read_text())
# What vLLM 0.25.1 logged on the H200 (139.8 GiB, --gpu-memory-utilization 0.92 default,
# --max-model-len 2048, --enforce-eager, VLLM_USE_V2_MODEL_RUNNER=0, --cpu-offload-gb 30).
H200_TOTAL = 139.8 * GIB
OFFLOADED = 30.61  # "Total CPU offloaded parameters: 30.61"
LOADED = 121.17  # "Model loading took 121.17 GiB memory"
KV_AVAILABLE = 4.86  # "Available KV cache memory: 4.86 GiB"
KV_TOKENS = 14160  # "GPU KV cache size: 14,160 tokens"


@pytest.fixture
def h200_model(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(H200_MODEL))
    return tmp_path


def test_config_only_model_weighs_what_vllm_loaded(h200_model: Path) -> None:
    size = size_model(h200_model)
    assert size.estimated
    assert abs(size.total_bytes / GIB - (LOADED + OFFLOADED)) < 0.05  # 151.78 GiB


def test_kv_bytes_per_token_match_the_tokens_vllm_reported(h200_model: Path) -> None:
    shape = size_model(h200_model).shape
    assert shape is not None
    assert shape.kv_bytes_per_token() == 2 * 90 * 8 * 128 * 2  # 360 KiB
    assert abs(KV_AVAILABLE * GIB / shape.kv_bytes_per_token() - KV_TOKENS) < 10


def test_estimate_is_within_1_gib_of_the_h200_need(h200_model: Path) -> None:
    """The least offload that serves, derived from the log alone, against the estimate.

    Everything that is neither weights nor KV cache: budget - loaded - KV = 2.59 GiB. The need is
    the weights minus what the budget holds besides that overhead and one 2048-token request.
    """
    size = size_model(h200_model)
    budget = 0.92 * H200_TOTAL / GIB
    overhead = budget - LOADED - KV_AVAILABLE
    kv_2048 = 2048 * 2 * 90 * 8 * 128 * 2 / GIB
    derived = LOADED + OFFLOADED - (budget - overhead - kv_2048)  # 26.45 GiB
    p = plan(
        size.total_bytes, size.shape, tp=1, gpu_total=H200_TOTAL, utilization=0.92,
        max_model_len=2048,
    )  # fmt: skip
    assert p.to_offload is not None
    assert 26 < derived < 27
    assert abs(p.to_offload / GIB - derived) < 1
    assert p.min_offload_gib in (27, 28)
    # and with the 30.61 GiB actually offloaded, about the KV cache vLLM found
    tokens = p.kv_tokens(OFFLOADED * GIB)
    assert tokens is not None and abs(tokens - KV_TOKENS) / KV_TOKENS < 0.1


# fixtures/h200-compare/big-model-bisect/README.md: --cpu-offload-gb 25 and 26 failed to start
# (no memory for cache blocks; 0.28 GiB of KV cache short), 27 served. Least offload: 26.44 GiB.
BISECT_SERVES = {25: False, 26: False, 27: True}
LEAST_OFFLOAD = 26.44


def test_estimate_is_within_1_gib_of_the_bisected_minimum(h200_model: Path) -> None:
    size = size_model(h200_model)
    p = plan(
        size.total_bytes, size.shape, tp=1, gpu_total=H200_TOTAL, utilization=0.92,
        max_model_len=2048,
    )  # fmt: skip
    assert p.to_offload is not None and p.min_offload_gib is not None
    assert abs(p.to_offload / GIB - LEAST_OFFLOAD) < 1
    assert abs(p.min_offload_gib - min(k for k, ok in BISECT_SERVES.items() if ok)) <= 1


def test_check_agrees_with_the_bisection(h200_model: Path) -> None:
    """`check --model DIR --max-model-len 2048 --gpu-memory-gib 139.8 --offload-gb N`, no GPU here."""
    from dataclasses import replace

    from fake_probe import PY, FakeProbe

    from vllm_offload_doctor.checks import Options, Status, run_checks
    from vllm_offload_doctor.machine.probes import NvmlInfo

    probe = FakeProbe(
        model=size_model(h200_model),
        nvml_info=NvmlInfo(error="no driver"),
        interp=replace(PY, vllm_version="0.25.1"),
    )
    for offload, served in BISECT_SERVES.items():
        options = Options(
            model=str(h200_model), max_model_len=2048, gpu_memory_gib=139.8, offload_gb=offload
        )
        fit = next(c for c in run_checks(probe, options).checks if c.id == "fit")
        assert (fit.status is Status.OK) == served, (offload, fit.message)


def test_default_max_model_len_is_the_models(h200_model: Path) -> None:
    size = size_model(h200_model)
    p = plan(
        size.total_bytes,
        size.shape,
        tp=1,
        gpu_total=H200_TOTAL,
        utilization=0.92,
        max_model_len=None,
    )
    assert p.max_model_len == H200_MODEL["max_position_embeddings"]
    assert p.kv_cache == H200_MODEL["max_position_embeddings"] * 368640


def test_head_dim_defaults_to_hidden_over_heads() -> None:
    shape = model_shape(
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32}, "float16"
    )
    assert shape is not None
    assert shape.kv_bytes_per_token() == 2 * 32 * 32 * 128 * 2  # no GQA: every head has KV


def test_tensor_parallel_splits_kv_heads_but_never_below_one() -> None:
    shape = model_shape(
        {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
         "num_key_value_heads": 8},
        "bfloat16",
    )  # fmt: skip
    assert shape is not None
    assert shape.kv_bytes_per_token(tp=2) == shape.kv_bytes_per_token() // 2
    assert shape.kv_bytes_per_token(tp=16) == 2 * 80 * 1 * 128 * 2  # replicated


def test_kv_cache_dtype_sizes_the_cache_not_the_activations(h200_model: Path) -> None:
    size = size_model(h200_model)

    def with_kv(dtype: str | None) -> FitPlan:
        return plan(
            size.total_bytes, size.shape, tp=1, gpu_total=H200_TOTAL, utilization=0.92,
            max_model_len=2048, kv_cache_dtype=dtype,
        )  # fmt: skip

    model, auto, fp8 = with_kv(None), with_kv("auto"), with_kv("fp8")
    assert auto == model
    assert fp8.kv_cache is not None and model.kv_cache is not None
    assert fp8.kv_cache * 2 == model.kv_cache
    assert fp8.kv_per_token == 2 * 90 * 8 * 128 * 1
    assert fp8.activation == model.activation


def test_mla_caches_one_latent_per_layer() -> None:
    shape = model_shape(
        {"hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
         "kv_lora_rank": 512, "qk_rope_head_dim": 64, "max_position_embeddings": 163840},
        "bfloat16",
    )  # fmt: skip
    assert shape is not None
    assert shape.kv_bytes_per_token() == 61 * 576 * 2
    assert shape.kv_bytes_per_token(tp=8) == 61 * 576 * 2


def test_sliding_window_layers_hold_only_their_window() -> None:
    shape = model_shape(
        {"hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 512,
         "layer_types": ["sliding_attention"] * 3 + ["full_attention"]},
        "bfloat16",
    )  # fmt: skip
    assert shape is not None
    per_layer = 2 * 4 * 256 * 2
    assert shape.kv_bytes(8192) == per_layer * (8192 + 3 * 512)


def test_state_space_layers_are_reported_unknown_not_guessed() -> None:
    shape = model_shape(
        {"hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 8,
         "layer_types": ["mamba", "full_attention", "mamba", "full_attention"]},
        "bfloat16",
    )  # fmt: skip
    assert shape is not None
    assert shape.kv_bytes(4096) is None
    assert "mamba" in shape.kv_unknown


def test_incomplete_config_has_no_shape() -> None:
    assert model_shape({"hidden_size": 64}, None) is None


def test_smaller_gpus_profile_with_fewer_tokens() -> None:
    shape = model_shape(H200_MODEL, "bfloat16")
    big = plan(1.0, shape, tp=1, gpu_total=80 * GIB, utilization=0.9, max_model_len=1)
    small = plan(1.0, shape, tp=1, gpu_total=24 * GIB, utilization=0.9, max_model_len=1)
    assert (big.tokens, small.tokens) == (8192, 2048)
    assert big.activation == 4 * small.activation  # type: ignore[operator]


def test_check_plans_the_h200_run_without_a_gpu(h200_model: Path) -> None:
    """`check --model DIR --max-model-len 2048 --gpu-memory-gib 139.8` on a machine with no GPU."""
    from dataclasses import replace

    from fake_probe import PY, FakeProbe

    from vllm_offload_doctor.checks import Options, Status, run_checks
    from vllm_offload_doctor.machine.probes import NvmlInfo

    probe = FakeProbe(
        model=size_model(h200_model),
        nvml_info=NvmlInfo(error="no driver"),
        interp=replace(PY, vllm_version="0.25.1"),
    )
    options = Options(model=str(h200_model), max_model_len=2048, gpu_memory_gib=139.8)
    fit = next(c for c in run_checks(probe, options).checks if c.id == "fit")
    assert fit.status is Status.FAIL
    assert "does not fit in 128.6 GiB without offload; offload at least 27 GiB" in fit.message
    ok = run_checks(probe, replace(options, offload_gb=30))
    fit = next(c for c in ok.checks if c.id == "fit")
    assert fit.status is Status.OK
    # 30 GiB asked: 12,361 tokens. vLLM moves whole tensors and went to 30.61 GiB, which the
    # plan turns into 14,138 tokens (test above) against the 14,160 it logged.
    assert "KV cache for about 12,361 tokens" in fit.message


# What the H200 reported (nvidia-smi -q / NVML v2 / torch.cuda.mem_get_info on the device): CUDA's total
# is NVML's total less the driver's reserve, and vLLM's budget is gpu_memory_utilization x CUDA's total.
H200_NVML_TOTAL = 150_754_820_096
H200_NVML_RESERVED = 644_939_776
H200_CUDA_TOTAL = 150_109_880_320


def test_check_on_the_real_h200_figures_agrees_with_the_bisection(h200_model: Path) -> None:
    """With the GPU read through NVML (not --gpu-memory-gib), the driver's reserve is left out."""
    from dataclasses import replace

    from fake_probe import H100, NVML, PY, FakeProbe

    from vllm_offload_doctor.checks import Options, Status, run_checks

    h200 = replace(
        H100,
        name="NVIDIA H200",
        memory_total=H200_NVML_TOTAL,
        memory_free=H200_CUDA_TOTAL,
        memory_reserved=H200_NVML_RESERVED,
    )
    assert h200.memory_usable == H200_CUDA_TOTAL
    probe = FakeProbe(
        model=size_model(h200_model),
        nvml_info=replace(NVML, gpus=(h200,)),
        interp=replace(PY, vllm_version="0.25.1"),
    )
    for offload, served in BISECT_SERVES.items():
        options = Options(model=str(h200_model), max_model_len=2048, offload_gb=offload)
        fit = next(c for c in run_checks(probe, options).checks if c.id == "fit")
        assert (fit.status is Status.OK) == served, (offload, fit.message)
    fit = next(
        c
        for c in run_checks(probe, Options(model=str(h200_model), max_model_len=2048)).checks
        if c.id == "fit"
    )
    assert "offload at least 27 GiB" in fit.message
