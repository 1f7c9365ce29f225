"""The host memory check(s), through the fake probe."""

from __future__ import annotations

from dataclasses import replace

from fake_probe import MEM, WSL2, FakeProbe, one, two_gpus

from vllm_offload_doctor.checks import Status
from vllm_offload_doctor.checks.context import GIB

# --- host memory -----------------------------------------------------------------------


def test_host_memory_without_offload_ok() -> None:
    result = one("host_memory")
    assert result.status is Status.OK
    assert "256.0 GiB RAM" in result.message


def test_host_memory_budget_uses_tensor_parallel_size() -> None:
    probe = FakeProbe(nvml_info=two_gpus())
    result = one("host_memory", probe, offload_gb=40, tensor_parallel_size=2)
    # (1.1-1.25 x 40 + 3) x 2 GPUs, the H200 calibration
    assert "~94-106 GiB ((1.1-1.25 × 40 GiB + 3 GiB) × 2 GPUs) needed" in result.message
    assert result.status is Status.OK
    assert result.data is not None and result.data["host_need_gib"] == [94.0, 106.0]
    assert "https://github.com/vllm-project/vllm/issues/56410" in result.links


# `free -m` on the H200 host of the corpus log H-015: 128868 MiB total, 128399 available
H200_HOST = replace(MEM, total=128868 << 20, available=128399 << 20)


def test_the_h200_host_oom_offload_fails_before_it_is_tried() -> None:
    # 112 GiB offloaded on this 128 GiB host was killed by the OOM killer (corpus H-015)
    result = one("host_memory", FakeProbe(mem=H200_HOST), offload_gb=112)
    assert result.status is Status.FAIL
    assert "125.8 GiB usable" in result.message
    assert result.data is not None and result.data["largest_offload_gib"] == 98
    assert "at most 98 GiB" in result.remedy


def test_the_h200_offload_that_served_is_a_warning_not_a_failure() -> None:
    # 100 GiB offloaded peaked at 122.9 of 128 on the same host and served
    result = one("host_memory", FakeProbe(mem=H200_HOST), offload_gb=100)
    assert result.status is Status.WARN
    assert "may not fit" in result.message


def test_host_budget_states_its_source_and_the_start_up_cost() -> None:
    result = one("host_memory", offload_gb=30)
    assert any("measured on an H200" in d for d in result.details)
    assert any("start-up: about 50 s longer" in d for d in result.details)  # 30 / 0.6
    assert result.data is not None and result.data["extra_load_s"] == 50


def test_wsl_may_double_pinned_memory() -> None:
    plain = one("host_memory", offload_gb=80)  # 256 GiB host: 91-103 fits
    assert plain.status is Status.OK
    wsl = one("host_memory", FakeProbe(plat=WSL2), offload_gb=80)  # up to 2.5 x 80 + 3
    assert wsl.status is Status.WARN
    assert any("looks like WSL" in d for d in wsl.details)


def test_too_little_host_ram_fails() -> None:
    mem = replace(MEM, total=64 * GIB, available=60 * GIB)
    result = one("host_memory", FakeProbe(mem=mem), offload_gb=60)  # needs 69 at least
    assert result.status is Status.FAIL
    assert "64.0 GiB usable" in result.message


def test_host_ram_not_available_now_warns() -> None:
    mem = replace(MEM, total=256 * GIB, available=50 * GIB)
    assert one("host_memory", FakeProbe(mem=mem), offload_gb=40).status is Status.WARN


def test_cgroup_limit_caps_usable_memory() -> None:
    mem = replace(MEM, cgroup_limit=32 * GIB, cgroup_usage=2 * GIB)
    result = one("host_memory", FakeProbe(mem=mem), offload_gb=30)  # needs 36 at least > 32
    assert result.status is Status.FAIL
    assert "cgroup limit 32.0 GiB" in result.message


def test_memlock_is_reported_honestly_without_failing() -> None:
    result = one("host_memory", offload_gb=10)
    assert result.status is Status.OK
    assert any("RLIMIT_MEMLOCK (8192 KiB)" in d for d in result.details)


def test_a_small_host_budget_shows_tenths() -> None:
    from vllm_offload_doctor.machine.hostbudget import host_budget

    # 0.5 GiB on the H200 printed "~4-4 GiB": 1.1 x 0.5 + 3 = 3.55 and 1.25 x 0.5 + 3 = 3.625.
    assert host_budget(0.5, 1).text.startswith("~3.5-3.6 GiB (")
    assert host_budget(0, 1).text.startswith("~3.0 GiB (")
    assert host_budget(4, 1).text.startswith("~7.4-8.0 GiB (")
    assert host_budget(40, 2).text.startswith("~94-106 GiB (")


def test_every_host_need_line_shows_tenths_for_a_small_offload() -> None:
    # check -v's fit lines and compare's preflight and host note said "~4-4 GiB" for 0.5 GiB.
    from vllm_offload_doctor.checks import fit
    from vllm_offload_doctor.compare import preflight

    for module in (fit, preflight):
        assert "need_range" in vars(module), module.__name__
    from vllm_offload_doctor.machine.hostbudget import need_range

    assert need_range(3.55, 3.625) == "~3.5-3.6 GiB"
    assert need_range(39.4, 44.1) == "~39-44 GiB"
