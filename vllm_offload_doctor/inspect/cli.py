"""The `inspect` click command: find the server(s), read them, decide, render. Never signals."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import click

from vllm_offload_doctor import exitcodes
from vllm_offload_doctor.common_cli import (
    Output,
    format_option,
    output_option,
    quiet_option,
    verbose_option,
)
from vllm_offload_doctor.errors import DoctorError
from vllm_offload_doctor.inspect.decide import decide
from vllm_offload_doctor.inspect.model import HttpFacts, Inspection, ServerFacts, Verdict
from vllm_offload_doctor.inspect.procs import (
    Gpu,
    ProcSource,
    RealSource,
    Unreadable,
    fetch_http,
    find_servers,
    gather,
    is_server,
)
from vllm_offload_doctor.inspect.render import RENDERERS
from vllm_offload_doctor.output.formats import OutputFormat

EXIT = {
    Verdict.EFFECTIVE: exitcodes.OK,
    Verdict.NOT_REQUESTED: exitcodes.OK,
    Verdict.IGNORED: exitcodes.FOUND,
    Verdict.CANNOT_TELL: exitcodes.USAGE,
}


def inspect_servers(
    src: ProcSource,
    pid: int | None = None,
    port: int | None = None,
    url: str | None = None,
    api_key: str | None = None,
    http: bool = True,
) -> list[Inspection]:
    """One Inspection per server found (PID, or the one on the port, or every server)."""
    if url:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if not parts.hostname:
            raise DoctorError(f"--url {url!r} is not a URL")
        port = port or parts.port or (443 if parts.scheme == "https" else 80)
    if src.system() != "Linux":
        facts = ServerFacts(pid=pid, error=f"{src.system()}: /proc is Linux-only")
        facts.http = fetch_http(_base(url, port), api_key) if http and (url or port) else None
        return [decide(facts)]
    if pid is not None:
        try:
            argv = src.cmdline(pid)
        except Unreadable as exc:
            raise DoctorError(f"pid {pid}: {exc}") from exc
        if not is_server(argv):
            raise DoctorError(f"pid {pid} is not a `vllm serve` process: {' '.join(argv[:3])}")
        pids = [pid]
    else:
        pids = find_servers(src)
        if port is not None:
            pids = [p for p in pids if _port_of(src, p) == port]
    if not pids:
        if port is not None and http:
            # Another user's server, or one in a container: only HTTP can say anything.
            facts = ServerFacts(
                pid=None,
                port=port,
                error="no `vllm serve` process of this "
                "user listens there (another user's, or in a container)",
            )
            facts.http = fetch_http(_base(url, port), api_key)
            return [decide(facts)]
        raise DoctorError(
            "no running `vllm serve` found on this machine (pass PID, --port or --url)"
        )
    gpus = src.gpus()
    out = []
    for p in pids:
        facts = gather(src, p)
        if pid is None and facts.error and "gone" in facts.error:
            continue  # exited between the scan and the read
        if http and facts.port:
            key = api_key or _server_key(facts)
            facts.http = fetch_http(_base(url, port or facts.port), key)
        link = _link(facts, gpus)
        out.append(decide(facts, src.host_available(), link))
    if not out:
        raise DoctorError(
            "no running `vllm serve` found on this machine (pass PID, --port or --url)"
        )
    return out


def _base(url: str | None, port: int | None) -> str:
    if url:
        return (url if "://" in url else f"http://{url}").rstrip("/")
    return f"http://127.0.0.1:{port}"


def _port_of(src: ProcSource, pid: int) -> int | None:
    f = ServerFacts(pid=pid)
    from vllm_offload_doctor.inspect.procs import parse_cmdline

    try:
        parse_cmdline(src.cmdline(pid), f)
    except Unreadable:
        return None
    return f.port


def _server_key(facts: ServerFacts) -> str | None:
    """The server's own --api-key (we are its user); VLLM_API_KEY of ours otherwise."""
    argv = facts.cmdline
    for i, a in enumerate(argv):
        if a == "--api-key" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--api-key="):
            return a.split("=", 1)[1]
    return os.environ.get("VLLM_API_KEY") or None


def _link(facts: ServerFacts, gpus: list[Gpu]) -> tuple[int | None, int | None]:
    indices = {p.gpu_index for p in facts.procs if p.gpu_index is not None}
    for g in gpus:
        if g.index in indices:
            return g.pcie_gen, g.pcie_width
    return (gpus[0].pcie_gen, gpus[0].pcie_width) if len(gpus) == 1 else (None, None)


@click.command("inspect", short_help="Is offload in effect on a running vLLM server?")
@click.argument("pid", type=int, required=False)
@click.option("--port", type=click.IntRange(1, 65535), help="The server listening on this port.")
@click.option("--url", help="The server at this URL (its port picks the local process).")
@click.option(
    "--api-key",
    default=None,
    help="Bearer key for /v1/models (default: the server's own --api-key, else VLLM_API_KEY).",
)
@click.option("--no-http", is_flag=True, help="Do not query /v1/models, /version, /metrics.")
@format_option("inspect")
@output_option()
@quiet_option()
@verbose_option("Name on stderr each process read (server and ranks).")
def inspect(
    pid: int | None,
    port: int | None,
    url: str | None,
    api_key: str | None,
    no_http: bool,
    fmt: OutputFormat,
    output: Path | None,
    quiet: bool,
    verbose: bool,
) -> int:
    """Is --cpu-offload-gb in effect on a running vLLM server? (read-only, no restart)

    Reads each rank's shared memory (RssShmem in /proc/PID/status): offloaded weights live in
    shared, pinned host memory. Exit 0 in effect or not requested, 1 ignored, 2 cannot tell.

    \b
    Examples:
      offload-doctor inspect                        # every vllm serve of this user here
      offload-doctor inspect --port 8000 --format json
      offload-doctor inspect 12345                  # the server tree of that pid
      offload-doctor inspect --format json -o inspect.json
    """
    if sum(x is not None for x in (pid, port, url)) > 1:
        raise click.UsageError("give at most one of PID, --port, --url")
    results = inspect_servers(RealSource(), pid, port, url, api_key, http=not no_http)
    if verbose and not quiet:
        for r in results:
            ranks = ", ".join(f"{k.pid} ({k.process})" for k in r.ranks) or "no ranks"
            click.echo(f"offload-doctor: read server pid {r.server.pid}: {ranks}", err=True)
    out = Output(fmt, output, quiet=quiet)
    out.report(lambda f, _color: RENDERERS[f](results), nl=False)
    out.close()
    return max(EXIT[r.verdict] for r in results)


__all__ = ["HttpFacts", "inspect", "inspect_servers"]
