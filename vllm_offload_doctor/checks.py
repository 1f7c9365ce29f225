"""The preconditions for CPU weight offloading, one `check_<thing>` per precondition.

Each check reads the machine only through the `Probe` in its `Context`, never prints and
returns `CheckResult`s; `run_checks` runs them all and turns a crashing probe into a SKIP.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from vllm_offload_doctor import __version__
from vllm_offload_doctor.errors import ProbeError
from vllm_offload_doctor.modelsize import ModelSize
from vllm_offload_doctor.pcie import PRACTICAL_FRACTION, pcie_bandwidth_gbs, step_cost_ms
from vllm_offload_doctor.probes import (
    GpuInfo,
    HostMemory,
    InterpreterInfo,
    NvmlInfo,
    PlatformInfo,
    Probe,
)
from vllm_offload_doctor.redact import is_secret_name, redact

SCHEMA_VERSION = 1
GIB = 1 << 30
HOST_FACTOR = 1.9  # host RAM per offloaded GiB per GPU (vLLM issue #56410)
CURRENT_REQUIRES_PYTHON = ">=3.11,<3.15"  # vLLM 0.32 and 0.33

ISSUE_MRV2 = "https://github.com/vllm-project/vllm/issues/51396"
PR_MRV2_FIX = "https://github.com/vllm-project/vllm/pull/51413"
ISSUE_HOST_RAM = "https://github.com/vllm-project/vllm/issues/56410"
ISSUE_FITS_ANYWAY = "https://github.com/vllm-project/vllm/issues/57771"
DOCS_MEMORY = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"
DOCS_GPU = "https://docs.vllm.ai/en/latest/getting_started/installation/gpu.html"
DOCS_WSL = "https://learn.microsoft.com/windows/wsl/install"


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


_RANK = {Status.OK: 0, Status.SKIP: 0, Status.WARN: 1, Status.FAIL: 2}


def worst(*statuses: Status) -> Status:
    return max(statuses, key=lambda s: _RANK[s], default=Status.OK)


@dataclass(frozen=True, slots=True)
class CheckResult:
    id: str
    title: str
    status: Status
    message: str
    details: tuple[str, ...] = ()
    remedy: str = ""
    links: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Options:
    offload_gb: float = 0.0
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    model: str | None = None
    python: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000


@dataclass(frozen=True, slots=True)
class Report:
    checks: tuple[CheckResult, ...]
    facts: dict[str, Any] = field(default_factory=dict)
    tool_version: str = __version__

    def summary(self) -> dict[str, int]:
        return {s.value: sum(1 for c in self.checks if c.status is s) for s in Status}

    def exit_code(self, *, strict: bool = False) -> int:
        """0: ok or warnings only; 1: a failure (or a warning with strict); 2: nothing checked."""
        counts = self.summary()
        if counts["fail"] or (strict and counts["warn"]):
            return 1
        if not counts["ok"] and not counts["warn"]:
            return 2
        return 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool_version": self.tool_version,
            "checks": [asdict(c) for c in self.checks],
            "summary": self.summary(),
            "facts": self.facts,
        }


class Context:
    """Probe answers, each read once and shared by the checks that need them."""

    def __init__(self, probe: Probe, options: Options) -> None:
        self.probe = probe
        self.options = options

    @cached_property
    def platform(self) -> PlatformInfo:
        return self.probe.platform()

    @cached_property
    def interpreter(self) -> InterpreterInfo:
        return self.probe.interpreter(self.options.python)

    @cached_property
    def nvml(self) -> NvmlInfo:
        return self.probe.nvml()

    @cached_property
    def host_memory(self) -> HostMemory:
        return self.probe.host_memory()

    @cached_property
    def environ(self) -> Mapping[str, str]:
        return self.probe.environ()

    @cached_property
    def vllm_version(self) -> Version | None:
        """The installed vLLM's release number (dev/local suffixes dropped), if known."""
        try:
            raw = self.interpreter.vllm_version
            return Version(Version(raw).base_version) if raw else None
        except (InvalidVersion, ProbeError, OSError):
            return None

    def prefetch(self) -> None:
        """Start the slow probes together: the interpreter subprocess and NVML overlap.

        A probe that raises here is simply read again by its check, which reports it.
        """
        with ThreadPoolExecutor(max_workers=3) as pool:
            for name in ("interpreter", "nvml", "host_memory"):
                pool.submit(getattr, self, name)

    def used_gpus(self) -> list[GpuInfo]:
        """The GPUs vLLM will use: the first N visible, mapped through CUDA_VISIBLE_DEVICES."""
        gpus = self.nvml.gpus
        order = visible_indices(self.environ.get("CUDA_VISIBLE_DEVICES"), len(gpus))
        visible = [gpus[i] for i in order] if order is not None else list(gpus)
        return visible[: self.options.tensor_parallel_size]

    def facts(self) -> dict[str, Any]:
        """Whatever the checks already read (nothing is probed again here)."""
        cache = self.__dict__
        out: dict[str, Any] = {"options": asdict(self.options)}
        for name in ("platform", "interpreter", "nvml", "host_memory"):
            if name in cache:
                out[name] = asdict(cache[name])
        return out


