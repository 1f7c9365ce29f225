"""Everything `check` reads from the machine, behind one `Probe` Protocol so tests pass fakes.

The real probe never imports torch or vllm: versions come from package metadata read by a
short `python -c` in the interpreter that runs vLLM (read here when that is this interpreter),
GPUs from NVML (`early.start_nvml` begins that read at start-up), memory from /proc/meminfo (psutil where that
does not answer) and the cgroup files. pynvml and psutil are imported inside the methods so that
the CLI starts fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform as _platform
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from vllm_offload_doctor.machine.early import take_nvml
from vllm_offload_doctor.machine.modelsize import ModelSize, inspect_model
from vllm_offload_doctor.machine.ports import PortState, probe_port
from vllm_offload_doctor.machine.procstatus import parse_status

INTERPRETER_TIMEOUT_S = 10.0
# Above this a cgroup "limit" means "no limit" (v1 reports 2**63 rounded to the page size).
_UNLIMITED = 1 << 60


@dataclass(frozen=True, slots=True)
class PlatformInfo:
    system: str  # platform.system(): Linux, Windows, Darwin
    release: str  # kernel release, e.g. 5.15.153.1-microsoft-standard-WSL2
    machine: str
    vllm_sees_wsl: bool  # vLLM's own test: "microsoft" in " ".join(platform.uname()).lower()
    wsl_markers: tuple[str, ...] = ()  # environment/file markers of WSL that were found


@dataclass(frozen=True, slots=True)
class InterpreterInfo:
    executable: str
    source: str  # how it was chosen, for the details
    python_version: str | None = None
    vllm_version: str | None = None
    vllm_requires_python: str | None = None
    torch_version: str | None = None
    error: str | None = None  # the interpreter could not be run or did not answer
    # The doctor's own interpreter, taken for want of `vllm` on PATH: vLLM's only if it has vLLM.
    own: bool = False


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    name: str | None
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    name: str
    compute_capability: tuple[int, int] | None
    memory_total: int | None
    memory_free: int | None
    mig_enabled: bool | None = None
    processes: tuple[GpuProcess, ...] = ()
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    memory_used: int | None = None  # NVML's own figure (compare reports it per device)
    # The driver's reserve: CUDA (and so vLLM's gpu_memory_utilization) sees total - reserved.
    memory_reserved: int | None = None

    @property
    def memory_usable(self) -> int | None:
        """What CUDA reports as total memory, the figure vLLM's budget is a fraction of."""
        if self.memory_total is None:
            return None
        return self.memory_total - (self.memory_reserved or 0)


