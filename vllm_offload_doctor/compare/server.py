"""Start `vllm serve` in its own process group, wait until it is ready, and always take it down.

Lifecycle (after mirakuru/honcho, without their pitfalls):

* `start()` refuses a port something already answers on (mirakuru's `pre_start_check`).
* `Popen(argv, start_new_session=True)`, never a shell; stdout and stderr go to a log file,
  never to a pipe nobody reads.
* The server's tree is ours however it forks: the child's environment carries
  `OFFLOAD_DOCTOR_RUN=<uuid>`; offload-doctor (and the guard) are child subreapers while it runs,
  so a double-forked, setsid descendant is re-parented to us and parentage still finds it; the
  tree is recorded at every poll, so one seen once is still ours after it moved; where cgroup v2
  is delegated and writable, the tree runs in a fresh child cgroup (cgroup.kill takes all of it);
  and the process listening on the server's port is taken down when it is one of ours (a stranger
  holding it is named in a warning, never killed).
* Readiness: `/health` answers 200 and `/v1/models` lists the served model, polled against a
  `time.monotonic()` deadline; an early exit is noticed at the next poll (0.25 s).
* `stop()`: SIGINT to the group and every process of the tree outside it, wait; SIGTERM, wait;
  SIGKILL (and cgroup.kill); then a sweep of every recorded, tagged or cgroup process; then wait
  until the port is free. SIGINT is deferred while this runs so a second Ctrl+C cannot leave a
  half-stopped server behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from vllm_offload_doctor.errors import PortInUseError
from vllm_offload_doctor.machine.ports import PortState, listening_pids, port_free, probe_port

RUN_TAG = "OFFLOAD_DOCTOR_RUN"
POLL_S = 0.25
READY_TIMEOUT_S = 2.0  # one readiness probe (/health, /v1/models), connect to last byte
# A server log past MAX_LOG_BYTES is cut (a server printing 100 MB/s would fill the disk):
# its first LOG_HEAD and latest LOG_TAIL bytes are kept around a marker, and the report names it.
MAX_LOG_BYTES = 256 << 20
LOG_HEAD = 64 << 20
LOG_TAIL = 32 << 20
LOG_CHECK_S = 0.5
GUARD = str(Path(__file__).with_name("guard.py"))
PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37
CGROUP_PREFIX = "offload-doctor-"


class PortTaken(PortInUseError):
    """`start()` found the server's port already answering; nothing was started."""

    def __init__(self, state: PortState) -> None:
        super().__init__(f"{state.describe()}; stop it or choose another --port")
        self.state = state


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP, SIGQUIT) reached offload-doctor; unwinds through the same cleanup
    as Ctrl+C."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signum)
        self.signum = signum


# A closed terminal or a dropped ssh session (SIGHUP) and Ctrl+\ (SIGQUIT) must clean up too.
TERMINATING = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@dataclass(slots=True)
class StartResult:
    ready: bool
    startup_s: float
    exited: bool = False
    returncode: int | None = None
    timed_out: bool = False
    reason: str = ""
    unauthorized: bool = False  # /v1 answered 401: the server wants an API key we lack


@dataclass(slots=True)
class StopResult:
    stop_s: float = 0.0
    signals: list[str] = field(default_factory=list)
    returncode: int | None = None
    swept: list[int] = field(default_factory=list)  # pids killed by the final sweep
    survivors: list[int] = field(default_factory=list)  # pids still alive afterwards (should be [])
    port_free: bool | None = None
    log_flood: str | None = None  # "the server wrote N MB of log in M s", when its log was cut
    port_holder: str | None = None  # "pid N (name)": not ours, holds the port, left running

    def to_dict(self) -> dict[str, Any]:
        return {
            "stop_s": round(self.stop_s, 3),
            "signals": self.signals,
            "returncode": self.returncode,
            "swept": self.swept,
            "survivors": self.survivors,
            "port_free": self.port_free,
            "log_flood": self.log_flood,
            "port_holder": self.port_holder,
        }