def visible_indices(value: str | None, count: int) -> list[int] | None:
    """NVML indices CUDA will expose, in order; None when entries are UUIDs (order unknown).

    CUDA stops at the first invalid entry, so "0,7,1" on a 2-GPU machine exposes only GPU 0.
    """
    if value is None:
        return list(range(count))
    order: list[int] = []
    for token in value.split(","):
        token = token.strip()
        if not token:
            break
        if not token.lstrip("-").isdigit():
            return None
        index = int(token)
        if index < 0 or index >= count or index in order:
            break
        order.append(index)
    return order


def gib(value: float | None) -> str:
    return "unknown" if value is None else f"{value / GIB:.1f} GiB"


# --- platform ------------------------------------------------------------------------


def check_os(ctx: Context) -> CheckResult:
    p = ctx.platform
    title = "Operating system"
    if p.system == "Linux":
        return CheckResult("os", title, Status.OK, f"Linux {p.release} ({p.machine})")
    if p.system == "Windows":
        return CheckResult(
            "os",
            title,
            Status.FAIL,
            "native Windows: vLLM does not run on Windows",
            remedy="Run vLLM inside WSL2 (Ubuntu) with the NVIDIA driver for WSL.",
            links=(DOCS_WSL,),
        )
    if p.system == "Darwin":
        return CheckResult(
            "os",
            title,
            Status.FAIL,
            "macOS: no CUDA, so no GPU weight offloading",
            remedy="Use a Linux machine with an NVIDIA GPU.",
            links=(DOCS_GPU,),
        )
    return CheckResult(
        "os",
        title,
        Status.FAIL,
        f"{p.system or 'unknown system'}: vLLM needs Linux",
        remedy="Use Linux with an NVIDIA GPU.",
    )


def kernel_tuple(release: str) -> tuple[int, ...]:
    nums: list[int] = []
    for part in release.split("-")[0].split("."):
        if not part.isdigit():
            break
        nums.append(int(part))
    return tuple(nums)


def check_wsl(ctx: Context) -> CheckResult:
    p = ctx.platform
    title = "WSL"
    if p.system != "Linux":
        return CheckResult("wsl", title, Status.SKIP, "not Linux")
    if not p.vllm_sees_wsl:
        if p.wsl_markers:
            return CheckResult(
                "wsl",
                title,
                Status.WARN,
                "WSL markers found but the kernel name lacks 'microsoft': vLLM will treat "
                "this as native Linux and may try pinned memory where WSL limits it",
                details=(f"markers: {', '.join(p.wsl_markers)}", f"kernel: {p.release}"),
            )
        return CheckResult(
            "wsl", title, Status.OK, "native Linux, not WSL: pinned memory available"
        )

    kernel = kernel_tuple(p.release)
    details = [f"kernel: {p.release}", *(f"marker: {m}" for m in p.wsl_markers)]
    if "wsl2" not in p.release.lower() and kernel < (4, 19):
        return CheckResult(
            "wsl",
            title,
            Status.FAIL,
            "WSL1: no GPU access",
            tuple(details),
            remedy="Convert the distribution to WSL2: `wsl --set-version <distro> 2`.",
            links=(DOCS_WSL,),
        )
    version = ctx.vllm_version
    enabled = ctx.environ.get("VLLM_WSL2_ENABLE_PIN_MEMORY") == "1"
    links = (DOCS_MEMORY,)
    if version is not None and version < Version("0.17"):
        return CheckResult(
            "wsl",
            title,
            Status.FAIL,
            f"WSL2 with vLLM {version}: pinned memory is off under WSL, and before 0.17 CPU "
            "offload then stops with 'V1 CPU offloading requires uva (pin memory) support'",
            tuple(details),
            remedy="Upgrade vLLM to 0.28 or later and set VLLM_WSL2_ENABLE_PIN_MEMORY=1.",
            links=links,
        )
    if version is not None and version < Version("0.24"):
        return CheckResult(
            "wsl",
            title,
            Status.WARN,
            f"WSL2 with vLLM {version}: pinned memory is always off under WSL, so offloaded "
            "weights are copied to the GPU on every forward pass (slow, and no log line says so)",
            tuple(details),
            remedy="Upgrade vLLM to 0.28 or later and set VLLM_WSL2_ENABLE_PIN_MEMORY=1.",
            links=links,
        )
    if kernel < (4, 19, 121):
        return CheckResult(
            "wsl",
            title,
            Status.WARN,
            f"WSL2 kernel {p.release} is below 4.19.121: vLLM turns pinned memory off, so "
            "offloaded weights take the slow copy path on every forward pass",
            tuple(details),
            remedy="Run `wsl --update` in Windows, then `wsl --shutdown`.",
            links=links,
        )
    if not enabled:
        return CheckResult(
            "wsl",
            title,
            Status.WARN,
            "WSL2: pinned memory is off by default (vLLM >= 0.24) unless "
            "VLLM_WSL2_ENABLE_PIN_MEMORY=1, so offloaded weights are copied on every forward "
            "pass with no log line",
            tuple(details),
            remedy="export VLLM_WSL2_ENABLE_PIN_MEMORY=1",
            links=links,
        )
    return _wsl_pinned_cap(ctx, tuple(details), links)


