"""The fit check check(s), through the fake probe."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fake_probe import MODEL_16G, PY, SHAPE_70B, FakeProbe, one, run, two_gpus

from vllm_offload_doctor.checks import Status
from vllm_offload_doctor.checks.context import GIB
from vllm_offload_doctor.machine.modelsize import ModelNotFoundError
from vllm_offload_doctor.machine.probes import (
    NvmlInfo,
)

# --- fit -------------------------------------------------------------------------------


def test_fit_skipped_without_model() -> None:
    assert one("fit").status is Status.SKIP


def test_unreadable_model_fails_the_fit_check_alone() -> None:
    probe = FakeProbe(model=ModelNotFoundError("org/x is not in the local cache"))
    results = run(probe, model="org/x", offload_gb=4)
    assert results["fit"].status is Status.FAIL
    assert "cannot read --model: org/x is not in the local cache" in results["fit"].message
    assert results["host_memory"].status is Status.OK  # the other checks still ran
    assert results["gpu[0]"].status is Status.OK


def test_fits_without_offload_ok() -> None:
    result = one("fit", model="m")  # 16 + 16 (KV, 131072 tokens) + 0.8 + 1 of 73.6 GiB
    assert result.status is Status.OK
    assert "without offload" in result.message
    assert "KV cache for one 131072-token request: 16.0 GiB" in "\n".join(result.details)


def test_fits_without_offload_but_offload_given_warns_slower() -> None:
    result = one("fit", model="m", offload_gb=4)
    assert result.status is Status.WARN
    assert "only costs speed" in result.message
    assert "https://github.com/vllm-project/vllm/issues/57771" in result.links


BIG = replace(MODEL_16G, total_bytes=140 * GIB, shape=SHAPE_70B)  # a 70B model in bf16
# With --max-model-len 8192 on an 80 GiB GPU: 140 weights + 2.5 KV (320 KiB x 8192) + 1.5625
# activation (8192 x (2 x 8192 + 3 x 28672) x 2 bytes) + 1 overhead = 145.06 GiB, against a
# budget of 0.92 x 80 = 73.6 GiB: 71.46 GiB to offload, 72 whole GiB.
CTX = 8192


def test_does_not_fit_without_offload_fails_with_minimum() -> None:
    result = one("fit", FakeProbe(model=BIG), model="m", max_model_len=CTX)
    assert result.status is Status.FAIL
    assert "offload at least 72 GiB" in result.message
    assert "145.1 GiB needed per GPU with max-model-len 8192" in result.message


def test_default_context_is_the_models_and_costs_its_kv_cache() -> None:
    result = one("fit", FakeProbe(model=BIG), model="m")  # 131072 tokens: 40 GiB of KV cache
    assert result.status is Status.FAIL
    assert "offload at least 109 GiB" in result.message


def test_fits_only_with_offload_ok_and_says_how_much_kv_is_left() -> None:
    result = one("fit", FakeProbe(model=BIG), model="m", offload_gb=80, max_model_len=CTX)
    assert result.status is Status.OK
    assert "only with offload, at least 72 GiB per GPU" in result.message
    # 8.54 GiB over the need plus the 2.5 GiB request: 11.04 GiB / 320 KiB = 36,166 tokens
    assert "KV cache for about 36,16" in result.message


def test_offloading_more_than_needed_is_noted() -> None:
    result = one("fit", FakeProbe(model=BIG), model="m", offload_gb=100, max_model_len=CTX)
    assert result.status is Status.OK
    assert "offloading more than 72 GiB per GPU only costs speed" in result.details


def test_offloading_more_than_the_weights_warns() -> None:
    result = one("fit", FakeProbe(model=BIG), model="m", offload_gb=150, max_model_len=CTX)
    assert result.status is Status.WARN
    assert "--cpu-offload-gb 72" in result.remedy


def test_does_not_fit_even_with_offload_fails() -> None:
    result = one("fit", FakeProbe(model=BIG), model="m", offload_gb=20, max_model_len=CTX)
    assert result.status is Status.FAIL
    assert "even with 20 GiB offloaded" in result.message


def test_fit_per_gpu_with_tensor_parallel() -> None:
    probe = FakeProbe(model=BIG, nvml_info=two_gpus())
    # per GPU: 70 + 20 (KV: 4 of 8 KV heads, 131072 tokens) + 0.91 + 1 = 91.9 GiB of 73.6
    result = one("fit", probe, model="m", tensor_parallel_size=2)
    assert result.status is Status.FAIL
    assert "offload at least 19 GiB" in result.message
    result = one("fit", probe, model="m", tensor_parallel_size=2, offload_gb=19)
    assert result.status is Status.OK
    assert "70.0 GiB of weights per GPU" in result.message


def test_fit_budget_too_small_for_anything() -> None:
    result = one(
        "fit", FakeProbe(model=BIG), model="m", gpu_memory_utilization=0.01, offload_gb=200
    )
    assert result.status is Status.FAIL
    assert "no room" in result.message


def test_fit_estimate_is_labelled() -> None:
    est = replace(MODEL_16G, estimated=True, source="estimate from config.json")
    result = one("fit", FakeProbe(model=est), model="m")
    assert "estimated" in result.message


def test_fit_without_config_shape_says_the_need_is_weights_only() -> None:
    bare = replace(BIG, shape=None)
    result = one("fit", FakeProbe(model=bare), model="m")
    assert "141.0 GiB needed per GPU" in result.message  # weights + 1 GiB overhead
    assert any("KV cache and activations: unknown" in d for d in result.details)


@pytest.mark.parametrize(("vllm", "budget"), [("0.19.1", "72.0 GiB"), ("0.25.1", "73.6 GiB")])
def test_fit_budget_uses_the_installed_vllms_default_utilization(vllm: str, budget: str) -> None:
    probe = FakeProbe(model=BIG, interp=replace(PY, vllm_version=vllm))
    result = one("fit", probe, model="m", max_model_len=CTX)
    assert f"does not fit in {budget}" in result.message
    assert any(f"vLLM {vllm}'s default" in d for d in result.details)


def test_fit_without_gpu_still_reports_the_need() -> None:
    probe = FakeProbe(model=BIG, nvml_info=NvmlInfo(error="no driver"))
    result = one("fit", probe, model="m", max_model_len=CTX)
    assert result.status is Status.SKIP
    assert "140.0 GiB of weights per GPU, 145.1 GiB needed per GPU" in result.message
    assert "--gpu-memory-gib" in result.message


def test_gpu_memory_gib_plans_for_a_gpu_that_is_not_here() -> None:
    probe = FakeProbe(model=BIG, nvml_info=NvmlInfo(error="no driver"))
    result = one("fit", probe, model="m", max_model_len=CTX, gpu_memory_gib=160)
    assert result.status is Status.OK  # 0.92 x 160 = 147.2 GiB >= 145.06
    assert "fits in 147.2 GiB without offload" in result.message
    assert any("--gpu-memory-gib 160" in d for d in result.details)


def test_fit_carries_its_plan_as_data() -> None:
    result = one("fit", FakeProbe(model=BIG), model="m", max_model_len=CTX)
    d = result.data
    assert d is not None
    assert d["need_gib"] == pytest.approx(145.06, abs=0.01)
    assert d["budget_gib"] == pytest.approx(73.6, abs=0.01)
    assert d["min_offload_gib"] == 72
    # 72 offloaded: 72 - 71.46 over the need, plus the 2.5 GiB request, at 320 KiB a token
    assert d["kv_tokens"] == pytest.approx((72 - 71.4625 + 2.5) * GIB / (320 * 1024), abs=2)
    assert d["host_need_gib"] == [pytest.approx(1.1 * 72 + 3, abs=0.1), 93.0]


def test_no_gpu_plan_prices_a_token_on_pcie_gen4_and_gen5() -> None:
    probe = FakeProbe(model=BIG, nvml_info=NvmlInfo(error="no driver"))
    result = one("fit", probe, model="m", max_model_len=CTX, gpu_memory_gib=80)
    costs = result.data["per_token_cost_ms"] if result.data else {}
    for name, lane in (("PCIe gen4 x16", 1.969), ("PCIe gen5 x16", 3.938)):
        assert costs[name] == pytest.approx(72 * GIB / (lane * 16 * 0.85 * 1e9) * 1e3, abs=0.1)
    assert any("each generated token reads 72 GiB over the link" in d for d in result.details)
    assert result.data is not None
    assert result.data["longest_max_model_len_without_offload"] == 0  # 140 GiB of weights


def test_the_offload_given_is_the_one_priced() -> None:
    probe = FakeProbe(model=BIG, nvml_info=NvmlInfo(error="no driver"))
    result = one("fit", probe, model="m", max_model_len=CTX, gpu_memory_gib=80, offload_gb=80)
    assert result.data is not None and result.data["priced_offload_gib"] == 80
    assert any("each generated token reads 80 GiB over the link" in d for d in result.details)


def test_link_gbs_prices_a_token_on_the_stated_link() -> None:
    probe = FakeProbe(model=BIG, nvml_info=NvmlInfo(error="no driver"))
    result = one("fit", probe, model="m", max_model_len=CTX, gpu_memory_gib=80, link_gbs=50)
    assert result.data is not None
    assert result.data["per_token_cost_ms"] == {
        "--link-gbs 50": pytest.approx(72 * GIB / (50 * 0.85 * 1e9) * 1e3, abs=0.1)
    }


def test_no_gpu_plan_gives_the_longest_context_that_fits_without_offload() -> None:
    probe = FakeProbe(nvml_info=NvmlInfo(error="no driver"))
    result = one("fit", probe, model="m", gpu_memory_gib=24)
    # 0.92 x 24 less 16 of weights, the 2048-token activation peak and 1 GiB, at 128 KiB a token
    activation = 2048 * (2 * 4096 + 3 * 14336) * 2
    room = 0.92 * 24 * GIB - 16 * GIB - activation - GIB
    assert result.data is not None
    assert result.data["longest_max_model_len_without_offload"] == int(room // (128 * 1024))
    assert any("longest --max-model-len that fits without offload" in d for d in result.details)
