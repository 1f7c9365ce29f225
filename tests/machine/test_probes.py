"""The real probe's readers, against a fake pynvml module, fake interpreters and fake files."""

from __future__ import annotations

import json
import os
import platform
import stat
import subprocess
import sys
import types
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest

from vllm_offload_doctor.machine import early, probes
from vllm_offload_doctor.machine.modelsize import (
    ModelNotFoundError,
    ModelSizeUnknownError,
    estimate_bytes,
    inspect_model,
    locate_model,
)
from vllm_offload_doctor.machine.probes import (
    RealProbe,
    cuda_version,
    find_interpreter,
    read_cgroup_memory,
    read_interpreter,
    read_meminfo,
    read_nvml,
    read_own_interpreter,
    shebang_interpreter,
)

GIB = 1 << 30

# --- fake pynvml --------------------------------------------------------------------


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


Mem = namedtuple("Mem", "total free used")
Proc = namedtuple("Proc", "pid usedGpuMemory")


def fake_pynvml(
    *, init_error: str | None = None, gpus: list[dict[str, Any]] | None = None
) -> types.ModuleType:
    mod = types.ModuleType("pynvml")
    gpus = gpus if gpus is not None else [{}]
    state = {"shutdown": 0}

    def init() -> None:
        if init_error:
            raise NVMLError(init_error)

    def field(name: str, default: Any) -> Any:
        def get(handle: int) -> Any:
            value = gpus[handle].get(name, default)
            if isinstance(value, Exception):
                raise value
            return value

        return get

    mod.NVMLError = NVMLError  # type: ignore[attr-defined]
    mod.nvmlInit = init  # type: ignore[attr-defined]
    mod.nvmlShutdown = lambda: state.__setitem__("shutdown", state["shutdown"] + 1)  # type: ignore[attr-defined]
    mod.nvmlSystemGetDriverVersion = lambda: b"550.54.15"  # type: ignore[attr-defined]
    mod.nvmlSystemGetCudaDriverVersion = lambda: 12040  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    mod.nvmlDeviceGetName = field("name", b"NVIDIA H200")  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCudaComputeCapability = field("cc", (9, 0))  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMemoryInfo = field("mem", Mem(141 * GIB, 140 * GIB, GIB))  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMigMode = field("mig", NVMLError_NotSupported("Not Supported"))  # type: ignore[attr-defined]
    mod.nvmlDeviceGetComputeRunningProcesses = field("procs", [])  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCurrPcieLinkGeneration = field("gen", 1)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCurrPcieLinkWidth = field("width", 16)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMaxPcieLinkGeneration = field("gen_max", 5)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMaxPcieLinkWidth = field("width_max", 16)  # type: ignore[attr-defined]
    mod.state = state  # type: ignore[attr-defined]
    return mod


def test_read_nvml_decodes_bytes_and_tolerates_not_supported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mod = fake_pynvml(
        gpus=[{"procs": [Proc(os.getpid(), 2 * GIB), Proc(999999, None)]}, {"mig": (1, 1)}]
    )
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    info = read_nvml()
    assert info.error is None
    assert info.driver_version == "550.54.15"
    assert info.cuda_driver_version == "12.4"
    first, second = info.gpus
    assert first.name == "NVIDIA H200"
    assert first.compute_capability == (9, 0)
    assert first.memory_total == 141 * GIB
    assert first.mig_enabled is None  # NotSupported is "unknown", not a crash
    assert second.mig_enabled is True
    assert (first.pcie_gen, first.pcie_width, first.pcie_gen_max) == (1, 16, 5)
    me, ghost = first.processes
    assert me.pid == os.getpid() and me.used_bytes == 2 * GIB and me.name
    assert ghost.name is None and ghost.used_bytes is None
    assert mod.state["shutdown"] == 1


def test_read_nvml_init_failure_is_an_error_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error="Driver Not Loaded"))
    info = read_nvml()
    assert info.error == "NVML could not start: Driver Not Loaded"
    assert info.gpus == ()


def test_read_nvml_query_failure_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = fake_pynvml(gpus=[{"name": NVMLError("GPU is lost")}])
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    info = read_nvml()
    assert info.error == "NVML query failed: GPU is lost"
    assert mod.state["shutdown"] == 1


def test_read_nvml_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert "nvidia-ml-py" in (read_nvml().error or "")


def test_read_nvml_on_this_machine_never_raises() -> None:
    info = read_nvml()
    assert info.error is not None or info.gpus


def test_cuda_version() -> None:
    assert cuda_version(12040) == "12.4"
    assert cuda_version(13000) == "13.0"
    assert cuda_version(None) is None


# --- interpreter ----------------------------------------------------------------------