class _LogCap:
    """Keeps a server's log file under `limit` bytes while the server writes to it (O_APPEND):
    past the limit, the first `head` and the latest `tail` bytes stay around a marker line."""

    def __init__(self, path: Path, limit: int, head: int, tail: int) -> None:
        self.path, self.limit, self.head, self.tail = path, limit, head, tail
        self.cut_bytes = 0  # written by the server, no longer in the file
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-cap", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.check()

    def _run(self) -> None:
        while not self._stop.wait(LOG_CHECK_S):
            self.check()

    def check(self) -> None:
        try:
            size = self.path.stat().st_size
            if size > self.limit:
                self._cut(size)
        except OSError:
            pass  # the log is gone or unreadable: nothing to cap

    def _cut(self, size: int) -> None:
        with open(self.path, "r+b") as f:
            f.seek(max(self.head, size - self.tail))
            tail = f.read(self.tail)
            dropped = size - self.head - len(tail)
            self.cut_bytes += dropped
            f.truncate(self.head)
            f.seek(self.head)
            f.write(
                f"\n[offload-doctor: {dropped} bytes of the server's log cut here: {self.flood()}]\n".encode()
            )
            f.write(tail)

    @property
    def written(self) -> int:
        try:
            size = self.path.stat().st_size
        except OSError:
            size = 0
        return self.cut_bytes + size

    def flood(self) -> str | None:
        if not self.cut_bytes:
            return None
        took = time.monotonic() - self.started
        return (
            f"the server wrote {self.written / 1e6:.0f} MB of log in {took:.0f} s; its saved "
            f"log keeps the first {self.head >> 20} MiB and the last {self.tail >> 20} MiB"
        )


@dataclass(frozen=True, slots=True)
class TreeProc:
    pid: int
    create_time: float
    name: str