@dataclass(frozen=True, slots=True)
class NvmlInfo:
    error: str | None = None  # set when NVML is missing or failed: then gpus is empty
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # "12.4"
    gpus: tuple[GpuInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class HostMemory:
    total: int
    available: int
    swap_total: int
    swap_free: int
    cgroup_limit: int | None = None  # None: no cgroup limit
    cgroup_usage: int | None = None
    memlock_soft: int | None = None  # None: unlimited
    memlock_hard: int | None = None


class Probe(Protocol):
    """What `check` needs to know about the machine."""

    def platform(self) -> PlatformInfo: ...

    def interpreter(self, python: str | None) -> InterpreterInfo: ...

    def nvml(self) -> NvmlInfo: ...

    def host_memory(self) -> HostMemory: ...

    def port(self, host: str, port: int) -> PortState: ...

    def environ(self) -> Mapping[str, str]: ...

    def model_size(self, model: str) -> ModelSize: ...


class RealProbe:
    """The probe used on a real machine."""

    def __init__(self, root: Path = Path("/")) -> None:
        self.root = root  # tests point this at a fake /proc and /sys tree

    def platform(self) -> PlatformInfo:
        uname = _platform.uname()
        markers = [name for name in ("WSL_DISTRO_NAME", "WSL_INTEROP") if os.environ.get(name)]
        if (self.root / "proc/sys/fs/binfmt_misc/WSLInterop").exists():
            markers.append("/proc/sys/fs/binfmt_misc/WSLInterop")
        return PlatformInfo(
            system=uname.system,
            release=uname.release,
            machine=uname.machine,
            vllm_sees_wsl="microsoft" in " ".join(uname).lower(),
            wsl_markers=tuple(markers),
        )

    def interpreter(self, python: str | None) -> InterpreterInfo:
        executable, source = find_interpreter(python)
        info = read_own_interpreter(executable, source) or read_interpreter(executable, source)
        return replace(info, own=source.startswith(OWN_SOURCE))

    def nvml(self) -> NvmlInfo:
        return take_nvml() or read_nvml()

    def host_memory(self) -> HostMemory:
        total, available, swap_total, swap_free = read_meminfo(self.root) or _psutil_memory()
        limit, usage = read_cgroup_memory(self.root)
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        return HostMemory(
            total=total,
            available=available,
            swap_total=swap_total,
            swap_free=swap_free,
            cgroup_limit=limit,
            cgroup_usage=usage,
            memlock_soft=None if soft == resource.RLIM_INFINITY else soft,
            memlock_hard=None if hard == resource.RLIM_INFINITY else hard,
        )

    def port(self, host: str, port: int) -> PortState:
        return probe_port(host, port)

    def environ(self) -> Mapping[str, str]:
        return dict(os.environ)

    def model_size(self, model: str) -> ModelSize:
        return inspect_model(model, os.environ, Path.home())


# --- interpreter -------------------------------------------------------------------------

# Reads metadata only: importing vllm or torch would take seconds and touch the GPU.
_METADATA_SCRIPT = """
import json, sys
from importlib import metadata as m
def v(n):
    try:
        return m.version(n)
    except Exception:
        return None
rp = None
try:
    rp = m.metadata('vllm').get('Requires-Python')
except Exception:
    pass
print(json.dumps({'python': '%d.%d.%d' % tuple(sys.version_info[:3]), 'vllm': v('vllm'),
                  'requires_python': rp, 'torch': v('torch')}))
"""


OWN_SOURCE = "this interpreter"


def find_interpreter(python: str | None) -> tuple[str, str]:
    """The interpreter that runs vLLM: --python, else the shebang of `vllm` on PATH.

    From a pipx or uv tool install the doctor's own Python is private and never vLLM's: `vllm` on
    PATH is how vLLM's is found; only without it does the answer fall back to this interpreter.
    """
    if python:
        return python, "--python"
    script = shutil.which("vllm")
    if script:
        interp = shebang_interpreter(Path(script))
        if interp:
            return interp, f"shebang of {script}"
        return sys.executable, f"{OWN_SOURCE} ({script} has no readable shebang)"
    return sys.executable, f"{OWN_SOURCE} (no vllm on PATH)"


def shebang_interpreter(script: Path) -> str | None:
    """The Python a console script runs with, from `#!...` or pip's `/bin/sh` trampoline."""
    try:
        with script.open("rb") as fh:
            head = fh.read(1024).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    parts = head[0][2:].strip().split()
    if not parts:
        return None
    if parts[0].endswith("/env"):
        args = [p for p in parts[1:] if not p.startswith("-")]
        return shutil.which(args[0]) if args else None
    if parts[0] in ("/bin/sh", "/usr/bin/sh") and len(head) > 1:
        # pip writes this when the interpreter path is too long for a shebang line:
        # '''exec' "/very/long/venv/bin/python" "$0" "$@"
        line = head[1]
        if line.startswith("'''exec'"):
            quoted = line.split('"')
            return quoted[1] if len(quoted) > 1 else None
        return None
    return parts[0]


# What sets sys.path at start-up besides the interpreter and its flags, as it was then (nothing
# the doctor runs before this module is imported changes it).
_PATH_VARIABLES = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "PYTHONPLATLIBDIR",
    "PYTHONNOUSERSITE",
    "PYTHONSAFEPATH",
)
_START_PATH_ENV = tuple(os.environ.get(name) for name in _PATH_VARIABLES)