def _wsl_pinned_cap(ctx: Context, details: tuple[str, ...], links: tuple[str, ...]) -> CheckResult:
    """Windows (WDDM) caps pinned memory system-wide at about half of *physical* RAM.

    WSL only sees its VM's memory, by default itself half of physical RAM, so the cap is at
    least half of what WSL sees and, with default settings, about all of it: above half is
    a risk to name, not a certain failure.
    """
    opts = ctx.options
    total = ctx.host_memory.total
    pinned = opts.offload_gb * opts.tensor_parallel_size * GIB
    details = (
        *details,
        f"Windows caps pinned memory near half of physical RAM; WSL sees {gib(total)}, "
        "and by default WSL gets half of physical RAM",
    )
    if pinned > total / 2:
        return CheckResult(
            "wsl",
            "WSL",
            Status.WARN,
            f"WSL2: {gib(pinned)} to pin may exceed Windows' pinned-memory cap "
            "(about half of physical RAM)",
            details,
            remedy="If loading fails or stalls, offload less, or add RAM to the Windows host.",
            links=links,
        )
    return CheckResult(
        "wsl",
        "WSL",
        Status.OK,
        "WSL2 with VLLM_WSL2_ENABLE_PIN_MEMORY=1: pinned memory on "
        "(Windows caps it near half of physical RAM)",
        details,
        links=links,
    )


# --- Python and vLLM -----------------------------------------------------------------


def check_python(ctx: Context) -> CheckResult:
    it = ctx.interpreter
    title = "Python"
    details = (f"interpreter: {it.executable}", f"chosen by: {it.source}")
    if it.error or not it.python_version:
        return CheckResult(
            "python",
            title,
            Status.FAIL,
            f"cannot query {it.executable}: {it.error}",
            details,
            remedy="Pass the interpreter that runs vLLM with --python PATH.",
        )
    spec_text = it.vllm_requires_python
    if it.vllm_version and not spec_text:
        return CheckResult(
            "python",
            title,
            Status.OK,
            f"Python {it.python_version} (vLLM {it.vllm_version} declares no Requires-Python)",
            details,
        )
    who = f"vLLM {it.vllm_version}" if it.vllm_version else "current vLLM (0.32/0.33)"
    spec_text = spec_text or CURRENT_REQUIRES_PYTHON
    try:
        fits = Version(it.python_version) in SpecifierSet(spec_text)
    except (InvalidSpecifier, InvalidVersion):
        return CheckResult(
            "python",
            title,
            Status.WARN,
            f"Python {it.python_version}; cannot read {who}'s Requires-Python {spec_text!r}",
            details,
        )
    if fits:
        return CheckResult(
            "python",
            title,
            Status.OK,
            f"Python {it.python_version} meets {who}'s Requires-Python {spec_text}",
            details,
        )
    status = Status.FAIL if it.vllm_version else Status.WARN
    return CheckResult(
        "python",
        title,
        status,
        f"Python {it.python_version} is outside {who}'s Requires-Python {spec_text}",
        details,
        remedy="Create a virtual environment with a supported Python (3.11-3.14 for vLLM 0.32+).",
    )


