"""The gpu check(s), through the fake probe."""

from __future__ import annotations

from dataclasses import replace

from fake_probe import H100, NVML, FakeProbe, one, run, two_gpus

from vllm_offload_doctor.checks import Status
from vllm_offload_doctor.checks.context import GIB, visible_indices
from vllm_offload_doctor.machine.probes import (
    GpuProcess,
    NvmlInfo,
)

# --- NVML and GPUs --------------------------------------------------------------------


def test_nvml_missing_fails_with_clear_message_and_no_gpu_rows() -> None:
    probe = FakeProbe(nvml_info=NvmlInfo(error="NVML could not start: Driver Not Loaded"))
    results = run(probe, model="m")
    assert results["nvml"].status is Status.FAIL
    assert "Driver Not Loaded" in results["nvml"].message
    assert "nvidia-smi" in results["nvml"].remedy
    assert not [k for k in results if k.startswith("gpu")]
    assert results["fit"].status is Status.SKIP


def test_pynvml_module_missing_remedy() -> None:
    probe = FakeProbe(nvml_info=NvmlInfo(error="the pynvml module (nvidia-ml-py) is not installed"))
    assert one("nvml", probe).remedy == "pip install nvidia-ml-py"


def test_nvml_no_gpu_fails() -> None:
    probe = FakeProbe(nvml_info=replace(NVML, gpus=()))
    assert one("nvml", probe).status is Status.FAIL


def test_nvml_ok_reports_driver_and_cuda() -> None:
    result = one("nvml")
    assert result.status is Status.OK
    assert "550.54.15" in result.message and "12.4" in result.message


def test_tensor_parallel_needs_enough_gpus() -> None:
    result = one("nvml", tensor_parallel_size=2)
    assert result.status is Status.FAIL
    assert "needs 2" in result.message


def test_cuda_visible_devices_empty_hides_gpus() -> None:
    probe = FakeProbe(env={"CUDA_VISIBLE_DEVICES": ""})
    assert one("nvml", probe).status is Status.FAIL
    assert one("env", probe).status is Status.FAIL


def test_old_gpu_7_0_fails() -> None:
    v100 = replace(H100, name="Tesla V100-SXM2-32GB", compute_capability=(7, 0))
    result = one("gpu[0]", FakeProbe(nvml_info=replace(NVML, gpus=(v100,))))
    assert result.status is Status.FAIL
    assert "7.0" in result.message and "7.5" in result.message


def test_turing_7_5_warns_no_bf16() -> None:
    t4 = replace(H100, name="Tesla T4", compute_capability=(7, 5))
    result = one("gpu[0]", FakeProbe(nvml_info=replace(NVML, gpus=(t4,))))
    assert result.status is Status.WARN
    assert "bfloat16" in result.message
    assert "--dtype half" in result.remedy


def test_gpu_unknown_compute_capability_warns() -> None:
    gpu = replace(H100, compute_capability=None)
    assert one("gpu[0]", FakeProbe(nvml_info=replace(NVML, gpus=(gpu,)))).status is Status.WARN


def test_gpu_busy_with_other_process_fails_and_names_it() -> None:
    busy = replace(
        H100,
        memory_free=30 * GIB,
        processes=(GpuProcess(4242, "python3", 50 * GIB),),
    )
    result = one("gpu[0]", FakeProbe(nvml_info=replace(NVML, gpus=(busy,))))
    assert result.status is Status.FAIL
    assert "pid 4242 (python3)" in result.message
    assert "process pid 4242 (python3): 51200 MiB" in result.details
    assert "0.37" in result.remedy  # 30/80 rounded down


def test_mig_enabled_warns() -> None:
    gpu = replace(H100, mig_enabled=True)
    assert one("gpu[0]", FakeProbe(nvml_info=replace(NVML, gpus=(gpu,)))).status is Status.WARN


def test_pcie_reports_bandwidth_and_idle_downtraining_is_not_a_warning() -> None:
    idle = replace(H100, pcie_gen=1, pcie_width=16)
    result = one("gpu[0]", FakeProbe(nvml_info=replace(NVML, gpus=(idle,))), offload_gb=10)
    assert result.status is Status.OK
    text = "\n".join(result.details)
    assert "Gen1 x16 now (4.0 GB/s)" in text
    assert "max Gen5 x16 (63.0 GB/s" in text
    assert "save power" in text
    assert "ms per step" in text


def test_pcie_narrow_link_warns() -> None:
    narrow = replace(H100, pcie_width=8)
    assert one("gpu[0]", FakeProbe(nvml_info=replace(NVML, gpus=(narrow,)))).status is Status.WARN


def test_pcie_slow_link_warns_only_with_offload() -> None:
    slow = replace(H100, pcie_gen=3, pcie_width=4, pcie_gen_max=3, pcie_width_max=4)
    probe = FakeProbe(nvml_info=replace(NVML, gpus=(slow,)))
    assert one("gpu[0]", probe).status is Status.OK
    assert one("gpu[0]", probe, offload_gb=4).status is Status.WARN


def test_pcie_unknown() -> None:
    gpu = replace(H100, pcie_gen=None)
    result = one("gpu[0]", FakeProbe(nvml_info=replace(NVML, gpus=(gpu,))))
    assert "PCIe link: unknown" in result.details


def test_two_gpus_tensor_parallel_reports_both() -> None:
    results = run(FakeProbe(nvml_info=two_gpus()), tensor_parallel_size=2, offload_gb=8)
    assert results["gpu[0]"].status is Status.OK
    assert results["gpu[1]"].status is Status.OK
    assert "2 GPU(s), using 2" in results["nvml"].message


def test_unused_gpu_memory_is_not_a_failure() -> None:
    probe = FakeProbe(nvml_info=two_gpus(free1=1 * GIB))
    results = run(probe, tensor_parallel_size=1)
    assert results["gpu[1]"].status is Status.OK
    assert any("not used" in d for d in results["gpu[1]"].details)
    assert run(probe, tensor_parallel_size=2)["gpu[1]"].status is Status.FAIL


def test_cuda_visible_devices_selects_the_used_gpu() -> None:
    probe = FakeProbe(nvml_info=two_gpus(free1=1 * GIB), env={"CUDA_VISIBLE_DEVICES": "1"})
    results = run(probe)
    assert results["gpu[1]"].status is Status.FAIL
    assert results["gpu[0]"].status is Status.OK


def test_visible_indices() -> None:
    assert visible_indices(None, 2) == [0, 1]
    assert visible_indices("1,0", 2) == [1, 0]
    assert visible_indices("0,7,1", 2) == [0]  # CUDA stops at the first invalid entry
    assert visible_indices("", 2) == []
    assert visible_indices("GPU-1234", 2) is None
