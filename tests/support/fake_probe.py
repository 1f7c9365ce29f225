"""A fake machine for the checks: the probe every check test reads, and the machines it plays."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from vllm_offload_doctor.checks import CheckResult, Options, run_checks
from vllm_offload_doctor.checks.context import GIB
from vllm_offload_doctor.errors import ProbeError
from vllm_offload_doctor.machine.fit import model_shape
from vllm_offload_doctor.machine.modelsize import ModelSize
from vllm_offload_doctor.machine.ports import PortState
from vllm_offload_doctor.machine.probes import (
    GpuInfo,
    HostMemory,
    InterpreterInfo,
    NvmlInfo,
    PlatformInfo,
)

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


def two_gpus(free1: int = 79 * GIB) -> NvmlInfo:
    return replace(NVML, gpus=(H100, replace(H100, index=1, memory_free=free1)))