def check_vllm(ctx: Context) -> CheckResult:
    it = ctx.interpreter
    title = "vLLM"
    if it.error:
        return CheckResult("vllm", title, Status.SKIP, "the interpreter could not be queried")
    if not it.vllm_version:
        return CheckResult(
            "vllm",
            title,
            Status.FAIL,
            f"vLLM is not installed for {it.executable}",
            remedy="pip install vllm (or pass the interpreter that has it with --python).",
        )
    details = (f"vllm {it.vllm_version}", f"torch {it.torch_version or 'not installed'}")
    version = ctx.vllm_version
    if version is None:
        return CheckResult(
            "vllm",
            title,
            Status.WARN,
            f"vLLM {it.vllm_version}: version not understood",
            details,
        )
    env_v2 = ctx.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    name = f"vLLM {it.vllm_version} (torch {it.torch_version or 'missing'})"
    links = (ISSUE_MRV2, PR_MRV2_FIX)
    ignored = f"{name}: --cpu-offload-gb is silently ignored by Model Runner V2 (0.12.0-0.27.1)"
    fix = "Upgrade to vLLM 0.28.0 or later, or export VLLM_USE_V2_MODEL_RUNNER=0."
    no_log = "before 0.17 nothing in the log confirms offload"
    if version >= Version("0.28"):
        return CheckResult(
            "vllm",
            title,
            Status.OK,
            f"{name}: offload works on both model runners (fixed in 0.28.0)",
            details,
            links=(PR_MRV2_FIX,),
        )
    if version >= Version("0.12") and env_v2 == "1":
        return CheckResult(
            "vllm",
            title,
            Status.FAIL,
            f"{ignored}, and VLLM_USE_V2_MODEL_RUNNER=1 selects it",
            details,
            remedy=fix,
            links=links,
        )
    if version >= Version("0.25"):
        if env_v2 == "0":
            return CheckResult(
                "vllm",
                title,
                Status.OK,
                f"{name}: VLLM_USE_V2_MODEL_RUNNER=0 keeps the V1 runner, where offload works",
                details,
                links=links,
            )
        return CheckResult(
            "vllm",
            title,
            Status.FAIL,
            f"{ignored}; V2 is the default for dense models from 0.25",
            details,
            remedy=fix,
            links=links,
        )
    if version >= Version("0.22") and env_v2 != "0":
        return CheckResult(
            "vllm",
            title,
            Status.WARN,
            f"{ignored}; V2 is already the default for some architectures (Llama, Mistral, "
            "Qwen3 and more)",
            details,
            remedy=fix,
            links=links,
        )
    if version < Version("0.17"):
        return CheckResult(
            "vllm",
            title,
            Status.WARN,
            f"{name}: offload works, but {no_log}",
            details,
            remedy="Use `offload-doctor compare` to see whether offload took effect, or upgrade.",
            links=links if version >= Version("0.12") else (),
        )
    return CheckResult(
        "vllm",
        title,
        Status.OK,
        f"{name}: offload works on the default V1 runner",
        details,
        links=links,
    )


# --- GPUs ----------------------------------------------------------------------------


def check_nvml(ctx: Context) -> CheckResult:
    info = ctx.nvml
    title = "NVIDIA driver (NVML)"
    if info.error:
        remedy = (
            "pip install nvidia-ml-py"
            if "pynvml" in info.error
            else "Install the NVIDIA driver until `nvidia-smi` works; in a container, start it "
            "with `--gpus all` (NVIDIA Container Toolkit)."
        )
        return CheckResult(
            "nvml",
            title,
            Status.FAIL,
            f"no usable NVIDIA driver: {info.error}",
            remedy=remedy,
            links=(DOCS_GPU,),
        )
    details = [
        f"driver {info.driver_version}",
        f"CUDA driver API {info.cuda_driver_version or 'unknown'}",
    ]
    driver = f"driver {info.driver_version}, CUDA {info.cuda_driver_version or 'unknown'}"
    if not info.gpus:
        return CheckResult(
            "nvml",
            title,
            Status.FAIL,
            f"{driver} loaded, but NVML finds no NVIDIA GPU",
            tuple(details),
            remedy="Check that the GPU is passed through (VM/container).",
        )
    cvd = ctx.environ.get("CUDA_VISIBLE_DEVICES")
    order = visible_indices(cvd, len(info.gpus))
    visible = len(order) if order is not None else len((cvd or "").split(","))
    if cvd is not None:
        details.append(f"CUDA_VISIBLE_DEVICES={cvd}: {visible} of {len(info.gpus)} GPUs visible")
    tp = ctx.options.tensor_parallel_size
    if visible < max(tp, 1):
        return CheckResult(
            "nvml",
            title,
            Status.FAIL,
            f"{driver}; --tensor-parallel-size {tp} needs {tp} GPU(s), {visible} visible",
            tuple(details),
            remedy="Lower --tensor-parallel-size or fix CUDA_VISIBLE_DEVICES.",
        )
    used = f", using {tp}" if tp > 1 or visible > 1 else ""
    return CheckResult(
        "nvml",
        title,
        Status.OK,
        f"{driver}, {len(info.gpus)} GPU(s){used}",
        tuple(details),
    )


