"""Every server answer is bounded (issue 20 item 3): a stub server that answers with a huge
body, a chunked bomb, a trickle or an endless event line costs the doctor a capped number of
bytes and ends at --request-timeout; a server that floods its log has the log cut and named."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import psutil
import pytest
from server_procs import free_port

from vllm_offload_doctor.compare import measure
from vllm_offload_doctor.compare.measure import chat_request, fetch_info
from vllm_offload_doctor.compare.server import ServerProcess

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
OK = b'{"choices": [{"message": {"content": "Paris"}, "finish_reason": "stop"}]}'


def _huge(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("content-length", str(1 << 40))
    h.end_headers()
    block = b"x" * (1 << 20)
    for _ in range(64):  # 64 MiB, past the 16 MiB cap; a real flood would go on
        h.wfile.write(block)


def _chunked(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("transfer-encoding", "chunked")
    h.end_headers()
    block = b"a" * (1 << 20)
    for _ in range(64):
        h.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))


def _trickle(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("content-length", "100000")
    h.end_headers()
    for _ in range(100000):  # a byte every 0.2 s: never idle long enough for a read timeout
        h.wfile.write(b" ")
        h.wfile.flush()
        time.sleep(0.2)


def _endless_line(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("content-type", "text/event-stream")
    h.send_header("transfer-encoding", "chunked")
    h.end_headers()
    block = b"data: " + b"z" * (1 << 20)
    for _ in range(64):  # one event line with no end
        h.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))


def _ok(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("content-length", str(len(OK)))
    h.end_headers()
    h.wfile.write(OK)


@pytest.fixture
def stub() -> Iterator[Callable[[Callable[[BaseHTTPRequestHandler], None]], str]]:
    servers: list[ThreadingHTTPServer] = []

    def serve(answer: Callable[[BaseHTTPRequestHandler], None]) -> str:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self._answer()

            def _answer(self) -> None:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    answer(self)  # the doctor may hang up: what the bound is for

            def log_message(self, *args: object) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        srv.daemon_threads = True
        servers.append(srv)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield serve
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


@pytest.mark.parametrize("answer", [_huge, _chunked, _endless_line])
@pytest.mark.parametrize("stream", [False, True])
def test_a_flooding_answer_is_cut_at_the_cap(
    stub: Callable[..., str], answer: Callable[[BaseHTTPRequestHandler], None], stream: bool
) -> None:
    url = stub(answer) + "/v1/chat/completions"
    before = _rss()
    with httpx.Client(trust_env=False) as client:
        res = chat_request(client, url, {**BODY, "stream": stream}, [], timeout_s=30)
    assert not res.ok and res.error is not None
    assert "MiB" in res.error  # named as too large, not a JSON error after reading it all
    assert _rss() - before < 48 << 20  # the 64 MiB answer was never held whole


def test_a_trickle_ends_at_the_request_timeout(stub: Callable[..., str]) -> None:
    url = stub(_trickle) + "/v1/chat/completions"
    t0 = time.monotonic()
    with httpx.Client(trust_env=False) as client:
        res = chat_request(client, url, BODY, [], timeout_s=2)
    took = time.monotonic() - t0
    assert not res.ok and "not complete after 2 s" in (res.error or "")
    assert took < 4  # main: the trickle kept it until the 100,000 bytes were sent (~5 hours)


def test_fetch_info_is_bounded_too(stub: Callable[..., str]) -> None:
    info = fetch_info(stub(_huge), timeout_s=30)
    assert info.version is None and info.metrics is None
    assert all("MiB" in e for e in info.errors)


def test_a_plain_answer_still_reads(stub: Callable[..., str]) -> None:
    with httpx.Client(trust_env=False) as client:
        res = chat_request(client, stub(_ok) + "/v1/chat/completions", BODY, ["paris"], 10)
    assert res.ok and res.answer == "Paris" and res.matched


def test_a_compressed_answer_is_refused(stub: Callable[..., str]) -> None:
    def gz(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("content-encoding", "gzip")
        h.send_header("content-length", "4")
        h.end_headers()
        h.wfile.write(b"\x1f\x8b\x08\x00")

    with httpx.Client(trust_env=False) as client:
        res = chat_request(client, stub(gz) + "/x", BODY, [], 10)
    assert not res.ok and "compressed" in (res.error or "")


def test_a_server_flooding_its_log_is_cut_and_named(tmp_path: Path) -> None:
    log = tmp_path / "raw" / "server.log"
    flood = "import sys\nline = 'x' * 4095 + '\\n'\nwhile True:\n    sys.stdout.write(line)\n"
    srv = ServerProcess(
        [sys.executable, "-c", flood], log_path=log, host="127.0.0.1", port=free_port(),
        served_model="m", guard=False, max_log_bytes=8 << 20,
    )  # fmt: skip
    srv.start()
    try:
        time.sleep(3)
        assert srv.log_cap.cut_bytes > 0  # cut while the server writes (main: never)
    finally:
        stop = srv.stop()
    assert stop.log_flood is not None and "MB of log in" in stop.log_flood
    text = log.read_bytes()
    assert len(text) < 16 << 20
    assert b"[offload-doctor: " in text and b"bytes of the server's log cut here" in text
    assert measure.MAX_ANSWER_BYTES == 16 << 20  # the cap the flood tests above rely on


# -- --host other than loopback (issue 20 item 8) ---------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_hosts_need_no_warning(host: str) -> None:
    from vllm_offload_doctor.compare.config import CompareConfig

    assert CompareConfig(host=host).exposure() is None


def test_host_reachable_from_the_network_is_warned_and_recorded(tmp_path: Path) -> None:
    # The fake vLLM of the end-to-end tests, bound to every interface.
    import json
    import os
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(repo), "FAKE_VLLM_SCENARIO": "effective"}
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", "compare", "--vllm-cmd",
         str(repo / "tests" / "fake-vllm"), "--host", "0.0.0.0", "--port", str(free_port()),
         "--repeats", "1", "--warmup", "0", "--grace", "3", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    warning = "reachable from every network this machine is on"
    assert proc.stderr.count("offload-doctor: warning: --host 0.0.0.0") == 1, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert warning in report["config"]["exposed"]
    assert warning in (out / "report.md").read_text()


# -- the doctor's own readers of a flooding server's log --------------------------------------
# The figures came from `bench/bench_issue20.py --only log_flood` (a server printing 100 MB/s):
# the phase follower read all that was appended since its last poll at once (hundreds of MB),
# and the live copy chased the growing log, its stop() copying beside its thread (a TypeError
# in the thread) for as long as the server kept writing.

FLOOD_LINE = b"x" * 4095 + b"\n"


def test_the_phase_follower_reads_a_flood_in_bounded_memory(tmp_path: Path) -> None:
    import tracemalloc

    from vllm_offload_doctor.compare.progress import MAX_POLL_BYTES, LogFollower

    log = tmp_path / "server.log"
    follower = LogFollower(log)
    with log.open("wb") as f:
        f.write(FLOOD_LINE * (64 << 20 >> 12))  # 64 MiB since the last poll
        f.write(b"INFO 11-29 15:14:21 [gpu_model_runner.py:1] Starting to load model m...\n")
    tracemalloc.start()
    try:
        phase = follower.poll()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert phase == "loading weights"  # the latest line says the phase
    assert follower.offset == log.stat().st_size
    assert peak < 4 * MAX_POLL_BYTES, f"{peak >> 20} MiB held for one poll"


def test_the_live_log_copy_does_not_chase_a_flooding_server(tmp_path: Path) -> None:
    from vllm_offload_doctor.compare.logmirror import MAX_LAG, LogMirror

    raw, dest = tmp_path / "raw.log", tmp_path / "mode-0.log"
    raw.write_bytes(b"")
    writing = threading.Event()
    writing.set()

    def server() -> None:  # writes far faster than lines can be masked, until told to stop
        with raw.open("ab") as f:
            while writing.is_set():
                f.write(FLOOD_LINE * 256)

    mirror = LogMirror(raw, dest, every_s=0.05).start()
    writer = threading.Thread(target=server, daemon=True)
    writer.start()
    try:
        time.sleep(2)
        stopper = threading.Thread(target=mirror.stop, daemon=True)
        t0 = time.monotonic()
        stopper.start()
        stopper.join(timeout=60)
        took = time.monotonic() - t0
        assert not stopper.is_alive(), "stop() chased the log while the server kept writing"
    finally:
        writing.clear()
        writer.join()
    assert took < 30
    text = dest.read_bytes()
    assert b"bytes of the server's log not copied while it ran" in text
    assert len(text) < raw.stat().st_size and raw.stat().st_size > MAX_LAG


def test_a_flooding_server_is_named_in_the_verdict_and_the_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its log was cut and the stop record said so, but only report.json's stop record.
    import io
    import os

    from vllm_offload_doctor.compare.config import CompareConfig
    from vllm_offload_doctor.compare.render import report_files
    from vllm_offload_doctor.compare.run import CompareRun

    fake = Path(__file__).resolve().parents[1] / "fake-vllm"
    flood = tmp_path / "flood-vllm"
    flood.write_text(
        "#!/bin/sh\n"
        f'{sys.executable} -c \'import sys; sys.stdout.write(("x" * 4095 + "\\n") * 4096)\'\n'
        f'exec {sys.executable} {fake} "$@"\n'
    )  # 16 MiB of log before vLLM's own lines
    flood.chmod(0o755)
    monkeypatch.setitem(ServerProcess.__init__.__kwdefaults__, "max_log_bytes", 4 << 20)
    monkeypatch.setenv("FAKE_VLLM_SCENARIO", "effective")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    progress = io.StringIO()
    cfg = CompareConfig(
        vllm_cmd=[str(flood)], port=free_port(), repeats=1, warmup=0, grace_s=3,
        out_dir=tmp_path / "run",
    )  # fmt: skip
    run = CompareRun(cfg, progress=progress, files=report_files)
    run.execute()
    notes = run.report.verdict.finding.notes
    flooded = [n for n in notes if "MB of log in" in n]
    assert [n.split(":")[0] for n in flooded] == ["offload 0 GiB", "offload 0.5 GiB"], notes
    assert all(n.endswith("what it wrote in between was not read") for n in flooded)
    assert progress.getvalue().count("MB of log in") == 2
    assert os.path.getsize(tmp_path / "run" / "mode-0.log") < 8 << 20
