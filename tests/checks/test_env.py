"""The env check(s), through the fake probe."""

from __future__ import annotations

import dataclasses

import pytest
from fake_probe import FakeProbe, one

from vllm_offload_doctor.checks import Status
from vllm_offload_doctor.checks.env import env_effect

# --- environment ----------------------------------------------------------------------


def test_env_nothing_set_ok() -> None:
    result = one("env")
    assert result.status is Status.OK
    assert "none of the variables" in result.message


def test_env_disable_uva_warns() -> None:
    result = one("env", FakeProbe(env={"VLLM_WEIGHT_OFFLOADING_DISABLE_UVA": "1"}))
    assert result.status is Status.WARN
    assert "every pass" in result.message


def test_env_bad_flag_value_fails() -> None:
    result = one("env", FakeProbe(env={"VLLM_USE_V2_MODEL_RUNNER": "true"}))
    assert result.status is Status.FAIL


def test_env_shows_effects_and_never_secrets() -> None:
    env = {
        "VLLM_USE_V2_MODEL_RUNNER": "0",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "VLLM_API_KEY": "supersecretvalue123",
        "VLLM_LOGGING_LEVEL": "DEBUG",
        "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz",
    }
    result = one("env", FakeProbe(env=env))
    text = repr(dataclasses.asdict(result))
    assert result.status is Status.OK
    assert "supersecretvalue123" not in text and "hf_abcdefghij" not in text
    assert "VLLM_API_KEY=***" in result.details
    assert "VLLM_LOGGING_LEVEL=DEBUG" in result.details
    assert any(
        d.startswith("VLLM_USE_V2_MODEL_RUNNER=0: forces Model Runner V1") for d in result.details
    )


@pytest.mark.parametrize(
    ("name", "value", "status"),
    [
        ("VLLM_USE_V2_MODEL_RUNNER", "1", Status.OK),
        ("VLLM_WEIGHT_OFFLOADING_DISABLE_UVA", "0", Status.OK),
        ("VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY", "1", Status.WARN),
        ("VLLM_WSL2_ENABLE_PIN_MEMORY", "yes", Status.FAIL),
        ("CUDA_VISIBLE_DEVICES", "-1", Status.FAIL),
        ("CUDA_VISIBLE_DEVICES", "0,1", Status.OK),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", Status.OK),
    ],
)
def test_env_effect(name: str, value: str, status: Status) -> None:
    assert env_effect(name, value, wsl=False)[0] is status


def test_wsl_variable_outside_wsl_has_no_effect() -> None:
    assert "no effect outside WSL" in env_effect("VLLM_WSL2_ENABLE_PIN_MEMORY", "1", wsl=False)[1]
    assert "no effect" not in env_effect("VLLM_WSL2_ENABLE_PIN_MEMORY", "1", wsl=True)[1]