def check_gpus(ctx: Context) -> list[CheckResult]:
    """One result per GPU NVML reports; nothing when NVML itself failed (`nvml` says why)."""
    if ctx.nvml.error:
        return []
    used = {g.index for g in ctx.used_gpus()}
    return [check_gpu(ctx, gpu, gpu.index in used) for gpu in ctx.nvml.gpus]


def check_gpu(ctx: Context, gpu: GpuInfo, used: bool) -> CheckResult:
    opts = ctx.options
    problems: list[tuple[Status, str, str]] = []  # status, problem, remedy
    cc = gpu.compute_capability
    cc_text = f"{cc[0]}.{cc[1]}" if cc else "unknown"
    details = [f"{gpu.name}, compute capability {cc_text}"]
    if cc is None:
        problems.append((Status.WARN, "compute capability unknown", ""))
    elif cc < (7, 5):
        problems.append(
            (
                Status.FAIL,
                f"compute capability {cc_text} is below 7.5: current vLLM ships no kernels for it",
                "Use a Turing (7.5) or newer GPU.",
            )
        )
    elif cc < (8, 0):
        problems.append(
            (
                Status.WARN,
                f"compute capability {cc_text}: no bfloat16 and no FlashAttention 2",
                "Serve with --dtype half.",
            )
        )
    total, free = gpu.memory_total, gpu.memory_free
    if total is not None and free is not None:
        details.append(f"memory: {gib(total)} total, {gib(free)} free, {gib(total - free)} used")
    details.extend(
        f"process pid {p.pid} ({p.name or 'unknown'}): "
        f"{'unknown' if p.used_bytes is None else f'{p.used_bytes / 2**20:.0f} MiB'}"
        for p in gpu.processes
    )
    if used and total is not None and free is not None:
        need = total * opts.gpu_memory_utilization
        if free < need:
            holders = ", ".join(f"pid {p.pid} ({p.name or '?'})" for p in gpu.processes)
            problems.append(
                (
                    Status.FAIL,
                    f"only {gib(free)} free, but --gpu-memory-utilization "
                    f"{opts.gpu_memory_utilization:g} asks for {gib(need)} at startup"
                    + (f" (held by {holders})" if holders else ""),
                    f"Stop the other processes or lower --gpu-memory-utilization to "
                    f"{math.floor(free / total * 100) / 100:g} or less.",
                )
            )
    if gpu.mig_enabled:
        problems.append(
            (
                Status.WARN,
                "MIG mode is on: vLLM gets one MIG slice, not the memory shown here",
                "Check the MIG instance size (`nvidia-smi -L`) or disable MIG.",
            )
        )
    problems.extend(_pcie(gpu, opts, details))
    if not used:
        details.append("not used with this --tensor-parallel-size / CUDA_VISIBLE_DEVICES")
    summary = f"{gpu.name}, compute {cc_text}, {gib(total)} ({gib(free)} free)"
    status = worst(*(s for s, _, _ in problems))
    message = f"{gpu.name}: " + "; ".join(p for _, p, _ in problems) if problems else summary
    return CheckResult(
        f"gpu[{gpu.index}]",
        f"GPU {gpu.index}",
        status,
        message,
        tuple(details),
        remedy=" ".join(r for _, _, r in problems if r),
        links=(DOCS_GPU,) if status is Status.FAIL and cc and cc < (7, 5) else (),
    )


