"""Is a TCP port free, and if not, which processes hold it."""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class PortState:
    host: str
    port: int
    free: bool
    pid: int | None = None
    process: str | None = None

    def describe(self) -> str:
        if self.free:
            return f"{self.host}:{self.port} is free"
        who = f"pid {self.pid} ({self.process})" if self.pid else "another process"
        return f"{self.host}:{self.port} is in use by {who}"


def probe_port(host: str, port: int) -> PortState:
    """Try to bind the port the way a server would; name the holder when it is taken."""
    if port_free(host, port):
        return PortState(host, port, True)
    pid, name = _holder(port)
    return PortState(host, port, False, pid, name)


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind the port now (OSError for a failure other than "taken")."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR, so lingering TIME_WAIT sockets do not make a port "taken".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
            return False
    return True


def _holder(port: int) -> tuple[int | None, str | None]:
    try:
        import psutil

        first = next(iter(_listeners(port)), None)
        if first is None or first.pid is None:
            return None, None
        try:
            return first.pid, psutil.Process(first.pid).name()
        except psutil.Error:
            return first.pid, None
    except Exception:  # psutil may be denied the connection table; the answer is still "taken"
        return None, None


def _listeners(port: int) -> list[Any]:
    """psutil's listening TCP sockets on `port`, in its order (raises where it is denied)."""
    import psutil

    return [
        c
        for c in psutil.net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
    ]


def listening_pids(port: int) -> set[int]:
    """Pids holding a listening TCP socket on `port` (any address): the socket inodes from
    /proc/net/tcp{,6}, then the processes with one of them open. psutil where /proc has no
    such table; empty when nothing can be read."""
    inodes: set[str] = set()
    tables = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii", errors="replace") as f:
                next(f, None)  # the header
                tables += 1
                for line in f:
                    cols = line.split()
                    # local "ADDR:PORT" in hex, state 0A is LISTEN, inode in column 10
                    if (
                        len(cols) > 9
                        and cols[3] == "0A"
                        and int(cols[1].rsplit(":", 1)[1], 16) == port
                    ):
                        inodes.add(cols[9])
        except (OSError, ValueError, IndexError):
            continue
    if not tables:
        return _listening_pids_psutil(port)
    wanted = {f"socket:[{i}]" for i in inodes if i != "0"}
    pids: set[int] = set()
    if not wanted:
        return pids
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}") in wanted:
                    pids.add(int(name))
                    break
            except OSError:
                continue
    return pids


def _listening_pids_psutil(port: int) -> set[int]:
    try:
        return {c.pid for c in _listeners(port) if c.pid is not None}
    except Exception:  # denied the connection table: nothing known
        return set()
