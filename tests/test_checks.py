"""Every check, through a fake Probe, for each status it can give."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import pytest

from vllm_offload_doctor import exitcodes
from vllm_offload_doctor.checks import CheckResult, Options, Report, Status, run_checks
from vllm_offload_doctor.checks.context import GIB, visible_indices
from vllm_offload_doctor.checks.env import env_effect
from vllm_offload_doctor.checks.platform import kernel_tuple
from vllm_offload_doctor.checks.render import render
from vllm_offload_doctor.errors import ProbeError
from vllm_offload_doctor.links import DOCTOR_ISSUES
from vllm_offload_doctor.machine.fit import model_shape
from vllm_offload_doctor.machine.modelsize import ModelNotFoundError, ModelSize
from vllm_offload_doctor.machine.ports import PortState
from vllm_offload_doctor.machine.probes import (
    GpuInfo,
    GpuProcess,
    HostMemory,
    InterpreterInfo,
    NvmlInfo,
    PlatformInfo,
)
from vllm_offload_doctor.output.formats import OutputFormat

LINUX = PlatformInfo("Linux", "6.8.0-45-generic", "x86_64", vllm_sees_wsl=False)
WSL2 = PlatformInfo(
    "Linux",
    "5.15.153.1-microsoft-standard-WSL2",
    "x86_64",
    vllm_sees_wsl=True,
    wsl_markers=("WSL_DISTRO_NAME",),
)
H100 = GpuInfo(
    index=0,
    name="NVIDIA H100 80GB HBM3",
    compute_capability=(9, 0),
    memory_total=80 * GIB,
    memory_free=79 * GIB,
    mig_enabled=False,
    pcie_gen=5,
    pcie_width=16,
    pcie_gen_max=5,
    pcie_width_max=16,
)
NVML = NvmlInfo(driver_version="550.54.15", cuda_driver_version="12.4", gpus=(H100,))
PY = InterpreterInfo(
    executable="/opt/venv/bin/python",
    source="shebang of /opt/venv/bin/vllm",
    python_version="3.12.3",
    vllm_version="0.33.0",
    vllm_requires_python="<3.15,>=3.11",
    torch_version="2.14.0",
)
MEM = HostMemory(
    total=256 * GIB,
    available=200 * GIB,
    swap_total=0,
    swap_free=0,
    memlock_soft=8 << 20,
    memlock_hard=8 << 20,
)
SHAPE_8B = model_shape(
    {
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "max_position_embeddings": 131072,
    },
    "bfloat16",
)  # fmt: skip
SHAPE_70B = model_shape(
    {
        "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "intermediate_size": 28672, "max_position_embeddings": 131072,
    },
    "bfloat16",
)  # fmt: skip
MODEL_16G = ModelSize(
    path="/models/llama-8b",
    total_bytes=16 * GIB,
    source="safetensors index",
    estimated=False,
    architectures=("LlamaForCausalLM",),
    dtype="bfloat16",
    shape=SHAPE_8B,
)


@dataclass
class FakeProbe:
    plat: PlatformInfo = LINUX
    interp: InterpreterInfo = PY
    nvml_info: NvmlInfo = NVML
    mem: HostMemory = MEM
    port_state: PortState | OSError = field(
        default_factory=lambda: PortState("127.0.0.1", 8000, True)
    )
    env: dict[str, str] = field(default_factory=dict)
    model: ModelSize | Exception = MODEL_16G
    crash: set[str] = field(default_factory=set)  # probes that cannot run (ProbeError)
    bugs: set[str] = field(default_factory=set)  # probes that raise what nothing expects
    calls: dict[str, int] = field(default_factory=dict)

    def _hit(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.crash:
            raise ProbeError(f"{name} probe could not run")
        if name in self.bugs:
            raise RuntimeError(f"{name} probe exploded")

    def platform(self) -> PlatformInfo:
        self._hit("platform")
        return self.plat

    def interpreter(self, python: str | None) -> InterpreterInfo:
        self._hit("interpreter")
        return self.interp

    def nvml(self) -> NvmlInfo:
        self._hit("nvml")
        return self.nvml_info

    def host_memory(self) -> HostMemory:
        self._hit("host_memory")
        return self.mem

    def port(self, host: str, port: int) -> PortState:
        self._hit("port")
        if isinstance(self.port_state, OSError):
            raise self.port_state
        return self.port_state

    def environ(self) -> Mapping[str, str]:
        self._hit("environ")
        return self.env

    def model_size(self, model: str) -> ModelSize:
        self._hit("model_size")
        if isinstance(self.model, Exception):
            raise self.model
        return self.model


def run(probe: FakeProbe | None = None, **options: object) -> dict[str, CheckResult]:
    report = run_checks(probe or FakeProbe(), Options(**options))  # type: ignore[arg-type]
    return {c.id: c for c in report.checks}


def one(check_id: str, probe: FakeProbe | None = None, **options: object) -> CheckResult:
    return run(probe, **options)[check_id]


# --- whole report ------------------------------------------------------------------


def test_healthy_machine_is_all_ok_except_fit_skip() -> None:
    results = run()
    assert list(results) == [
        "os", "wsl", "python", "vllm", "nvml", "gpu[0]", "host_memory", "fit", "port", "env",
    ]  # fmt: skip
    assert {c.status for k, c in results.items() if k != "fit"} == {Status.OK}
    assert results["fit"].status is Status.SKIP


def test_each_probe_is_read_once() -> None:
    probe = FakeProbe()
    run(probe, model="x", offload_gb=4)
    assert all(n == 1 for n in probe.calls.values()), probe.calls


def test_a_probe_that_cannot_run_becomes_skip_with_reason_and_others_still_run() -> None:
    results = run(FakeProbe(crash={"nvml"}))
    assert results["nvml"].status is Status.SKIP
    assert "nvml probe could not run" in results["nvml"].message
    assert results["gpu"].status is Status.SKIP
    assert results["os"].status is Status.OK


def test_a_crashing_check_is_a_bug_with_the_report_link_not_a_skip() -> None:
    report = run_checks(FakeProbe(bugs={"nvml"}), Options())
    results = {c.id: c for c in report.checks}
    bug = results["nvml"]
    assert bug.status is Status.BUG
    assert (
        "RuntimeError: nvml probe exploded" in bug.message
        and "bug of offload-doctor" in bug.message
    )
    assert bug.links == (DOCTOR_ISSUES,) and DOCTOR_ISSUES in bug.remedy
    assert bug.details and bug.details[0].startswith("raised at test_checks.py:")
    assert results["os"].status is Status.OK
    assert report.exit_code() == exitcodes.INTERNAL
    text = render(report, OutputFormat.TEXT)
    assert "[☠] NVIDIA driver (NVML): this check crashed" in text and "→ Please report it" in text
    assert text.splitlines()[-1].startswith("☠ No issues found, but a check crashed")
    assert "☠️ bug" in render(report, OutputFormat.MARKDOWN)


def test_exit_codes() -> None:
    ok = CheckResult("a", "A", Status.OK, "")
    warn = CheckResult("b", "B", Status.WARN, "")
    fail = CheckResult("c", "C", Status.FAIL, "")
    skip = CheckResult("d", "D", Status.SKIP, "")
    assert Report((ok, warn, skip)).exit_code() == 0
    assert Report((ok, warn)).exit_code(strict=True) == 1
    assert Report((ok, skip)).exit_code(strict=True) == 0
    assert Report((ok, fail)).exit_code() == 1
    assert Report((skip, skip)).exit_code() == 2
    bug = CheckResult("e", "E", Status.BUG, "")
    assert Report((ok, bug)).exit_code() == 3
    assert Report((fail, bug)).exit_code() == 1  # what was found outranks our crash


@dataclass
class MeetingProbe(FakeProbe):
    """The slow probes pass only once all of them are running at the same time."""

    meeting: threading.Barrier = field(default_factory=lambda: threading.Barrier(4, timeout=2))

    def _hit(self, name: str) -> None:
        super()._hit(name)
        if name in ("platform", "interpreter", "nvml", "host_memory"):
            self.meeting.wait()


def test_the_slow_probes_run_together() -> None:
    # NVML, vLLM's Python, uname (platform) and /proc each wait on the machine: one at a time,
    # check would take the sum of their waits.
    probe = MeetingProbe()
    results = run(probe)
    assert {c.status for c in results.values()} <= {Status.OK, Status.SKIP}, results
    assert all(probe.calls[n] == 1 for n in ("platform", "interpreter", "nvml", "host_memory"))


def test_every_probe_crashing_exits_2() -> None:
    everything = {"platform", "interpreter", "nvml", "host_memory", "port", "environ"}
    report = run_checks(FakeProbe(crash=everything), Options())
    assert {c.status for c in report.checks} == {Status.SKIP}
    assert report.exit_code() == 2


def test_json_dict_schema() -> None:
    report = run_checks(FakeProbe(), Options(offload_gb=2))
    data = report.to_dict()
    assert data["schema_version"] == 1
    assert set(data) == {"schema_version", "tool_version", "checks", "summary", "facts"}
    assert set(data["checks"][0]) == {
        "id", "title", "status", "message", "details", "remedy", "links",
    }  # fmt: skip
    assert data["summary"] == {"ok": 9, "warn": 0, "fail": 0, "skip": 1, "bug": 0}  # a new key
    assert data["facts"]["nvml"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert data["facts"]["options"]["offload_gb"] == 2


# --- os and WSL ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("system", "status", "words"),
    [
        ("Linux", Status.OK, "Linux"),
        ("Windows", Status.FAIL, "native Windows"),
        ("Darwin", Status.FAIL, "macOS"),
        ("FreeBSD", Status.FAIL, "needs Linux"),
    ],
)
def test_os(system: str, status: Status, words: str) -> None:
    result = one("os", FakeProbe(plat=replace(LINUX, system=system)))
    assert result.status is status
    assert words in result.message
    if system == "Windows":
        assert "WSL2" in result.remedy


def test_wsl_native_linux_is_ok() -> None:
    assert one("wsl").status is Status.OK


def test_wsl_skipped_off_linux() -> None:
    assert one("wsl", FakeProbe(plat=replace(LINUX, system="Darwin"))).status is Status.SKIP


def test_wsl_markers_without_microsoft_kernel_warn() -> None:
    probe = FakeProbe(plat=replace(LINUX, wsl_markers=("WSL_INTEROP",)))
    assert one("wsl", probe).status is Status.WARN


def test_wsl2_without_pin_memory_variable_warns() -> None:
    result = one("wsl", FakeProbe(plat=WSL2))
    assert result.status is Status.WARN
    assert "VLLM_WSL2_ENABLE_PIN_MEMORY" in result.message
    assert result.remedy == "export VLLM_WSL2_ENABLE_PIN_MEMORY=1"


def test_wsl2_with_pin_memory_variable_ok() -> None:
    probe = FakeProbe(plat=WSL2, env={"VLLM_WSL2_ENABLE_PIN_MEMORY": "1"})
    result = one("wsl", probe)
    assert result.status is Status.OK
    assert any("half of physical RAM" in d for d in result.details)


def test_wsl2_offload_above_windows_pinned_cap_warns() -> None:
    probe = FakeProbe(plat=WSL2, env={"VLLM_WSL2_ENABLE_PIN_MEMORY": "1"})
    result = one("wsl", probe, offload_gb=70, tensor_parallel_size=2)  # 140 > 256 / 2
    assert result.status is Status.WARN
    assert "cap" in result.message
    assert one("wsl", probe, offload_gb=60, tensor_parallel_size=2).status is Status.OK


def test_wsl2_old_kernel_warns() -> None:
    plat = replace(WSL2, release="4.19.104-microsoft-standard")
    probe = FakeProbe(plat=plat, env={"VLLM_WSL2_ENABLE_PIN_MEMORY": "1"})
    result = one("wsl", probe)
    assert result.status is Status.WARN
    assert "4.19.121" in result.message
    assert "wsl --update" in result.remedy


def test_wsl1_fails() -> None:
    plat = replace(WSL2, release="4.4.0-19041-Microsoft")
    assert one("wsl", FakeProbe(plat=plat)).status is Status.FAIL


@pytest.mark.parametrize(
    ("version", "status"),
    [("0.16.0", Status.FAIL), ("0.20.2", Status.WARN), ("0.23.0", Status.WARN)],
)
def test_wsl2_with_older_vllm(version: str, status: Status) -> None:
    probe = FakeProbe(plat=WSL2, interp=replace(PY, vllm_version=version))
    assert one("wsl", probe).status is status


def test_kernel_tuple() -> None:
    assert kernel_tuple("5.15.153.1-microsoft-standard-WSL2") == (5, 15, 153, 1)
    assert kernel_tuple("4.19.121-microsoft-standard") >= (4, 19, 121)
    assert kernel_tuple("6.8.0+") == (6, 8)


# --- Python and vLLM -------------------------------------------------------------------


def test_python_in_requires_python_ok() -> None:
    result = one("python")
    assert result.status is Status.OK
    assert "3.12.3" in result.message
    assert "interpreter: /opt/venv/bin/python" in result.details


def test_python_outside_requires_python_fails() -> None:
    result = one("python", FakeProbe(interp=replace(PY, python_version="3.10.12")))
    assert result.status is Status.FAIL
    assert ">=3.11" in result.message


def test_python_without_vllm_judged_against_current_vllm() -> None:
    interp = replace(PY, python_version="3.10.12", vllm_version=None, vllm_requires_python=None)
    result = one("python", FakeProbe(interp=interp))
    assert result.status is Status.WARN
    assert "current vLLM" in result.message


def test_python_interpreter_that_cannot_run_fails() -> None:
    interp = InterpreterInfo("/gone/python", "--python", error="cannot run it: No such file")
    results = run(FakeProbe(interp=interp))
    assert results["python"].status is Status.FAIL
    assert results["vllm"].status is Status.SKIP


def test_vllm_missing_fails() -> None:
    result = one("vllm", FakeProbe(interp=replace(PY, vllm_version=None)))
    assert result.status is Status.FAIL
    assert "not installed" in result.message


@pytest.mark.parametrize(
    ("version", "env", "status"),
    [
        ("0.33.0", None, Status.OK),
        ("0.28.0", "1", Status.OK),
        ("0.27.1", None, Status.FAIL),
        ("0.25.0", "1", Status.FAIL),
        ("0.27.1", "0", Status.OK),
        ("0.23.0", None, Status.WARN),
        ("0.23.0", "0", Status.OK),
        ("0.19.0", None, Status.OK),
        ("0.19.0", "1", Status.FAIL),
        ("0.14.0", None, Status.WARN),
        ("0.8.5", None, Status.WARN),
        ("0.27.1.dev3+gabc", None, Status.FAIL),
    ],
)
def test_vllm_version_advice(version: str, env: str | None, status: Status) -> None:
    probe = FakeProbe(
        interp=replace(PY, vllm_version=version),
        env={"VLLM_USE_V2_MODEL_RUNNER": env} if env is not None else {},
    )
    result = one("vllm", probe)
    assert result.status is status, result.message
    if status is Status.FAIL:
        assert "https://github.com/vllm-project/vllm/issues/51396" in result.links
        assert "https://github.com/vllm-project/vllm/pull/51413" in result.links
        assert "0.28.0" in result.remedy


def test_vllm_unparseable_version_warns() -> None:
    assert one("vllm", FakeProbe(interp=replace(PY, vllm_version="banana"))).status is Status.WARN


def test_vllm_reports_torch() -> None:
    assert "torch 2.14.0" in one("vllm").details


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


def two_gpus(free1: int = 79 * GIB) -> NvmlInfo:
    return replace(NVML, gpus=(H100, replace(H100, index=1, memory_free=free1)))


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


# --- port ------------------------------------------------------------------------------


def test_port_free_ok() -> None:
    assert one("port").status is Status.OK


def test_busy_port_fails_and_names_holder() -> None:
    busy = PortState("127.0.0.1", 8000, False, pid=777, process="vllm")
    result = one("port", FakeProbe(port_state=busy))
    assert result.status is Status.FAIL
    assert "pid 777 (vllm)" in result.message
    assert "already be running" in result.message


def test_port_that_cannot_be_tested_skips() -> None:
    err = OSError(99, "Cannot assign requested address")
    result = one("port", FakeProbe(port_state=err), host="10.9.9.9")
    assert result.status is Status.SKIP
    assert "Cannot assign requested address" in result.message


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


# --- whose Python: vLLM's, found for the doctor in its own environment ----------------------

OWN = InterpreterInfo(
    "/home/u/.local/share/pipx/venvs/vllm-offload-doctor/bin/python",
    "this interpreter (no vllm on PATH)",
    python_version="3.12.3",
    own=True,
)


def test_the_doctors_own_python_is_never_taken_for_vllms() -> None:
    results = run(FakeProbe(interp=OWN))
    python, vllm = results["python"], results["vllm"]
    assert python.status is Status.SKIP and "no `vllm` on PATH" in python.message
    assert vllm.status is Status.FAIL and "vLLM not found" in vllm.message
    # No advice to install vLLM into the doctor's private environment.
    assert "pip install" not in vllm.remedy and "--python" in vllm.remedy
    assert OWN.executable not in vllm.remedy


def test_the_doctors_own_python_with_vllm_is_vllms() -> None:
    """Installed beside vLLM (same venv, not activated): that interpreter is vLLM's."""
    own = replace(OWN, vllm_version="0.33.0", vllm_requires_python=">=3.11,<3.15")
    python = one("python", FakeProbe(interp=own))
    assert python.status is Status.OK
    assert python.message.startswith("Python 3.12.3 (offload-doctor's own) meets vLLM 0.33.0")


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("shebang of /opt/venv/bin/vllm", "behind `vllm` on PATH"),
        ("--python", "--python"),
    ],
)
def test_the_python_line_says_how_the_interpreter_was_found(source: str, said: str) -> None:
    python = one("python", FakeProbe(interp=replace(PY, source=source)))
    assert python.status is Status.OK and f"Python 3.12.3 ({said}) meets" in python.message


def test_a_chosen_python_without_vllm_is_told_how_to_install_into_it() -> None:
    vllm = one("vllm", FakeProbe(interp=replace(PY, vllm_version=None, source="--python")))
    assert vllm.remedy.startswith(f"{PY.executable} -m pip install vllm")