def _pcie(gpu: GpuInfo, opts: Options, details: list[str]) -> list[tuple[Status, str, str]]:
    """The link offloaded weights cross on every forward pass."""
    now = link_bandwidth(gpu.pcie_gen, gpu.pcie_width)
    best = link_bandwidth(gpu.pcie_gen_max, gpu.pcie_width_max)
    if now is None or best is None:
        details.append("PCIe link: unknown")
        return []
    details.append(
        f"PCIe link: Gen{gpu.pcie_gen} x{gpu.pcie_width} now ({now:.1f} GB/s), "
        f"max Gen{gpu.pcie_gen_max} x{gpu.pcie_width_max} ({best:.1f} GB/s, "
        f"about {best * PRACTICAL_FRACTION:.0f} GB/s in practice)"
    )
    problems: list[tuple[Status, str, str]] = []
    if (gpu.pcie_width or 0) < (gpu.pcie_width_max or 0):
        problems.append(
            (
                Status.WARN,
                f"PCIe link runs at x{gpu.pcie_width} of x{gpu.pcie_width_max}",
                "Reseat the card, or check the slot, riser and BIOS PCIe settings.",
            )
        )
    elif (gpu.pcie_gen or 0) < (gpu.pcie_gen_max or 0):
        details.append(
            "the link generation is below its maximum: idle GPUs drop it to save power and "
            "raise it under load (check with `nvidia-smi -q -d PCIE` during a run)"
        )
    if opts.offload_gb > 0:
        details.append(
            f"--offload-gb {opts.offload_gb:g}: each forward pass reads that much over the link, "
            f"at least {step_ms(opts.offload_gb, best):.0f} ms per step"
        )
        if best < 15:
            problems.append(
                (
                    Status.WARN,
                    f"slow link for offload: Gen{gpu.pcie_gen_max} x{gpu.pcie_width_max} "
                    f"is {best:.1f} GB/s at best",
                    "Use a Gen4/Gen5 x16 slot for offloading.",
                )
            )
    return problems


# --- host ----------------------------------------------------------------------------


def check_host_memory(ctx: Context) -> CheckResult:
    mem, opts = ctx.host_memory, ctx.options
    title = "Host memory"
    usable = min(mem.total, mem.cgroup_limit or mem.total)
    available = mem.available
    if mem.cgroup_limit is not None:
        available = min(available, mem.cgroup_limit - (mem.cgroup_usage or 0))
    details = [
        f"RAM: {gib(mem.total)} total, {gib(mem.available)} available",
        "cgroup limit: "
        + (
            f"{gib(mem.cgroup_limit)} ({gib(mem.cgroup_usage)} in use)"
            if mem.cgroup_limit is not None
            else "none"
        ),
        f"swap: {gib(mem.swap_total)} total, {gib(mem.swap_free)} free (pinned memory cannot swap)",
        f"locked-memory limit (RLIMIT_MEMLOCK): soft {_limit(mem.memlock_soft)}, "
        f"hard {_limit(mem.memlock_hard)}",
    ]
    cgroup = f", cgroup limit {gib(mem.cgroup_limit)}" if mem.cgroup_limit is not None else ""
    base = f"{gib(mem.total)} RAM, {gib(available)} available{cgroup}"
    if opts.offload_gb <= 0:
        details.append("pass --offload-gb X to budget host memory for offloading")
        return CheckResult("host_memory", title, Status.OK, base, tuple(details))
    n = opts.tensor_parallel_size
    required = HOST_FACTOR * opts.offload_gb * n * GIB
    need = (
        f"~{required / GIB:.1f} GiB needed ({HOST_FACTOR} × {opts.offload_gb:g} GiB × {n} GPU"
        f"{'s' if n > 1 else ''})"
    )
    links = (ISSUE_HOST_RAM, DOCS_MEMORY)
    if required > usable:
        return CheckResult(
            "host_memory",
            title,
            Status.FAIL,
            f"{need}, but only {gib(usable)} usable{cgroup}",
            tuple(details),
            remedy="Offload less per GPU, add RAM, or raise the memory limit.",
            links=links,
        )
    if required > available:
        return CheckResult(
            "host_memory",
            title,
            Status.WARN,
            f"{need}, only {gib(available)} available now",
            tuple(details),
            remedy="Stop other memory users before starting vLLM.",
            links=links,
        )
    pinned = opts.offload_gb * n * GIB
    if mem.memlock_soft is not None and mem.memlock_soft < pinned:
        # Not a warning: torch pins through cudaHostAlloc, which the driver does not count
        # against RLIMIT_MEMLOCK; a warning here would fire on nearly every default machine.
        details.append(
            f"RLIMIT_MEMLOCK ({_limit(mem.memlock_soft)}) is below the {gib(pinned)} to pin; "
            "CUDA pinned allocations are usually not bound by it. If pinning fails, raise it "
            "(`ulimit -l unlimited`, `docker run --ulimit memlock=-1`)"
        )
    return CheckResult(
        "host_memory",
        title,
        Status.OK,
        f"{need}, {gib(available)} available",
        tuple(details),
        links=links,
    )


def _limit(value: int | None) -> str:
    if value is None:
        return "unlimited"
    return f"{value // 1024} KiB" if value < GIB else gib(value)


