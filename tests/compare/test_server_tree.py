"""The server's whole tree goes down, not just its process group: a double-forked, setsid,
untagged grandchild that holds the port and ignores SIGTERM (fake-vllm's FAKE_VLLM_ESCAPE).

Each way of finding it is proved on its own: the guard and offload-doctor as child subreapers
(parentage), the cgroup (where one can be made here), and the port's holder; a holder that
cannot be tied to the run is named, never killed."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from server_procs import alive, escapees, free_port

from vllm_offload_doctor.compare import server
from vllm_offload_doctor.compare.server import Cgroup, PortTaken, ServerProcess
from vllm_offload_doctor.errors import PortInUseError
from vllm_offload_doctor.machine.ports import listening_pids, probe_port

if sys.platform != "linux":  # pragma: no cover - subreaper, /proc/net/tcp and cgroups are Linux
    pytest.skip("Linux only", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "fake-vllm"


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def cgroup_or_skip() -> None:
    cg = Cgroup.create("probe" + os.urandom(4).hex())
    if cg is None:
        pytest.skip("no writable cgroup v2 with cgroup.kill here (not delegated, not root)")
    cg.remove()


def escaping_server(tmp_path: Path, **kw: object) -> tuple[ServerProcess, Path]:
    port = free_port()
    pidfile = tmp_path / "escapees"
    srv = ServerProcess(
        [str(FAKE), "serve", "m", "--host", "127.0.0.1", "--port", str(port)],
        log_path=tmp_path / "s.log",
        host="127.0.0.1",
        port=port,
        served_model="m",
        env=dict(os.environ, FAKE_VLLM_ESCAPE=str(pidfile)),
        grace_s=2,
        term_s=1,
        port_wait_s=3,
        **kw,  # type: ignore[arg-type]
    )
    return srv, pidfile


def no_subreaper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "set_subreaper", lambda on: None)


def no_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server.Cgroup, "create", classmethod(lambda cls, tag: None))


@pytest.mark.parametrize(
    "how",
    [
        "everything",  # guard + subreapers + cgroup where it can be had
        "fallback",  # no cgroup: the guard, a subreaper, finds it by parentage
        "cgroup-only",  # no guard, no subreaper: only the cgroup knows it
        "port-only",  # no guard, no cgroup: re-parented to us, found as the port's holder
    ],
)
def test_an_escaped_port_holder_is_taken_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "cgroup-only":
        cgroup_or_skip()
        no_subreaper(monkeypatch)
    if how in ("fallback", "port-only"):
        no_cgroup(monkeypatch)
    srv, pidfile = escaping_server(tmp_path, guard=how in ("everything", "fallback"))
    try:
        with srv:
            assert srv.wait_ready(20).ready
            (escapee,) = escapees(pidfile)
            assert srv.pid is not None and alive(escapee)
            assert os.getsid(escapee) != os.getsid(srv.pid)  # it left the session (and group)
            assert escapee in listening_pids(srv.port)
            if how == "cgroup-only":
                assert srv.cgroup is not None and escapee in srv.cgroup.pids()
                parent = psutil.Process(escapee).ppid()  # not ours by parentage
                assert parent != os.getpid() and parent not in srv.tree
            if how == "fallback":
                assert srv.cgroup is None
        stop = srv.stop_result
        assert stop is not None
        assert not alive(escapee), f"the escaped grandchild {escapee} outlived the server ({how})"
        assert stop.port_free is True and probe_port("127.0.0.1", srv.port).free
        assert stop.survivors == [] and stop.port_holder is None
        if srv.cgroup is not None:
            assert not srv.cgroup.path.exists()  # removed once empty
    finally:
        kill_all(escapees(pidfile))


def test_the_cgroup_holds_the_whole_tree(tmp_path: Path) -> None:
    cgroup_or_skip()
    srv, pidfile = escaping_server(tmp_path)
    try:
        with srv:
            assert srv.wait_ready(20).ready
            assert srv.cgroup is not None
            members = set(srv.cgroup.pids())
            assert {*srv.live_tree(), *escapees(pidfile)} <= members
            assert srv.cgroup.path.name in Path(f"/proc/{srv.pid}/cgroup").read_text()
        assert not srv.cgroup.path.exists()
    finally:
        kill_all(escapees(pidfile))


def test_a_stranger_holding_the_port_is_named_not_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # No guard, no subreaper, no cgroup: the escapee is re-parented to init and carries no tag,
    # so nothing ties it to this run any more: a stranger's process, for all the doctor knows.
    no_subreaper(monkeypatch)
    no_cgroup(monkeypatch)
    srv, pidfile = escaping_server(tmp_path, guard=False)
    try:
        with srv:
            assert srv.wait_ready(20).ready
            (holder,) = escapees(pidfile)
        stop = srv.stop_result
        assert stop is not None
        assert alive(holder), "a process not ours was killed"
        assert stop.port_free is False
        assert stop.port_holder is not None and stop.port_holder.startswith(f"pid {holder} (")
        err = capsys.readouterr().err
        assert f"warning: port {srv.port} is still held by pid {holder}" in err
        assert "did not start; left running" in err
    finally:
        kill_all(escapees(pidfile))


def test_start_refuses_a_port_that_answers(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        srv = ServerProcess(
            [str(FAKE), "serve", "m", "--port", str(port)],
            log_path=tmp_path / "s.log",
            host="127.0.0.1",
            port=port,
            served_model="m",
        )
        with pytest.raises(PortTaken) as err:
            srv.start()
    assert isinstance(err.value, PortInUseError)
    msg = str(err.value)
    assert msg.startswith(f"127.0.0.1:{port} is in use by pid {os.getpid()} (")
    assert msg.endswith("; stop it or choose another --port")
    assert srv.proc is None and not (tmp_path / "s.log").exists()  # nothing was started


def test_listening_pids_names_the_holder_of_a_port() -> None:
    with socket.socket() as s, socket.socket(socket.AF_INET6) as s6:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert os.getpid() not in listening_pids(port)  # bound, not listening
        s.listen()
        assert listening_pids(port) == {os.getpid()}
        s6.bind(("::1", 0))
        s6.listen()
        assert listening_pids(s6.getsockname()[1]) == {os.getpid()}
    assert listening_pids(port) == set()


def test_the_subreaper_setting_is_restored_after_the_run(tmp_path: Path) -> None:
    before = server.set_subreaper(False)
    assert before is not None
    srv, pidfile = escaping_server(tmp_path)
    try:
        with srv:
            assert srv.wait_ready(20).ready
            assert server.set_subreaper(True) is True  # on while the server runs
        assert server.set_subreaper(False) is False  # and off again after
    finally:
        kill_all(escapees(pidfile))
        server.set_subreaper(bool(before))


def test_a_server_that_cannot_be_executed_leaves_no_cgroup(tmp_path: Path) -> None:
    cgroup_or_skip()
    bad = tmp_path / "not-a-program"
    bad.write_bytes(b"\x7fELF but not really")
    bad.chmod(0o755)
    before = server.set_subreaper(False)
    base = server.own_cgroup_dir()
    assert base is not None
    srv = ServerProcess(
        [str(bad)],
        log_path=tmp_path / "s.log",
        host="127.0.0.1",
        port=free_port(),
        served_model="m",
        guard=False,  # the guard would start; the exec fails in Popen itself
    )
    try:
        with pytest.raises(OSError):
            srv.start()
        assert srv.cgroup is None
        assert not [p for p in base.iterdir() if p.name.endswith(f"-{srv.tag[:12]}")]
        assert server.set_subreaper(False) is False  # not left on
    finally:
        server.set_subreaper(bool(before))


def test_empty_cgroups_of_dead_runs_are_swept() -> None:
    cgroup_or_skip()
    base = server.own_cgroup_dir()
    assert base is not None
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = base / f"{server.CGROUP_PREFIX}{dead.pid}-stale"
    mine = base / f"{server.CGROUP_PREFIX}{os.getpid()}-live"
    stale.mkdir()
    mine.mkdir()
    try:
        cg = Cgroup.create("t" + os.urandom(6).hex())
        assert cg is not None
        cg.remove()
        assert not stale.exists() and mine.exists()  # only a dead run's
    finally:
        for d in (stale, mine):
            with contextlib.suppress(OSError):
                d.rmdir()
