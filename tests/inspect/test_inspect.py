"""`inspect` verdicts through a fake /proc + NVML source; the H200 numbers are the fixture."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from vllm_offload_doctor.errors import DoctorError
from vllm_offload_doctor.inspect.cli import EXIT, inspect_servers
from vllm_offload_doctor.inspect.decide import decide
from vllm_offload_doctor.inspect.model import ServerFacts, Verdict
from vllm_offload_doctor.inspect.procs import Gpu, Unreadable, find_servers, gather
from vllm_offload_doctor.inspect.render import RENDERERS
from vllm_offload_doctor.machine.procstatus import parse_status

# Measured on an H200, vLLM 0.25.1, --cpu-offload-gb 0.5, EngineCore /proc/PID/status.
H200_IGNORED = {"RssShmem": 63_752, "VmRSS": 2_184_084}
H200_EFFECTIVE = {"RssShmem": 672_008, "VmRSS": 2_759_480}
SERVE = ["/venv/bin/python", "/venv/bin/vllm", "serve", "Qwen/Qwen3-0.6B", "--port", "8000"]


@dataclass
class P:
    argv: list[str]
    status: Mapping[str, int] | None = None  # None: unreadable
    env: Mapping[str, str] | None = field(default_factory=dict)
    name: str = "python"
    children: list[int] = field(default_factory=list)


@dataclass
class FakeSource:
    procs: dict[int, P]
    version: str | None = "0.25.1"
    system_name: str = "Linux"
    gpu_list: list[Gpu] = field(default_factory=list)
    available: int | None = 100 * 2**30

    def system(self) -> str:
        return self.system_name

    def pids(self) -> Sequence[int]:
        return list(self.procs)

    def _p(self, pid: int) -> P:
        if pid not in self.procs:
            raise Unreadable("the process is gone")
        return self.procs[pid]

    def cmdline(self, pid: int) -> list[str]:
        return self._p(pid).argv

    def name(self, pid: int) -> str:
        return self._p(pid).name

    def children(self, pid: int) -> list[int]:
        out = []
        for c in self.procs[pid].children:
            out += [c, *self.children(c)]
        return out

    def environ(self, pid: int) -> Mapping[str, str]:
        env = self._p(pid).env
        if env is None:
            raise Unreadable("access denied (another user's process?)")
        return env

    def status(self, pid: int) -> Mapping[str, int]:
        st = self._p(pid).status
        if st is None:
            raise Unreadable("permission denied (another user's process?)")
        return st

    def exe(self, pid: int) -> str | None:
        return "/venv/bin/python"

    def vllm_version(self, exe: str, pythonpath: str | None) -> str | None:
        return self.version

    def gpus(self) -> list[Gpu]:
        return self.gpu_list

    def host_available(self) -> int | None:
        return self.available


def server(engine_status, *, offload="0.5", env=None, version="0.25.1", gpus=()):
    argv = [*SERVE, "--cpu-offload-gb", offload] if offload else list(SERVE)
    return FakeSource(
        {
            100: P(argv, {"RssShmem": 0, "VmRSS": 500_000}, env or {}, children=[101, 102]),
            101: P(
                ["python", "-c", "from multiprocessing.spawn ..."],
                engine_status,
                name="VLLM::EngineCor",
            ),
            102: P(["python", "-m", "multiprocessing.resource_tracker"], {"RssShmem": 10}),
        },
        version=version,
        gpu_list=list(gpus),
    )


def one(src: FakeSource, **kw):
    [ins] = inspect_servers(src, http=False, **kw)
    return ins


def test_h200_effective_under_v1():
    gpu = Gpu(0, 5, 16, {101: 132_268 * 2**20})
    ins = one(server(H200_EFFECTIVE, env={"VLLM_USE_V2_MODEL_RUNNER": "0"}, gpus=[gpu]))
    assert ins.verdict is Verdict.EFFECTIVE and EXIT[ins.verdict] == 0
    [rank] = ins.ranks
    assert rank.process == "EngineCore" and rank.pid == 101
    assert rank.held_gib == pytest.approx(0.58, abs=0.01)  # 0.51 GiB offloaded, per the log
    assert rank.gpu_gib == pytest.approx(129.17, abs=0.01)
    assert ins.host_held_gib == pytest.approx(0.58, abs=0.01)
    assert ins.host_available_gib == 100
    # The 0.5 GiB of weights (not the 0.58 GiB pinned) over PCIe gen5 x16 at 85 %: ~10 ms per forward pass.
    assert ins.per_token_ms == pytest.approx(0.5 * 2**30 / (63.0 * 0.85e9) * 1e3, rel=0.02)
    assert ins.server.runner_env == {"VLLM_USE_V2_MODEL_RUNNER": "0"}


def test_cost_counts_the_offloaded_weights_not_the_pinned_rounding():
    # The section-6 model under V1 with 30 GiB on the H200: EngineCore held 36,983,044 kB of shared memory.
    gpu = Gpu(0, 5, 16, {101: 129_400 * 2**20})
    big = {"RssShmem": 36_983_044, "VmRSS": 38_000_000}
    ins = one(server(big, offload="30", env={"VLLM_USE_V2_MODEL_RUNNER": "0"}, gpus=[gpu]))
    assert ins.verdict is Verdict.EFFECTIVE
    assert ins.host_held_gib == pytest.approx(35.21, abs=0.02)
    assert ins.per_token_ms == pytest.approx(30 * 2**30 / (63.0 * 0.85e9) * 1e3, rel=0.02)


def test_h200_ignored_under_default_v2():
    ins = one(server(H200_IGNORED))
    assert ins.verdict is Verdict.IGNORED and EXIT[ins.verdict] == 1
    assert "default for dense models from 0.25" in ins.reason
    assert ins.fix and "VLLM_USE_V2_MODEL_RUNNER=0" in ins.fix and "0.28.0" in ins.fix
    assert ins.per_token_ms is None


def test_ignored_when_v2_forced_and_outside_the_window():
    forced = one(server(H200_IGNORED, env={"VLLM_USE_V2_MODEL_RUNNER": "1"}, version="0.23.0"))
    assert forced.verdict is Verdict.IGNORED
    assert "VLLM_USE_V2_MODEL_RUNNER=1 selects" in forced.reason
    fixed = one(server(H200_IGNORED, version="0.28.0"))
    assert fixed.verdict is Verdict.IGNORED
    assert fixed.fix is None and "outside the known Model Runner V2 window" in fixed.reason


def test_not_requested():
    ins = one(server(H200_IGNORED, offload=None))
    assert ins.verdict is Verdict.NOT_REQUESTED and EXIT[ins.verdict] == 0
    assert one(server(H200_IGNORED, offload="0")).verdict is Verdict.NOT_REQUESTED


def test_cannot_tell_another_users_process():
    ins = one(server(None))
    assert ins.verdict is Verdict.CANNOT_TELL and EXIT[ins.verdict] == 2
    assert "permission denied" in ins.reason and "EngineCore (pid 101)" in ins.reason


def test_cannot_tell_not_linux():
    src = server(H200_EFFECTIVE)
    src.system_name = "Darwin"
    ins = one(src)
    assert ins.verdict is Verdict.CANNOT_TELL and "Linux-only" in ins.reason


def test_cannot_tell_without_engine_process():
    src = server(H200_EFFECTIVE)
    src.procs[100].children = []
    ins = one(src)
    assert ins.verdict is Verdict.CANNOT_TELL and "no EngineCore" in ins.reason


def test_cannot_tell_half_way():
    # 0.8 GiB shared for a 2 GiB request: neither the baseline nor the request.
    ins = one(server({"RssShmem": 800 * 1024}, offload="2"))
    assert ins.verdict is Verdict.CANNOT_TELL


def tp2(shm0: int, shm1: int) -> FakeSource:
    argv = [*SERVE, "-tp", "2", "--cpu-offload-gb", "4"]
    return FakeSource(
        {
            1: P(argv, {"RssShmem": 0}, children=[2]),
            2: P(
                ["python", "-c", "spawn"],
                {"RssShmem": 60_000},
                name="VLLM::EngineCor",
                children=[3, 4],
            ),
            3: P(["VLLM::Worker_TP0"], {"RssShmem": shm0}),
            4: P(["VLLM::Worker_TP1"], {"RssShmem": shm1}),
        }
    )


def test_tp2_per_rank():
    both = one(tp2(4_300_000, 4_300_000))
    assert both.verdict is Verdict.EFFECTIVE
    assert [r.process for r in both.ranks] == ["Worker_TP0", "Worker_TP1"]
    assert both.host_held_gib == pytest.approx(2 * (4_300_000 - 63_752) / 2**20, abs=0.01)
    split = one(tp2(4_300_000, 60_000))
    assert split.verdict is Verdict.CANNOT_TELL
    assert [r.verdict for r in split.ranks] == [Verdict.EFFECTIVE, Verdict.IGNORED]


def test_innermost_server_and_port_selection():
    src = server(H200_IGNORED)
    src.procs[99] = P(["python", "guard.py", "--", *SERVE], {"RssShmem": 0}, children=[100])
    src.procs[200] = P(["/venv/bin/vllm", "serve", "x", "--port", "9000"], {"RssShmem": 0})
    assert sorted(find_servers(src)) == [100, 200]
    assert [i.server.pid for i in inspect_servers(src, port=8000, http=False)] == [100]
    with pytest.raises(DoctorError):
        inspect_servers(src, pid=101, http=False)  # EngineCore is not a server
    with pytest.raises(DoctorError):
        inspect_servers(src, port=7000, http=False)


def test_environ_unreadable_is_said():
    src = server(H200_IGNORED)
    src.procs[100].env = None
    facts = gather(src, 100)
    assert facts.environ_error and "access denied" in facts.environ_error
    ins = decide(facts)
    assert ins.verdict is Verdict.IGNORED and "environment is unreadable" in ins.reason


def test_parse_status():
    text = "Name:\tpython\nVmRSS:\t 2759480 kB\nRssShmem:\t  672008 kB\nThreads:\t7\n"
    assert parse_status(text) == {"VmRSS": 2_759_480, "RssShmem": 672_008}


@pytest.mark.parametrize("fmt", list(RENDERERS))
def test_every_format_renders_the_verdict(fmt):
    src = server(H200_IGNORED, env={"VLLM_API_KEY": "sk-secret-123456"})
    src.procs[100].argv = [*SERVE, "--cpu-offload-gb", "0.5", "--api-key", "sk-secret-123456"]
    text = RENDERERS[fmt]([one(src)])
    assert "ignored" in text.lower() and "sk-secret-123456" not in text


def test_url_only_when_no_local_process():
    facts = ServerFacts(pid=None, error="no process")
    assert decide(facts).verdict is Verdict.CANNOT_TELL
