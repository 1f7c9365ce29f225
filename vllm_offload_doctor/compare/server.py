"""Start `vllm serve` in its own process group, wait until it is ready, and always take it down.

Lifecycle (after mirakuru/honcho, without their pitfalls):

* `Popen(argv, start_new_session=True)`, never a shell; stdout and stderr go to a log file,
  never to a pipe nobody reads.
* The child's environment carries `OFFLOAD_DOCTOR_RUN=<uuid>`, and the process tree is recorded
  while it runs, so grandchildren that re-parent or leave the group are still found.
* Readiness: `/health` answers 200 and `/v1/models` lists the served model, polled against a
  `time.monotonic()` deadline; an early exit is noticed at the next poll (0.25 s).
* `stop()`: SIGINT to the group, wait; SIGTERM, wait; SIGKILL; then a sweep of every recorded or
  tagged process; then wait until the port is free. SIGINT is deferred while this runs so a second
  Ctrl+C cannot leave a half-stopped server behind.
"""

from __future__ import annotations

import contextlib
import json
import os
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

from vllm_offload_doctor.machine.ports import probe_port

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "stop_s": round(self.stop_s, 3),
            "signals": self.signals,
            "returncode": self.returncode,
            "swept": self.swept,
            "survivors": self.survivors,
            "port_free": self.port_free,
            "log_flood": self.log_flood,
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
    ) -> None:
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
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.sent_key = bool(api_key)
        self.guard = guard and sys.platform.startswith("linux")
        self.proc: subprocess.Popen[bytes] | None = None
        self.tree: dict[int, TreeProc] = {}
        self.started_at: float | None = None
        self.stop_result: StopResult | None = None
        self._log: IO[bytes] | None = None
        head, tail = min(LOG_HEAD, max_log_bytes // 4), min(LOG_TAIL, max_log_bytes // 8)
        self.log_cap = _LogCap(log_path, max_log_bytes, head, tail)

    # ------------------------------------------------------------------ start / readiness

    def start(self) -> None:
        exe = self.argv[0]
        if not (shutil.which(exe) if os.sep not in exe else os.access(exe, os.X_OK)):
            raise FileNotFoundError(2, "not found or not executable", exe)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND: the server's writes land at the end even after the log cap cut the file.
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        self._log = os.fdopen(os.open(self.log_path, flags, 0o600), "wb")  # closed in stop()
        self.started_at = time.monotonic()
        argv = self.argv
        if self.guard:  # the server dies with us, even on SIGKILL (see guard.py)
            argv = [sys.executable, "-I", "-S", GUARD, str(os.getpid()), "--", *argv]
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
            raise
        self.log_cap.start()
        self.record_tree()

    @property
    def pid(self) -> int | None:
        """The server's pid (the guard's child when guarded)."""
        if self.proc is None:
            return None
        if self.guard:
            self.record_tree()
            kids = [t.pid for t in self.tree.values() if t.pid != self.proc.pid]
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
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
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
        for tp in self.tree.values():
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
            if not self._group_alive(pgid) and self.proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
                res.signals.append(sig.name)
            self._wait_group(pgid, wait_s)
        if self._group_alive(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
                res.signals.append("SIGKILL")
        try:
            res.returncode = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            res.returncode = self.proc.wait()
        # Sweep: recorded descendants that left the group, and anything carrying our tag.
        leftovers: dict[int, Any] = {}
        for pid in self._live():
            with contextlib.suppress(psutil.Error):
                leftovers[pid] = psutil.Process(pid)
        for p in self._tagged():
            leftovers.setdefault(p.pid, p)
        for p in leftovers.values():
            with contextlib.suppress(psutil.Error):
                p.kill()
                res.swept.append(p.pid)
        _gone, alive = psutil.wait_procs(list(leftovers.values()), timeout=5)
        res.survivors = sorted(p.pid for p in alive)
        if self._log is not None:
            self._log.close()
            self._log = None
        self.log_cap.stop()
        res.log_flood = self.log_cap.flood()
        res.port_free = self.wait_port_free(self.port_wait_s)
        res.stop_s = time.monotonic() - t0
        return res

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

    def _wait_group(self, pgid: int, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not self._group_alive(pgid):
                return
            time.sleep(0.05)

    def wait_port_free(self, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                if probe_port(self.host, self.port).free:
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