def check_fit(ctx: Context) -> CheckResult:
    opts = ctx.options
    title = "Model fit"
    if not opts.model:
        return CheckResult("fit", title, Status.SKIP, "no --model given")
    if ctx.nvml.error or not ctx.nvml.gpus:
        return CheckResult("fit", title, Status.SKIP, "no GPU information")
    try:
        size = ctx.probe.model_size(opts.model)
    except ProbeError as exc:
        return CheckResult("fit", title, Status.SKIP, str(exc))
    totals = [g.memory_total for g in ctx.used_gpus() if g.memory_total]
    if not totals:
        return CheckResult("fit", title, Status.SKIP, "GPU memory size unknown")
    n = opts.tensor_parallel_size
    budget = min(totals) * opts.gpu_memory_utilization
    per_gpu = size.total_bytes / n
    headroom = max(GIB, 0.05 * budget)
    offload = opts.offload_gb * GIB
    est = " (estimated from config.json)" if size.estimated else ""
    details = (
        f"weights: {gib(size.total_bytes)}{est} from {size.source}"
        + (f", dtype {size.dtype}" if size.dtype else ""),
        f"per GPU: {gib(per_gpu)} (tensor parallel {n})",
        f"GPU budget: {gib(budget)} ({opts.gpu_memory_utilization:g} x smallest used GPU)",
        f"room kept for activations and KV cache: {gib(headroom)} (1 GiB or 5 %)",
        *(["quantized checkpoint: sizes are what is on disk"] if size.quantized else []),
        "embeddings and lm_head are never offloaded",
    )
    weights = f"{gib(per_gpu)} of weights per GPU{est}"
    to_offload = per_gpu + headroom - budget
    links = (DOCS_MEMORY,)
    if to_offload <= 0:
        if offload > 0:
            return CheckResult(
                "fit",
                title,
                Status.WARN,
                f"{weights} fit in {gib(budget)} without offload: --offload-gb "
                f"{opts.offload_gb:g} only costs speed",
                details,
                remedy="Drop --cpu-offload-gb; the freed GPU memory goes to the KV cache.",
                links=(ISSUE_FITS_ANYWAY, *links),
            )
        return CheckResult(
            "fit",
            title,
            Status.OK,
            f"{weights} fit in {gib(budget)} without offload, {gib(budget - per_gpu)} left for "
            "KV cache",
            details,
            links=links,
        )
    minimum = ceil_gib(to_offload)
    if to_offload >= per_gpu:
        return CheckResult(
            "fit",
            title,
            Status.FAIL,
            f"{weights}: a {gib(budget)} budget leaves no room even with everything offloaded",
            details,
            remedy="Raise --gpu-memory-utilization or use more GPUs.",
            links=links,
        )
    if offload >= to_offload:
        if offload > per_gpu:
            return CheckResult(
                "fit",
                title,
                Status.WARN,
                f"--offload-gb {opts.offload_gb:g} is more than the {weights}; "
                f"{minimum} GiB per GPU is enough",
                details,
                remedy=f"Use --cpu-offload-gb {minimum}: every offloaded GiB costs speed.",
                links=links,
            )
        extra = (
            (f"offloading more than {minimum} GiB per GPU only costs speed",)
            if offload > minimum * GIB
            else ()
        )
        return CheckResult(
            "fit",
            title,
            Status.OK,
            f"{weights} fit only with offload: at least {minimum} GiB per GPU, "
            f"{opts.offload_gb:g} given",
            (*details, *extra),
            links=links,
        )
    given = f"even with {opts.offload_gb:g} GiB offloaded" if offload > 0 else "without offload"
    return CheckResult(
        "fit",
        title,
        Status.FAIL,
        f"{weights} do not fit in {gib(budget)} {given}: offload at least {minimum} GiB per GPU",
        details,
        remedy=f"vllm serve ... --cpu-offload-gb {minimum} (or more GPUs with -tp).",
        links=links,
    )


def check_port(ctx: Context) -> CheckResult:
    opts = ctx.options
    try:
        state = ctx.probe.port(opts.host, opts.port)
    except OSError as exc:
        return CheckResult(
            "port",
            "Port",
            Status.SKIP,
            f"cannot test {opts.host}:{opts.port}: {exc.strerror or exc}",
        )
    if state.free:
        return CheckResult("port", "Port", Status.OK, state.describe())
    hint = " (a vLLM server may already be running)" if "vllm" in (state.process or "") else ""
    return CheckResult(
        "port",
        "Port",
        Status.FAIL,
        state.describe() + hint,
        remedy="Stop that process, or give vllm serve (and check) another --port.",
    )


ENV_VARS = (
    "VLLM_USE_V2_MODEL_RUNNER",
    "VLLM_WEIGHT_OFFLOADING_DISABLE_UVA",
    "VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY",
    "VLLM_WSL2_ENABLE_PIN_MEMORY",
    "CUDA_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF",
)