class ServerProcess:
    """One `vllm serve` run. Use as a context manager: `__exit__` always stops it."""

    def __init__(
        self,
        argv: list[str],
        *,
        log_path: Path,
        host: str,
        port: int,
        served_model: str,
        env: dict[str, str] | None = None,
        grace_s: float = 10.0,
        term_s: float = 5.0,
        port_wait_s: float = 15.0,
        api_key: str | None = None,
        guard: bool = True,
        max_log_bytes: int = MAX_LOG_BYTES,
        cgroup: bool = True,
    ) -> None:
        from vllm_offload_doctor.compare.measure import auth_headers

        self.argv = argv
        self.log_path = log_path
        self.host = host
        self.port = port
        self.served_model = served_model
        self.tag = uuid.uuid4().hex
        self.env = dict(os.environ if env is None else env)
        self.env[RUN_TAG] = self.tag
        self.grace_s = grace_s
        self.term_s = term_s
        self.port_wait_s = port_wait_s
        self.headers = auth_headers(api_key)
        self.sent_key = bool(api_key)
        self.guard = guard and sys.platform.startswith("linux")
        self.use_cgroup = cgroup
        self.cgroup: Cgroup | None = None
        self._subreaper_was: bool | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.tree: dict[int, TreeProc] = {}
        self.started_at: float | None = None
        self.stop_result: StopResult | None = None
        self._log: IO[bytes] | None = None
        head, tail = min(LOG_HEAD, max_log_bytes // 4), min(LOG_TAIL, max_log_bytes // 8)
        self.log_cap = _LogCap(log_path, max_log_bytes, head, tail)

    # ------------------------------------------------------------------ start / readiness

    def start(self) -> None:
        """Start the server; `PortTaken` when something already answers on its port."""
        state = probe_port(self.host, self.port)
        if not state.free:
            raise PortTaken(state)
        exe = self.argv[0]
        if not (shutil.which(exe) if os.sep not in exe else os.access(exe, os.X_OK)):
            raise FileNotFoundError(2, "not found or not executable", exe)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND: the server's writes land at the end even after the log cap cut the file.
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        self._log = os.fdopen(os.open(self.log_path, flags, 0o600), "wb")  # closed in stop()
        self.started_at = time.monotonic()
        argv = self.argv
        self.cgroup = Cgroup.create(self.tag) if self.use_cgroup else None
        if self.guard:  # the server dies with us, even on SIGKILL (see guard.py)
            where = ["--cgroup", str(self.cgroup.path)] if self.cgroup else []
            argv = [sys.executable, "-I", "-S", GUARD, str(os.getpid()), *where, "--", *argv]
        self._subreaper_was = set_subreaper(True)
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        except OSError:
            self._log.close()
            self._log = None
            self._release()
            if self.cgroup is not None:
                self.cgroup.discard()
                self.cgroup = None
            raise
        # The guard moved itself already; unguarded, this is the earliest we can. Where neither
        # got in, the cgroup goes (only while empty: it is never killed here).
        cg = self.cgroup
        pid = self.proc.pid
        if cg is not None and not cg.add(pid) and pid not in cg.pids() and cg.discard():
            self.cgroup = None
        self.log_cap.start()
        self.record_tree()

    @property
    def pid(self) -> int | None:
        """The server's pid (the guard's child when guarded)."""
        if self.proc is None:
            return None
        if self.guard:
            self.record_tree()
            kids = [t.pid for t in list(self.tree.values()) if t.pid != self.proc.pid]
            return min(kids, key=lambda p: self.tree[p].create_time) if kids else None
        return self.proc.pid

    def elapsed(self) -> float:
        return 0.0 if self.started_at is None else time.monotonic() - self.started_at

    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        if host in ("0.0.0.0", "[::]"):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"

    def wait_ready(
        self,
        timeout_s: float,
        on_tick: Callable[[float], None] | None = None,
    ) -> StartResult:
        """Poll until ready, exited or timed out. `on_tick(elapsed)` runs on every poll."""
        import httpx

        assert self.proc is not None, "start() first"
        deadline = (self.started_at or time.monotonic()) + timeout_s
        url = self.base_url()
        with httpx.Client(
            timeout=httpx.Timeout(READY_TIMEOUT_S, connect=1.0),
            trust_env=False,
            headers=self.headers,
        ) as client:
            while True:
                self.record_tree()
                rc = self.proc.poll()
                if on_tick:
                    on_tick(self.elapsed())
                if rc is not None:
                    return StartResult(
                        False,
                        self.elapsed(),
                        exited=True,
                        returncode=rc,
                        reason=f"the server exited with status {rc} before it was ready",
                    )
                ready = self._ready(client, url)
                if ready == 401:
                    why = "rejected the API key sent" if self.sent_key else "wants an API key"
                    return StartResult(
                        False,
                        self.elapsed(),
                        unauthorized=True,
                        reason=f"401: the server {why} (give it with `-- --api-key KEY` "
                        "or VLLM_API_KEY)",
                    )
                if ready is True:
                    return StartResult(True, self.elapsed())
                if time.monotonic() >= deadline:
                    return StartResult(
                        False,
                        self.elapsed(),
                        timed_out=True,
                        reason=f"not ready after {timeout_s:g} s (--timeout)",
                    )
                time.sleep(POLL_S)

    def _ready(self, client: Any, url: str) -> bool | int:
        """True when ready; 401 when the server refuses us for lack of a valid API key."""
        import httpx

        from vllm_offload_doctor.compare.measure import AnswerBound, bounded_get

        try:
            if bounded_get(client, f"{url}/health", READY_TIMEOUT_S)[0] != 200:
                return False
            status, body = bounded_get(client, f"{url}/v1/models", READY_TIMEOUT_S)
            if status == 401:
                return 401
            if status != 200:
                return False
            models = json.loads(body.decode("utf-8", "replace")).get("data", [])
            ids = [m.get("id") for m in models if isinstance(m, dict)]
        except (httpx.HTTPError, ValueError, AttributeError, TypeError, AnswerBound):
            return False
        return self.served_model in ids

    # ------------------------------------------------------------------ process tree

    def record_tree(self) -> None:
        """Remember every descendant seen so far (pid + create time guards against pid reuse)."""
        import psutil

        if self.proc is None:
            return
        procs: list[Any] = []
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        for pid in self.cgroup.pids() if self.cgroup else ():
            if pid not in self.tree:
                with contextlib.suppress(psutil.Error):
                    procs.append(psutil.Process(pid))
        for p in procs:
            if p.pid in self.tree:
                continue
            try:
                self.tree[p.pid] = TreeProc(p.pid, p.create_time(), p.name())
            except psutil.Error:
                continue

    def live_tree(self) -> list[int]:
        """Pids of the server tree alive now (recorded ones plus current descendants)."""
        return [p for p in self._live() if not (self.guard and self.proc and p == self.proc.pid)]

    def _live(self) -> list[int]:
        import psutil

        self.record_tree()
        alive = []
        for tp in list(self.tree.values()):  # the host sampler's thread records too
            try:
                p = psutil.Process(tp.pid)
                if p.create_time() == tp.create_time and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(tp.pid)
            except psutil.Error:
                continue
        return sorted(alive)

    def _tagged(self) -> list[Any]:
        """Processes carrying this run's environment tag (catches escaped grandchildren)."""
        import psutil

        found = []
        me = os.getpid()
        for p in psutil.process_iter(["pid"]):
            if p.pid == me:
                continue
            try:
                if p.environ().get(RUN_TAG) == self.tag:
                    found.append(p)
            except psutil.Error:
                continue
        return found

    # ------------------------------------------------------------------ stop

    def stop(self) -> StopResult:
        if self.stop_result is not None:
            return self.stop_result
        with _sigint_deferred():
            result = self._stop()
        self.stop_result = result
        return result

    def _stop(self) -> StopResult:
        import psutil

        res = StopResult()
        t0 = time.monotonic()
        if self.proc is None:
            return res
        self.record_tree()
        pgid = self.proc.pid  # start_new_session: the leader's pid is the group id
        for sig, wait_s in ((signal.SIGINT, self.grace_s), (signal.SIGTERM, self.term_s)):
            if not self._tree_alive(pgid):
                break
            if self._signal_all(pgid, sig, res):
                res.signals.append(sig.name)
            self._wait_tree(pgid, wait_s)
        if self._tree_alive(pgid):
            reached = self._signal_all(pgid, signal.SIGKILL, res)
            if self.cgroup is not None and self.cgroup.kill():
                reached = True
            if reached:
                res.signals.append("SIGKILL")
        try:
            res.returncode = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            res.returncode = self.proc.wait()
        # Sweep: recorded descendants that left the group, what carries our tag, what is in our
        # cgroup, and the port's holder when it is ours.
        self.record_tree()
        leftovers: dict[int, Any] = {}
        for pid in self._live():
            with contextlib.suppress(psutil.Error):
                leftovers[pid] = psutil.Process(pid)
        for p in [*self._tagged(), *self._port_holders()[0]]:
            leftovers.setdefault(p.pid, p)
        for p in leftovers.values():
            with contextlib.suppress(psutil.Error):
                p.kill()
                if p.pid not in res.swept:
                    res.swept.append(p.pid)
        _gone, alive = psutil.wait_procs(list(leftovers.values()), timeout=5)
        survivors = {p.pid for p in alive}
        if self.cgroup is not None:
            survivors.update(self.cgroup.remove())
        res.survivors = sorted(survivors)
        self._reap_ours()
        self._release()
        if self._log is not None:
            self._log.close()
            self._log = None
        self.log_cap.stop()
        res.log_flood = self.log_cap.flood()
        res.port_free = self.wait_port_free(self.port_wait_s)
        if not res.port_free:
            res.port_holder = self._name_stranger()
        res.stop_s = time.monotonic() - t0
        return res

    def _outside(self, pgid: int, *, scan_port: bool = True) -> list[Any]:
        """Live processes of the tree outside the server's group: recorded ones, the cgroup's,
        and the port's holder when it is ours (the scan of every process's fds only when asked:
        a holder found once is recorded)."""
        import psutil

        self.record_tree()
        if scan_port:
            self._port_holders()
        found: dict[int, Any] = {}
        for pid in self._live():
            with contextlib.suppress(psutil.Error):
                found[pid] = psutil.Process(pid)
        out = []
        for pid, p in found.items():
            try:
                if pid != pgid and os.getpgid(pid) != pgid:
                    out.append(p)
            except (ProcessLookupError, PermissionError):
                continue
        return out

    def _signal_all(self, pgid: int, sig: signal.Signals, res: StopResult) -> bool:
        """`sig` to the server's group and to each process of the tree outside it (a SIGKILL
        by pid is a sweep); whether it reached any."""
        import psutil

        reached = False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
            reached = True
        for p in self._outside(pgid):
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
                reached = True
                if sig == signal.SIGKILL and p.pid not in res.swept:
                    res.swept.append(p.pid)
        return reached

    def _tree_alive(self, pgid: int, *, scan_port: bool = True) -> bool:
        return self._group_alive(pgid) or bool(self._outside(pgid, scan_port=scan_port))

    def _wait_tree(self, pgid: int, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not self._tree_alive(pgid, scan_port=False):
                return
            time.sleep(0.05)

    def _port_holders(self) -> tuple[list[Any], list[Any]]:
        """Processes listening on the server's port: (ours, strangers). Ours: recorded in the
        tree, or descended from offload-doctor (a subreaper, so orphans of the tree are)."""
        import psutil

        try:
            if port_free(self.host, self.port):
                return [], []
        except OSError:
            return [], []
        me = os.getpid()
        ours, strangers = [], []
        for pid in sorted(listening_pids(self.port) - {me}):
            try:
                p = psutil.Process(pid)
                seen = self.tree.get(pid)
                if (seen and seen.create_time == p.create_time()) or me in {
                    q.pid for q in p.parents()
                }:
                    ours.append(p)
                    self.tree.setdefault(pid, TreeProc(pid, p.create_time(), p.name()))
                else:
                    strangers.append(p)
            except psutil.Error:
                continue
        return ours, strangers

    def _name_stranger(self) -> str | None:
        """The port is still taken: name whoever holds it, in a warning (it is not ours)."""
        import psutil

        strangers = self._port_holders()[1]
        if not strangers:
            return None
        names = []
        for p in strangers:
            try:
                names.append(f"pid {p.pid} ({p.name()})")
            except psutil.Error:
                names.append(f"pid {p.pid}")
        who = ", ".join(names)
        sys.stderr.write(
            f"offload-doctor: warning: port {self.port} is still held by {who}, which this run "
            "did not start; left running\n"
        )
        return who

    def _reap_ours(self) -> None:
        """Orphans of the tree re-parented to us (subreaper) that died: reaped, so no zombie
        outlives the run. Only pids of the tree: other children are waited for by their owners."""
        own = self.proc.pid if self.proc is not None else None
        for pid in list(self.tree):
            if pid != own:
                with contextlib.suppress(OSError):
                    os.waitpid(pid, os.WNOHANG)

    def _release(self) -> None:
        if self._subreaper_was is not None:
            set_subreaper(self._subreaper_was)
            self._subreaper_was = None

    def _group_alive(self, pgid: int) -> bool:
        if self.proc is not None:
            self.proc.poll()  # reap a zombie leader so it does not keep the group "alive"
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        if self.proc is not None and self.proc.returncode is None:
            return True
        # The leader is gone: zombies (orphans not yet reaped, e.g. when pid 1 does not reap)
        # still answer killpg, so look for a live member of the group.
        return _live_group_member(pgid)

    def wait_port_free(self, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                if port_free(self.host, self.port):
                    return True
            except OSError:
                return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def set_subreaper(on: bool) -> bool | None:
    """Make this process a child subreaper (Linux): orphans of its descendants are re-parented
    to it, not to init. Returns the previous setting; None where there is no such thing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        was = ctypes.c_int(0)
        if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) != 0:
            return None
        if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return bool(was.value)


class Cgroup:
    """A fresh cgroup v2 under our own, for one server tree: every process it forks is born in
    it (setsid or double fork change nothing), and cgroup.kill takes them all at once. Only
    where cgroup v2 is mounted, our cgroup is writable (delegated, or root) and the kernel has
    cgroup.kill (5.14); otherwise `create` returns None and the tree is found as before."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, tag: str) -> Cgroup | None:
        base = own_cgroup_dir()
        if base is None or not os.access(base / "cgroup.procs", os.W_OK):
            return None
        sweep_cgroups(base)
        path = base / f"{CGROUP_PREFIX}{os.getpid()}-{tag[:12]}"
        try:
            path.mkdir()
        except OSError:
            return None
        cg = cls(path)
        if not (path / "cgroup.kill").exists() or not os.access(path / "cgroup.procs", os.W_OK):
            cg.discard()
            return None
        return cg

    def discard(self) -> bool:
        """Remove it if it is empty; whether it is gone."""
        try:
            os.rmdir(self.path)
        except OSError:
            return False
        return True

    def add(self, pid: int) -> bool:
        try:
            (self.path / "cgroup.procs").write_text(str(pid))
        except OSError:
            return False
        return True

    def pids(self) -> list[int]:
        """Every process in it (nested cgroups the server made included)."""
        pids: list[int] = []
        for dirpath, _dirs, _files in os.walk(self.path):
            with contextlib.suppress(OSError, ValueError):
                pids.extend(int(x) for x in Path(dirpath, "cgroup.procs").read_text().split())
        return pids

    def populated(self) -> bool:
        try:
            return "populated 1" in (self.path / "cgroup.events").read_text()
        except OSError:
            return False

    def kill(self) -> bool:
        if not self.populated():
            return False
        try:
            (self.path / "cgroup.kill").write_text("1")
        except OSError:
            return False
        return True

    def remove(self, wait_s: float = 5.0) -> list[int]:
        """Kill what is left, wait until it is empty and remove it; the pids that would not go."""
        self.kill()
        deadline = time.monotonic() + wait_s
        while self.populated() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = self.pids()
        for dirpath, _dirs, _files in sorted(os.walk(self.path), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
        return left


def sweep_cgroups(base: Path) -> None:
    """Remove the empty cgroups of runs whose offload-doctor is gone (its guard was SIGKILLed
    too, so nobody removed them). One still holding a process is left alone."""
    with contextlib.suppress(OSError):
        for d in base.glob(f"{CGROUP_PREFIX}*-*"):
            pid = d.name[len(CGROUP_PREFIX) :].split("-", 1)[0]
            if not pid.isdigit():
                continue
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                Cgroup(d).discard()
            except OSError:
                continue


def own_cgroup_dir() -> Path | None:
    """This process's cgroup v2 directory (from /proc/self/cgroup and the cgroup2 mount)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    rel = next((ln[3:] for ln in lines if ln.startswith("0::")), None)
    if rel is None or not rel.startswith("/"):
        return None
    for line in mounts:
        left, _sep, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right.startswith("cgroup2 "):
            continue
        # mountinfo writes a space, tab, newline or backslash as an octal escape (\040)
        root, mountpoint = (_unescape(f) for f in fields[3:5])
        if rel == root or rel.startswith(root.rstrip("/") + "/"):
            path = Path(mountpoint, rel[len(root.rstrip("/")) :].lstrip("/"))
            return path if path.is_dir() else None
    return None


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _live_group_member(pgid: int) -> bool:
    import psutil

    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                return True
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return False


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Ignore SIGINT/SIGTERM while cleaning up; re-deliver a KeyboardInterrupt afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    old = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, *TERMINATING)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if pending:
        raise Terminated(pending[-1]) if pending[-1] in TERMINATING else KeyboardInterrupt()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While active, SIGTERM, SIGHUP and SIGQUIT raise `Terminated` (a KeyboardInterrupt) in the
    main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, frame: FrameType | None) -> None:
        raise Terminated(signum)

    old = {sig: signal.signal(sig, raise_terminated) for sig in TERMINATING}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
