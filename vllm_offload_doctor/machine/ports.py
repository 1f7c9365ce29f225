"""Is a TCP port free, and if not, which process holds it."""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass


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
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR, so lingering TIME_WAIT sockets do not make a port "taken".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
            pid, name = _holder(port)
            return PortState(host, port, False, pid, name)
    return PortState(host, port, True)


def _holder(port: int) -> tuple[int | None, str | None]:
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid is None:
                    return None, None
                try:
                    return conn.pid, psutil.Process(conn.pid).name()
                except psutil.Error:
                    return conn.pid, None
    except Exception:  # psutil may be denied the connection table; the answer is still "taken"
        return None, None
    return None, None