def env_effect(name: str, value: str, wsl: bool) -> tuple[Status, str]:
    """What one environment variable does to offloading."""
    flag = value.strip()
    if name in ENV_VARS[:4] and flag not in ("0", "1"):
        return Status.FAIL, f"must be 0 or 1; vLLM fails to parse {value!r}"
    on = flag == "1"
    if name == "VLLM_USE_V2_MODEL_RUNNER":
        return Status.OK, (
            "forces Model Runner V2 (ignores offload before 0.28.0)"
            if on
            else "forces Model Runner V1 (the workaround for 0.12-0.27.1)"
        )
    if name == "VLLM_WEIGHT_OFFLOADING_DISABLE_UVA":
        if on:
            return Status.WARN, "UVA off: offloaded weights are copied to the GPU every pass (slow)"
        return Status.OK, "UVA allowed (default)"
    if name == "VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY":
        if on:
            return (
                Status.WARN,
                "pinned memory off: offloaded weights sit in pageable memory (slower)",
            )
        return Status.OK, "pinned memory allowed (default)"
    if name == "VLLM_WSL2_ENABLE_PIN_MEMORY":
        effect = (
            "pinned memory on under WSL2 (vLLM >= 0.24)" if on else "pinned memory off under WSL2"
        )
        return Status.OK, effect if wsl else f"{effect}; no effect outside WSL"
    if name == "CUDA_VISIBLE_DEVICES":
        if flag in ("", "-1"):
            return Status.FAIL, "hides every GPU"
        return Status.OK, "vLLM sees only these GPUs, in this order"
    return Status.OK, "CUDA caching allocator settings"


def check_env(ctx: Context) -> CheckResult:
    env = ctx.environ
    wsl = ctx.platform.vllm_sees_wsl
    results = [
        (name, env[name], *env_effect(name, env[name], wsl)) for name in ENV_VARS if name in env
    ]
    details = [f"{n}={_shown(n, v)}: {effect}" for n, v, _, effect in results]
    others = sorted(k for k in env if k.startswith("VLLM_") and k not in ENV_VARS)
    details.extend(f"{k}={_shown(k, env[k])}" for k in others)
    status = worst(*(s for _, _, s, _ in results))
    flagged = [f"{n}: {effect}" for n, _, s, effect in results if s is not Status.OK]
    if flagged:
        message = "; ".join(flagged)
    elif results:
        message = "set: " + ", ".join(f"{n}={_shown(n, v)}" for n, v, _, _ in results)
    else:
        message = "none of the variables that change offloading is set"
    return CheckResult(
        "env",
        "Environment",
        status,
        message,
        tuple(details),
        remedy="Unset or correct the variables named above." if flagged else "",
    )


def _shown(name: str, value: str) -> str:
    return "***" if is_secret_name(name) else redact(value)


CheckFn = Callable[[Context], "CheckResult | list[CheckResult]"]

CHECKS: tuple[tuple[str, str, CheckFn], ...] = (
    ("os", "Operating system", check_os),
    ("wsl", "WSL", check_wsl),
    ("python", "Python", check_python),
    ("vllm", "vLLM", check_vllm),
    ("nvml", "NVIDIA driver (NVML)", check_nvml),
    ("gpu", "GPUs", check_gpus),
    ("host_memory", "Host memory", check_host_memory),
    ("fit", "Model fit", check_fit),
    ("port", "Port", check_port),
    ("env", "Environment", check_env),
)

__all__ = ["CHECKS", "CheckResult", "Context", "ModelSize", "Options", "Report", "Status"]


def run_checks(probe: Probe, options: Options) -> Report:
    """Run every check; a probe that crashes turns its check into a SKIP with the reason."""
    ctx = Context(probe, options)
    ctx.prefetch()
    results: list[CheckResult] = []
    for check_id, title, fn in CHECKS:
        try:
            out = fn(ctx)
        except Exception as exc:
            reason = str(exc) or type(exc).__name__
            out = CheckResult(check_id, title, Status.SKIP, f"could not check: {reason}")
        results.extend(out if isinstance(out, list) else [out])
    return Report(checks=tuple(results), facts=ctx.facts())


def link_bandwidth(gen: int | None, width: int | None) -> float | None:
    if gen is None or width is None:
        return None
    return pcie_bandwidth_gbs(gen, width)


def ceil_gib(value: float) -> int:
    return max(1, math.ceil(value / GIB))


def step_ms(offload_gb: float, bandwidth: float) -> float:
    return step_cost_ms(offload_gb, bandwidth * PRACTICAL_FRACTION)