def read_own_interpreter(executable: str, source: str) -> InterpreterInfo | None:
    """`read_interpreter`'s answer for this very interpreter, read here without a subprocess.

    A `python -c` of the same interpreter in the same environment searches this process's
    sys.path, its first entry (our script's directory) replaced by its own: the working directory
    (none with -P). None, so that the subprocess answers, where the two could differ: another
    interpreter, flags that change the path (-I, -S, -E, -s, -P), or a path variable changed since
    start-up.
    """
    flags = sys.flags
    if (
        executable != sys.executable
        or flags.isolated
        or flags.no_site
        or flags.ignore_environment
        or bool(flags.no_user_site) != bool(os.environ.get("PYTHONNOUSERSITE"))
        or bool(flags.safe_path) != bool(os.environ.get("PYTHONSAFEPATH"))
        or tuple(os.environ.get(name) for name in _PATH_VARIABLES) != _START_PATH_ENV
    ):
        return None
    try:
        search = list(sys.path) if flags.safe_path else [os.getcwd(), *sys.path[1:]]
    except OSError:  # the working directory is gone: leave it to the subprocess
        return None
    from importlib import metadata

    def first(name: str) -> metadata.Distribution:
        return next(iter(metadata.distributions(name=name, path=search)))

    def answer(read: Callable[[], str | None]) -> str | None:
        try:  # as in the metadata script, any failure to read is "unknown"
            return read()
        except Exception:
            return None

    return InterpreterInfo(
        executable=executable,
        source=source,
        python_version=".".join(map(str, sys.version_info[:3])),
        vllm_version=answer(lambda: first("vllm").version),
        vllm_requires_python=answer(
            lambda: first("vllm").metadata.get("Requires-Python")  # type: ignore[attr-defined]
        ),
        torch_version=answer(lambda: first("torch").version),
    )


