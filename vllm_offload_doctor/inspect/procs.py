"""Finding vLLM server trees and reading their processes, behind `ProcSource` so tests fake it.

The real source reads psutil and /proc only (never signals); NVML gives per-process GPU memory
and the link; the vLLM version comes from the server's interpreter's package metadata.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from vllm_offload_doctor.inspect.model import HttpFacts, ProcFacts, ServerFacts
from vllm_offload_doctor.machine.procstatus import read_status

RUNNER_VARS = ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_API_KEY")
_ROLE = re.compile(r"(EngineCore(?:_DP\d+)?|Worker_TP\d+|Worker(?:_\w+)?)")


class Unreadable(Exception):
    """A process's /proc entry could not be read (another user, gone, no /proc)."""


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    pcie_gen: int | None = None
    pcie_width: int | None = None
    processes: Mapping[int, int | None] = field(default_factory=dict)  # pid -> bytes


class ProcSource(Protocol):
    def system(self) -> str: ...
    def pids(self) -> Sequence[int]: ...
    def cmdline(self, pid: int) -> list[str]: ...  # raises Unreadable
    def name(self, pid: int) -> str: ...
    def children(self, pid: int) -> list[int]: ...  # all descendants
    def environ(self, pid: int) -> Mapping[str, str]: ...  # raises Unreadable
    def status(self, pid: int) -> Mapping[str, int]: ...  # kB fields of /proc/PID/status
    def exe(self, pid: int) -> str | None: ...
    def vllm_version(self, exe: str, pythonpath: str | None) -> str | None: ...
    def gpus(self) -> list[Gpu]: ...
    def host_available(self) -> int | None: ...