def script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_shebang_forms(tmp_path: Path) -> None:
    plain = script(tmp_path / "a", "#!/opt/venv/bin/python3\nimport x\n")
    assert shebang_interpreter(plain) == "/opt/venv/bin/python3"
    env = script(tmp_path / "b", "#!/usr/bin/env -S python3\n")
    assert shebang_interpreter(env) == __import__("shutil").which("python3")
    long_path = "/very/long/venv/bin/python"
    pip = script(tmp_path / "c", f"#!/bin/sh\n'''exec' \"{long_path}\" \"$0\" \"$@\"\n' '''\n")
    assert shebang_interpreter(pip) == long_path
    binary = tmp_path / "d"
    binary.write_bytes(b"\x7fELF\x00\x00")
    assert shebang_interpreter(binary) is None
    assert shebang_interpreter(tmp_path / "missing") is None


def test_find_interpreter_follows_vllm_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script(tmp_path / "vllm", "#!/opt/vllm-env/bin/python\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    exe, source = find_interpreter(None)
    assert exe == "/opt/vllm-env/bin/python"
    assert source == f"shebang of {tmp_path / 'vllm'}"
    assert find_interpreter("/x/python") == ("/x/python", "--python")


def test_find_interpreter_without_vllm_uses_this_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_interpreter(None) == (sys.executable, "this interpreter (no vllm on PATH)")


def test_read_interpreter_reads_metadata_without_importing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dist = tmp_path / "vllm-0.27.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.27.1\nRequires-Python: <3.15,>=3.10\n"
    )
    # A vllm package that would explode if imported: metadata must be enough.
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("raise SystemExit('imported!')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    info = read_interpreter(sys.executable, "--python")
    assert info.error is None
    assert info.vllm_version == "0.27.1"
    assert info.vllm_requires_python == "<3.15,>=3.10"
    assert info.python_version == ".".join(map(str, sys.version_info[:3]))


def test_own_interpreter_read_in_process_answers_as_the_subprocess(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `python -c` searches the working directory first: the in-process read must too.
    for name, version, extra in (
        ("vllm", "0.27.1", "Requires-Python: <3.15,>=3.10\n"),
        ("torch", "2.9.0", ""),
    ):
        dist = tmp_path / f"{name}-{version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{extra}"
        )
    monkeypatch.chdir(tmp_path)
    own = read_own_interpreter(sys.executable, "--python")
    assert own == read_interpreter(sys.executable, "--python")
    assert own is not None and own.error is None
    assert (own.vllm_version, own.vllm_requires_python, own.torch_version) == (
        "0.27.1",
        "<3.15,>=3.10",
        "2.9.0",
    )


def test_own_interpreter_left_to_the_subprocess_when_its_path_may_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert read_own_interpreter(str(tmp_path / "python"), "--python") is None
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # changed since start-up
    assert read_own_interpreter(sys.executable, "--python") is None
    monkeypatch.undo()
    root = str(Path(__file__).resolve().parents[2])
    code = f"import sys; sys.path.insert(1, {root!r}); "
    code += "from vllm_offload_doctor.machine.probes import read_own_interpreter as r; "
    code += "print(r(sys.executable, 'x'))"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONNOUSERSITE", "PYTHONSAFEPATH")}
    for flags in ([], ["-I"], ["-s"], ["-E"]):
        argv = [sys.executable, *flags, "-c", code]
        out = subprocess.run(argv, capture_output=True, text=True, env=env)
        assert out.stdout.startswith("InterpreterInfo(" if not flags else "None"), (flags, out)


def test_read_interpreter_missing_executable(tmp_path: Path) -> None:
    info = read_interpreter(str(tmp_path / "nope"), "shebang of vllm")
    assert info.error and "cannot run it" in info.error


def test_read_interpreter_that_fails(tmp_path: Path) -> None:
    bad = script(tmp_path / "python", "#!/bin/sh\necho 'broken venv' >&2\nexit 3\n")
    info = read_interpreter(str(bad), "--python")
    assert info.error == "exit 3: broken venv"


def test_read_interpreter_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slow = script(tmp_path / "python", "#!/bin/sh\nsleep 5\n")
    monkeypatch.setattr(probes, "INTERPRETER_TIMEOUT_S", 0.2)
    info = read_interpreter(str(slow), "--python")
    assert info.error and "did not answer" in info.error


# --- platform and memory --------------------------------------------------------------


def test_platform_detects_wsl_like_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uname = platform.uname_result(
        "Linux", "box", "5.15.153.1-microsoft-standard-WSL2", "#1 SMP", "x86_64"
    )
    monkeypatch.setattr(platform, "uname", lambda: uname)
    monkeypatch.setenv("WSL_DISTRO_NAME", "Ubuntu")
    monkeypatch.delenv("WSL_INTEROP", raising=False)
    marker = tmp_path / "proc/sys/fs/binfmt_misc/WSLInterop"
    marker.parent.mkdir(parents=True)
    marker.write_text("enabled\n")
    info = RealProbe(root=tmp_path).platform()
    assert info.vllm_sees_wsl is True
    assert info.wsl_markers == ("WSL_DISTRO_NAME", "/proc/sys/fs/binfmt_misc/WSLInterop")


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_limit(tmp_path: Path) -> None:
    write(tmp_path, "sys/fs/cgroup/memory.max", "34359738368\n")
    write(tmp_path, "sys/fs/cgroup/memory.current", "1073741824\n")
    assert read_cgroup_memory(tmp_path) == (32 * GIB, GIB)


def test_cgroup_v2_unlimited(tmp_path: Path) -> None:
    write(tmp_path, "sys/fs/cgroup/memory.max", "max\n")
    assert read_cgroup_memory(tmp_path) == (None, None)


MEMINFO = """MemTotal:       263855888 kB
MemFree:        101227348 kB
MemAvailable:   240318820 kB
Buffers:          3185620 kB
Cached:         133080028 kB
SwapCached:            0 kB
Active:          27718424 kB
Inactive:       124390932 kB
Shmem:              92872 kB
Slab:             6121488 kB
SReclaimable:     5245064 kB
SwapTotal:        8388604 kB
SwapFree:         8123456 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""


def test_meminfo_reads_what_psutil_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    psutil = pytest.importorskip("psutil")
    if not psutil.LINUX:
        pytest.skip("psutil reads /proc/meminfo only on Linux")
    write(tmp_path, "proc/meminfo", MEMINFO)
    write(tmp_path, "proc/vmstat", "pswpin 0\npswpout 0\n")
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path / "proc"))
    vm, swap = psutil.virtual_memory(), psutil.swap_memory()
    assert read_meminfo(tmp_path) == (vm.total, vm.available, swap.total, swap.free)
    assert read_meminfo(tmp_path) == (
        263855888 << 10,
        240318820 << 10,
        8388604 << 10,
        8123456 << 10,
    )


@pytest.mark.parametrize(
    "change",
    [
        ("MemAvailable:   240318820 kB\n", ""),  # kernels before 3.14: psutil estimates it
        ("MemAvailable:   240318820 kB", "MemAvailable:          0 kB"),  # psutil estimates it
        ("MemAvailable:   240318820 kB", "MemAvailable:   263855889 kB"),  # psutil uses MemFree
        ("SwapFree:", "SwapGone:"),  # psutil asks sysinfo(2)
    ],
)
def test_meminfo_leaves_psutil_what_it_corrects(tmp_path: Path, change: tuple[str, str]) -> None:
    write(tmp_path, "proc/meminfo", MEMINFO.replace(*change))
    assert read_meminfo(tmp_path) is None
    assert read_meminfo(tmp_path / "missing") is None


def test_host_memory_reads_meminfo(tmp_path: Path) -> None:
    write(tmp_path, "proc/meminfo", MEMINFO)
    write(tmp_path, "sys/fs/cgroup/memory.max", "34359738368\n")
    mem = RealProbe(root=tmp_path).host_memory()
    assert (mem.total, mem.available) == (263855888 << 10, 240318820 << 10)
    assert (mem.swap_total, mem.swap_free, mem.cgroup_limit) == (
        8388604 << 10,
        8123456 << 10,
        32 * GIB,
    )


def test_cgroup_v1_huge_means_unlimited(tmp_path: Path) -> None:
    write(tmp_path, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    write(tmp_path, "sys/fs/cgroup/memory/memory.usage_in_bytes", "5\n")
    assert read_cgroup_memory(tmp_path) == (None, 5)


def test_no_cgroup_files(tmp_path: Path) -> None:
    assert read_cgroup_memory(tmp_path) == (None, None)


def test_real_host_memory_smoke() -> None:
    mem = RealProbe().host_memory()
    assert mem.total > 0 and 0 < mem.available <= mem.total


# --- model size ------------------------------------------------------------------------

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_estimate_llama_8b() -> None:
    # Llama 3.1 8B has 8,030,261,248 parameters.
    assert estimate_bytes(LLAMA_8B, "bfloat16") == 8_030_261_248 * 2


def test_estimate_refuses_moe_and_partial_configs() -> None:
    assert estimate_bytes({**LLAMA_8B, "num_local_experts": 8}, None) is None
    assert estimate_bytes({"hidden_size": 4096}, None) is None


def model_dir(path: Path, *, index: int | None = None, shards: int = 0) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(LLAMA_8B))
    if index is not None:
        (path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": index}, "weight_map": {}})
        )
    for i in range(shards):
        (path / f"model-{i:05d}.safetensors").write_bytes(b"\0" * 1000)
    return path


def test_size_from_index(tmp_path: Path) -> None:
    size = inspect_model(str(model_dir(tmp_path / "m", index=123456, shards=2)), {}, tmp_path)
    assert (size.total_bytes, size.source, size.estimated) == (123456, "safetensors index", False)
    assert size.architectures == ("LlamaForCausalLM",)
    assert size.dtype == "bfloat16"


def test_size_from_safetensors_files(tmp_path: Path) -> None:
    size = inspect_model(str(model_dir(tmp_path / "m", shards=3)), {}, tmp_path)
    assert (size.total_bytes, size.source) == (3000, "safetensors files")


def test_size_estimated_from_config(tmp_path: Path) -> None:
    size = inspect_model(str(model_dir(tmp_path / "m")), {}, tmp_path)
    assert size.estimated and size.total_bytes == 8_030_261_248 * 2


def test_empty_dir_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    with pytest.raises(ModelSizeUnknownError):
        inspect_model(str(tmp_path / "m"), {}, tmp_path)


def test_hf_cache_lookup_uses_refs_main(tmp_path: Path) -> None:
    repo = tmp_path / "hf" / "hub" / "models--meta-llama--Llama-3.1-8B"
    model_dir(repo / "snapshots" / "aaa", index=1)
    model_dir(repo / "snapshots" / "bbb", index=2)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("aaa\n")
    env = {"HF_HOME": str(tmp_path / "hf")}
    found = locate_model("meta-llama/Llama-3.1-8B", env, tmp_path / "home")
    assert found == repo / "snapshots" / "aaa"
    assert inspect_model("meta-llama/Llama-3.1-8B", env, tmp_path).total_bytes == 1


def test_hf_cache_default_location_under_home(tmp_path: Path) -> None:
    snap = tmp_path / ".cache/huggingface/hub/models--org--name/snapshots/rev"
    model_dir(snap, index=7)
    assert locate_model("org/name", {}, tmp_path) == snap


def test_model_not_found_never_downloads(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="never downloads"):
        inspect_model("org/absent", {"HF_HOME": str(tmp_path)}, tmp_path)


def test_read_nvml_takes_the_drivers_reserve_from_the_v2_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NVML v2 adds `reserved`; CUDA's total (what vLLM budgets from) is total - reserved."""
    mod = fake_pynvml()
    Mem2 = namedtuple("Mem2", "total reserved free used")
    v1 = mod.nvmlDeviceGetMemoryInfo  # type: ignore[attr-defined]

    def memory_info(handle: int, version: int | None = None) -> Any:
        if version is None:
            return v1(handle)
        assert version == 2
        return Mem2(150_754_820_096, 644_939_776, 150_109_880_320, 0)

    mod.nvmlMemory_v2 = 2  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMemoryInfo = memory_info  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    (gpu,) = read_nvml().gpus
    assert gpu.memory_reserved == 644_939_776
    assert gpu.memory_usable == gpu.memory_total - 644_939_776  # type: ignore[operator]


def test_an_nvml_read_begun_early_is_the_real_probes_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[int] = []

    def counted() -> probes.NvmlInfo:
        reads.append(1)
        return probes.NvmlInfo(driver_version=f"read {len(reads)}")

    monkeypatch.setattr(probes, "read_nvml", counted)
    early.start_nvml()
    assert RealProbe().nvml().driver_version == "read 1"  # the early read, taken once
    assert RealProbe().nvml().driver_version == "read 2"  # then read again
    assert len(reads) == 2

    def broken() -> probes.NvmlInfo:
        raise RuntimeError("pynvml exploded")

    monkeypatch.setattr(probes, "read_nvml", broken)
    early.start_nvml()
    with pytest.raises(RuntimeError, match="pynvml exploded"):  # raised where it is read
        RealProbe().nvml()


def test_read_nvml_without_the_v2_record_has_no_reserve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    (gpu,) = read_nvml().gpus
    assert gpu.memory_reserved is None
    assert gpu.memory_usable == gpu.memory_total == 141 * GIB


def test_the_real_probe_marks_its_own_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert RealProbe().interpreter(None).own is True
    script(tmp_path / "vllm", f"#!{sys.executable}\n")
    assert RealProbe().interpreter(None).own is False  # found through `vllm`: vLLM's own
    assert RealProbe().interpreter(sys.executable).own is False