def read_interpreter(
    executable: str, source: str, env: dict[str, str] | None = None
) -> InterpreterInfo:
    """Ask another interpreter for its version and the vllm/torch package metadata.

    `env`: the environment to run it in (a live server's PYTHONPATH), else ours.
    """
    try:
        proc = subprocess.run(
            [executable, "-c", _METADATA_SCRIPT],
            capture_output=True,
            text=True,
            env=env,
            timeout=INTERPRETER_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return InterpreterInfo(
            executable, source, error=f"did not answer within {INTERPRETER_TIMEOUT_S:.0f} s"
        )
    except OSError as exc:
        return InterpreterInfo(executable, source, error=f"cannot run it: {exc.strerror or exc}")
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return InterpreterInfo(executable, source, error=f"exit {proc.returncode}: {tail}")
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return InterpreterInfo(executable, source, error="unreadable answer from the interpreter")
    return InterpreterInfo(
        executable=executable,
        source=source,
        python_version=data.get("python"),
        vllm_version=data.get("vllm"),
        vllm_requires_python=data.get("requires_python"),
        torch_version=data.get("torch"),
    )


# --- memory ------------------------------------------------------------------------------


def read_meminfo(root: Path) -> tuple[int, int, int, int] | None:
    """(total, available, swap total, swap free) in bytes from /proc/meminfo, as psutil reads them.

    None where psutil would compute or correct a figure (no MemAvailable, 0, or above MemTotal in
    some containers) or the file is missing: psutil answers those. Reading the file directly spares
    importing psutil, the largest import of `check` after NVML's.
    """
    text = _read_text(root / "proc/meminfo")
    if text is None:
        return None
    kib = parse_status(text)  # the same `NAME: N kB` lines as /proc/PID/status
    try:
        total, available = kib["MemTotal"] * 1024, kib["MemAvailable"] * 1024
        swap_total, swap_free = kib["SwapTotal"] * 1024, kib["SwapFree"] * 1024
    except KeyError:
        return None
    if not 0 < available <= total:
        return None
    return total, available, swap_total, swap_free


def _psutil_memory() -> tuple[int, int, int, int]:
    import psutil

    vm = psutil.virtual_memory()
    swap = psutil.swap_memory()
    return vm.total, vm.available, swap.total, swap.free


def read_cgroup_memory(root: Path) -> tuple[int | None, int | None]:
    """(limit, usage) in bytes of this process's memory cgroup; limit None when unlimited."""
    candidates = (
        ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory.current"),  # v2
        (
            "sys/fs/cgroup/memory/memory.limit_in_bytes",
            "sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    )
    for limit_name, usage_name in candidates:
        limit_text = _read_text(root / limit_name)
        if limit_text is None:
            continue
        usage_text = _read_text(root / usage_name)
        usage = int(usage_text) if usage_text and usage_text.isdigit() else None
        if not limit_text.isdigit() or int(limit_text) >= _UNLIMITED:
            return None, usage
        return int(limit_text), usage
    return None, None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


# --- NVML --------------------------------------------------------------------------------

T = TypeVar("T")


def read_nvml() -> NvmlInfo:
    """Driver, CUDA driver and per-GPU facts; NVML problems become `NvmlInfo.error`."""
    try:
        import pynvml
    except ImportError:
        return NvmlInfo(error="the pynvml module (nvidia-ml-py) is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return NvmlInfo(error=f"NVML could not start: {_text(str(exc))}")
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = _optional(pynvml, pynvml.nvmlSystemGetCudaDriverVersion)
        gpus = tuple(
            _read_gpu(pynvml, i, pynvml.nvmlDeviceGetHandleByIndex(i))
            for i in range(pynvml.nvmlDeviceGetCount())
        )
    except pynvml.NVMLError as exc:
        return NvmlInfo(error=f"NVML query failed: {_text(str(exc))}")
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return NvmlInfo(driver_version=driver, cuda_driver_version=cuda_version(cuda), gpus=gpus)


def cuda_version(value: int | None) -> str | None:
    """NVML's integer CUDA version (12040) as text ("12.4")."""
    if not value:
        return None
    return f"{value // 1000}.{value % 1000 // 10}"


def _read_gpu(nvml: Any, index: int, handle: Any) -> GpuInfo:
    cc = _optional(nvml, nvml.nvmlDeviceGetCudaComputeCapability, handle)
    mem = _optional(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    mem2 = _memory_v2(nvml, handle)
    mig = _optional(nvml, nvml.nvmlDeviceGetMigMode, handle)
    procs = _optional(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
    return GpuInfo(
        index=index,
        name=_text(nvml.nvmlDeviceGetName(handle)),
        compute_capability=(int(cc[0]), int(cc[1])) if cc else None,
        memory_total=int(mem.total) if mem else None,
        memory_free=int(mem.free) if mem else None,
        mig_enabled=bool(mig[0]) if mig else None,
        processes=tuple(
            GpuProcess(int(p.pid), process_name(int(p.pid)), used_memory(p)) for p in procs
        ),
        pcie_gen=_optional(nvml, nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        pcie_width=_optional(nvml, nvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
        pcie_gen_max=_optional(nvml, nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        pcie_width_max=_optional(nvml, nvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
        memory_used=int(mem.used) if mem else None,
        memory_reserved=int(mem2.reserved) if mem2 is not None else None,
    )


def _memory_v2(nvml: Any, handle: Any) -> Any:
    """NVML's v2 memory record (it adds `reserved`); None where the binding or driver lacks it."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is None:
        return None
    try:
        return nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
    except (nvml.NVMLError, TypeError, AttributeError):
        return None


def _optional(nvml: Any, fn: Callable[..., T], *args: Any) -> T | None:
    """Many NVML queries are NotSupported on some boards or in containers: that is 'unknown'."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def used_memory(proc: Any) -> int | None:
    used = getattr(proc, "usedGpuMemory", None)
    # NVML reports "not available" (e.g. under WDDM or without permission) as None or 2**64-1.
    return int(used) if isinstance(used, int) and 0 <= used < 1 << 63 else None


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def process_name(pid: int) -> str | None:
    try:
        import psutil

        return psutil.Process(pid).name()
    except Exception:  # gone, other pid namespace, or no permission: the pid is still useful
        return None