class RealSource:
    def system(self) -> str:
        return platform.system()

    def pids(self) -> Sequence[int]:
        import psutil

        return psutil.pids()

    def cmdline(self, pid: int) -> list[str]:
        import psutil

        try:
            return list(psutil.Process(pid).cmdline())
        except psutil.Error as exc:
            raise Unreadable(_why(exc)) from exc

    def name(self, pid: int) -> str:
        import psutil

        try:
            return psutil.Process(pid).name()
        except psutil.Error:
            return ""

    def children(self, pid: int) -> list[int]:
        import psutil

        try:
            return [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []

    def environ(self, pid: int) -> Mapping[str, str]:
        import psutil

        try:
            return psutil.Process(pid).environ()
        except psutil.Error as exc:
            raise Unreadable(_why(exc)) from exc

    def status(self, pid: int) -> Mapping[str, int]:
        try:
            return read_status(pid)
        except PermissionError as exc:
            raise Unreadable("permission denied (another user's process?)") from exc
        except OSError as exc:
            raise Unreadable(f"cannot read /proc/{pid}/status: {exc.strerror or exc}") from exc

    def exe(self, pid: int) -> str | None:
        import psutil

        try:
            return psutil.Process(pid).exe() or None
        except psutil.Error:
            return None

    def vllm_version(self, exe: str, pythonpath: str | None) -> str | None:
        """Package metadata of the server's interpreter, with the server's PYTHONPATH."""
        from vllm_offload_doctor.machine.probes import read_interpreter

        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        return read_interpreter(exe, "the server's interpreter", env).vllm_version

    def gpus(self) -> list[Gpu]:
        from vllm_offload_doctor.machine.probes import read_nvml

        info = read_nvml()
        return [
            Gpu(
                g.index,
                g.pcie_gen,
                g.pcie_width,
                {p.pid: p.used_bytes for p in g.processes},
            )
            for g in info.gpus
        ]

    def host_available(self) -> int | None:
        import psutil

        return int(psutil.virtual_memory().available)


def _why(exc: Exception) -> str:
    import psutil

    if isinstance(exc, psutil.AccessDenied):
        return "access denied (another user's process?)"
    if isinstance(exc, psutil.NoSuchProcess):
        return "the process is gone"
    return str(exc) or type(exc).__name__


# --- command lines ---------------------------------------------------------------------------


def is_server(argv: Sequence[str]) -> bool:
    """`vllm serve ...` (any `*vllm` script) or `python -m vllm.entrypoints.openai.api_server`."""
    for i, arg in enumerate(argv):
        base = os.path.basename(arg)
        if base.endswith("vllm") and i + 1 < len(argv) and argv[i + 1] == "serve":
            return True
        if arg == "vllm.entrypoints.openai.api_server":
            return True
    return False


def _opt(argv: Sequence[str], *names: str) -> str | None:
    value = None
    for i, arg in enumerate(argv):
        for n in names:
            if arg == n and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(n + "="):
                value = arg[len(n) + 1 :]
    return value


def parse_cmdline(argv: Sequence[str], facts: ServerFacts) -> None:
    facts.cmdline = list(argv)
    off = _opt(argv, "--cpu-offload-gb")
    try:
        facts.offload_gb = float(off) if off is not None else None
    except ValueError:
        facts.offload_gb = None
    tp = _opt(argv, "--tensor-parallel-size", "-tp")
    facts.tp = int(tp) if tp and tp.isdigit() else 1
    mml = _opt(argv, "--max-model-len")
    facts.max_model_len = int(mml) if mml and mml.isdigit() else None
    port = _opt(argv, "--port")
    facts.port = int(port) if port and port.isdigit() else 8000
    model = _opt(argv, "--model")
    if model is None and "serve" in argv:
        rest = argv[list(argv).index("serve") + 1 :]
        if rest and not rest[0].startswith("-"):
            model = rest[0]
    facts.model = model


def role_of(argv: Sequence[str], name: str) -> str | None:
    """EngineCore / Worker_TPn from the title vLLM sets (argv), else the 15-byte comm."""
    m = _ROLE.search(" ".join(argv))
    if m:
        return m.group(1)
    if "EngineCor" in name:  # comm cuts VLLM::EngineCore to VLLM::EngineCor
        return "EngineCore"
    m = _ROLE.search(name)
    return m.group(1) if m else None


# --- gathering -------------------------------------------------------------------------------


def find_servers(src: ProcSource) -> list[int]:
    """The innermost server process of each tree (a wrapper naming `vllm serve` is skipped)."""
    found = []
    for pid in src.pids():
        try:
            if is_server(src.cmdline(pid)):
                found.append(pid)
        except Unreadable:
            continue
    # A wrapper (a guard, `timeout`, a shell) that names `vllm serve` is not the API server:
    # keep the innermost server of each tree.
    servers = set(found)
    return [p for p in found if not servers.intersection(src.children(p))]


def gather(src: ProcSource, pid: int) -> ServerFacts:
    facts = ServerFacts(pid=pid)
    try:
        parse_cmdline(src.cmdline(pid), facts)
    except Unreadable as exc:
        facts.error = f"cannot read the command line of pid {pid}: {exc}"
        return facts
    env: Mapping[str, str] = {}
    try:
        env = src.environ(pid)
        facts.runner_env = {
            k: ("***" if k == "VLLM_API_KEY" else env[k]) for k in RUNNER_VARS if k in env
        }
    except Unreadable as exc:
        facts.environ_error = str(exc)
    exe = src.exe(pid)
    if exe:
        version = src.vllm_version(exe, env.get("PYTHONPATH"))
        if version:
            facts.vllm_version = version
            facts.version_source = f"package metadata of {exe}"
    gpu_of: dict[int, tuple[int, int | None]] = {}
    for g in src.gpus():
        for p, used in g.processes.items():
            gpu_of[p] = (g.index, used)
    for p in [pid, *src.children(pid)]:
        if p == pid:
            role: str | None = "api_server"
        else:
            try:
                argv = src.cmdline(p)
            except Unreadable:
                argv = []
            role = role_of(argv, src.name(p))
        if role is None:
            continue  # resource trackers and the like
        pf = ProcFacts(pid=p, role=role)
        try:
            st = src.status(p)
            pf.rss_shmem_kb = st.get("RssShmem")
            pf.vm_rss_kb = st.get("VmRSS")
            if pf.rss_shmem_kb is None:
                pf.error = "no RssShmem in /proc/PID/status (kernel older than 4.5?)"
        except Unreadable as exc:
            pf.error = str(exc)
        if p in gpu_of:
            pf.gpu_index, pf.gpu_bytes = gpu_of[p]
        facts.procs.append(pf)
    return facts


def fetch_http(base_url: str, api_key: str | None, timeout_s: float = 3.0) -> HttpFacts:
    """/v1/models, /version, /metrics; failures are recorded, never raised."""
    import httpx

    from vllm_offload_doctor.compare.measure import kv_metrics

    out = HttpFacts(base_url=base_url)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(timeout=timeout_s, trust_env=False, headers=headers) as c:
        for path in ("/v1/models", "/version", "/metrics"):
            try:
                r = c.get(base_url + path)
            except httpx.HTTPError as exc:
                out.errors.append(f"{path}: {type(exc).__name__}")
                if isinstance(exc, httpx.ConnectError):
                    break  # nothing listens: the other paths would fail the same way
                continue
            if r.status_code != 200:
                out.errors.append(f"{path}: HTTP {r.status_code}")
                continue
            try:
                if path == "/v1/models":
                    out.models = [str(m.get("id")) for m in r.json().get("data", [])]
                elif path == "/version":
                    out.version = r.json().get("version")
                else:
                    out.kv_cache_tokens = kv_metrics(r.text).kv_cache_tokens
            except (ValueError, AttributeError):
                out.errors.append(f"{path}: unreadable answer")
    return out
