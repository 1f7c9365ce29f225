"""Issue 20's attacks, each run against an older tree and this one in the same run.

"Before" is `git archive REF` (default fefc042, the code the issue was filed against), "after"
this tree; both run the same attack as a subprocess (their own interpreter, PYTHONPATH on the
tree, a memory cap and a time limit, so a bomb cannot eat the machine), and the figure of each
side is printed as a Markdown table (bench/README.md, "Issue 20"). The server side of compare's
attacks is this tree's tests/fake-vllm (or a stub) for both: the doctor is what differs.

    python bench/bench_issue20.py                     # every attack, both sides
    python bench/bench_issue20.py --only gzip_bomb --only sighup
    python bench/bench_issue20.py --sigkills 30       # SIGKILL at 30 random moments (default 12)

Some attacks need root (a 4 KiB tmpfs for the full TMPDIR); they say so and are skipped
elsewhere. The run takes about 15-25 minutes on a 2-core machine, most of it the old tree's
limits being hit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
FAKE = ROOT / "tests" / "fake-vllm"
sys.path.insert(0, str(ROOT / "tests" / "support"))
from server_procs import MARKER, free_port, kill_marked, marked  # noqa: E402

MB = 1_000_000
MiB = 1 << 20


@dataclass
class Side:
    name: str
    tree: Path
    work: Path


@dataclass
class Run:
    rc: int | None
    wall: float
    rss_mib: float
    out: Path
    err: str
    timed_out: bool
    own_mib: float = 0.0  # sampled peak of the process itself (ru_maxrss counts its children)

    @property
    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def out_bytes(self) -> int:
        return self.out.stat().st_size


def run(
    side: Side,
    argv: list[str],
    *,
    timeout: float,
    mem_gib: float = 4,
    stdin: int | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    doctor: bool = True,
) -> Run:
    """`python -m vllm_offload_doctor ARGV` (or `python ARGV`) on the side's tree: exit status,
    wall time, peak RSS (the doctor and what it waited for), stdout in a file, stderr's tail."""
    full = [sys.executable, *(["-m", "vllm_offload_doctor"] if doctor else []), *argv]
    e = {**os.environ, **(env or {})}
    e["PYTHONPATH"] = os.pathsep.join([str(side.tree), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e["PYTHONDONTWRITEBYTECODE"] = "1"
    fd, out_name = tempfile.mkstemp(dir=side.work, prefix="out-")
    out = Path(out_name)
    cap = int(mem_gib * (1 << 30))

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        default_signals()

    with os.fdopen(fd, "wb") as fout, tempfile.TemporaryFile(dir=side.work) as ferr:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            full, stdin=stdin if stdin is not None else subprocess.DEVNULL, stdout=fout,
            stderr=ferr, env=e, cwd=cwd or side.tree, preexec_fn=limits, start_new_session=True,
        )  # fmt: skip
        fired = threading.Event()

        def kill() -> None:
            fired.set()
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, kill)
        timer.start()
        own = [0]  # the process's own peak RSS (VmHWM), without the servers it starts
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.1):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    for row in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                        if row.startswith("VmHWM:"):
                            own[0] = max(own[0], int(row.split()[1]))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        done.set()
        timer.cancel()
        wall = time.monotonic() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever it left in its session
        ferr.seek(0)
        err = ferr.read().decode(errors="replace")
    return Run(proc.returncode, wall, usage.ru_maxrss / 1024, out, err[-3000:], fired.is_set(),
               own[0] / 1024)  # fmt: skip


def default_signals() -> None:
    """In the child: a shell running this script in the background (`&`, nohup) ignores SIGINT,
    SIGQUIT or SIGHUP, and an ignored signal stays ignored across exec; the doctor must meet
    them as a terminal would send them."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def code(side: Side, source: str, *, timeout: float, mem_gib: float = 4) -> Run:
    return run(side, ["-c", source], timeout=timeout, mem_gib=mem_gib, doctor=False)


def last_line(text: str, width: int = 70) -> str:
    """The last line of `text`, its temporary paths shortened."""
    lines = [x for x in text.strip().splitlines() if x.strip()]
    line = lines[-1] if lines else ""
    line = re.sub(r"/tmp/issue20-\w+/[^ :]*", "…", line).replace("offload-doctor: ", "")
    return line if len(line) <= width else line[: width - 1] + "…"


def secs(r: Run, limit: float) -> str:
    return f"> {limit:g} s (killed)" if r.timed_out else f"{r.wall:.2f} s"


# The module paths of an older layout (fefc042 had no analyze/ package).
IMPORTS = """
import importlib
def mod(name):
    for pkg in ("vllm_offload_doctor.analyze", "vllm_offload_doctor.compare", "vllm_offload_doctor"):
        try:
            return importlib.import_module(f"{pkg}.{name}")
        except ImportError:
            continue
    raise ImportError(name)
"""


# -- secrets ------------------------------------------------------------------------------------


def secrets_masker(side: Side) -> str:
    src = (
        IMPORTS
        + f"""
import sys; sys.path.insert(0, {str(ROOT / "tests" / "support")!r})
from issue20_shapes import CASES
from vllm_offload_doctor.redact import scrub_lines
leaks = [n for n, lines, secrets in CASES if any(s in "\\n".join(scrub_lines(lines)) for s in secrets)]
print(len(leaks), len(CASES), "; ".join(leaks))
"""
    )
    r = code(side, src, timeout=120)
    n, total, _names = r.stdout.split(" ", 2)
    return f"{n} of {total} leak"


def _analyze_outputs_src(cases_expr: str) -> str:
    return (
        IMPORTS
        + f"""
import sys, tempfile, gzip
from pathlib import Path
sys.path.insert(0, {str(ROOT / "tests" / "support")!r})
from click.testing import CliRunner
from vllm_offload_doctor.cli import cli
from issue20_shapes import CASES, FILE_NAMES
HEAD = "INFO 11-29 15:14:20 [api_server.py:1] vLLM API server version 0.11.0"
OOM = "ERROR 11-29 15:14:25 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. ctx "
runner = CliRunner()
leaked = 0
cases = {cases_expr}
tmp = Path(tempfile.mkdtemp())
for i, (name, text, secrets) in enumerate(cases):
    log = tmp / name
    log.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    outs = [runner.invoke(cli, ["analyze", "--format", f, str(log)]).output
            for f in ("text", "json", "jsonl", "markdown")]
    leaked += any(s in o for s in secrets for o in outs)
print(leaked, len(cases))
"""
    )


def secrets_analyze(side: Side) -> str:
    cases = (
        "[(f's{i}.log', f'{HEAD}\\n{OOM}{lines[0]}\\n', secrets) "
        "for i, (n, lines, secrets) in enumerate(CASES) if len(lines) == 1]"
        " + [(name, f'{HEAD}\\n{OOM}\\n', [s]) for name, s in FILE_NAMES]"
    )
    r = code(side, _analyze_outputs_src(cases), timeout=300)
    n, total = r.stdout.split()
    return f"{n} of {total} logs leak (text, json, jsonl, markdown)"


CUT_SHAPES = """[
    ("https://u:Zq9fLw2pXyKd7Tn4Rb8MhunTer@hub.example/x", "Zq9fLw2p"),
    ("hf_Q7vX2kLp9RtZ4mWb8NcYs3Hf6Jd1GqUe5A", "Q7vX2kLp"),
    ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJzdXBwb3J0LTQyIn0.Tk3nS1gN4tUr3_Xq9LmZp2Rv7Yw", "eyJzdWIiOiJz"),
    ("github_pat_11ABCDEFG0aBcDeFgHiJkL_MnOpQrStUvWxYz0123456789AbCdEfGhIj", "0aBcDeFg"),
]"""


def evidence_cut(side: Side) -> str:
    cases = (
        "[(f'c{cut}-{i}.log', f'{HEAD}\\n' + start + 'y' * (cut - len(start) - "
        "secret.index(head) - len(head) - 2) + ' ' + secret + ' tail\\n', [head]) "
        f"for i, (secret, head) in enumerate({CUT_SHAPES}) for cut, start in "
        "((600, OOM), (400, 'ERROR 11-29 15:14:25 [core.py:1] Something odd happened: '))]"
    )
    r = code(side, _analyze_outputs_src(cases), timeout=300)
    n, total = r.stdout.split()
    return f"{n} of {total} logs show the secret's head"


def check_verbose(side: Side) -> str:
    env = {"VLLM_MIRROR_URL": "https://mirror-user:Pa55/w0rdZq9@hf-mirror.acme.corp/x"}
    r = run(side, ["check", "-v"], env=env, timeout=120)
    return "password shown" if "w0rdZq9" in r.stdout else "masked"


def compare_artifacts(side: Side) -> str:
    sys.path.insert(0, str(ROOT / "tests" / "compare"))
    from test_compare_secrets import NEEDLES, SECRETS  # the test's planted values

    out = side.work / "secrets-run"
    env = {"FAKE_VLLM_SCENARIO": "effective", **SECRETS}
    r = run(side, ["compare", "--vllm-cmd", str(FAKE), "--model",
                   "https://bob:Sup3r@S3cr3tPw@models.acme.corp/llama", "--port", str(free_port()),
                   "--repeats", "1", "--warmup", "0", "--grace", "3", "--out", str(out)],
            env=env, timeout=180, cwd=side.work)  # fmt: skip
    texts = [p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()]
    texts.append(r.stdout + r.err)
    found = {n for n in [*NEEDLES, "S3cr3tPw"] for t in texts if n in t}
    return f"{len(found)} of {len(NEEDLES) + 1} secrets found in the artifacts and console"


# -- patterns ------------------------------------------------------------------------------------

NORMALIZE_LINES = {
    "`[` + `a.` x n + ` ERROR`, 256 KiB": '"[" + "a." * (128 << 10) + " ERROR"',
    "`repeated` + blanks, 256 KiB": '"(Worker pid=1) repeated" + " " * (256 << 10) + "x"',
    "`</b ` repeated, 256 KiB": '"ERROR " + "</b " * (64 << 10)',
    "`│` + blanks, 32 KiB": '"│" + " " * (32 << 10) + "x"',
}


def normalize_lines(side: Side, limit: float = 60) -> str:
    parts = []
    for name, expr in NORMALIZE_LINES.items():
        src = (
            IMPORTS
            + f"""
import time
normalize = mod("normalize")
line = {expr}
t = time.perf_counter()
for part in normalize.split_long(line):
    normalize.parse(1, part)
print(time.perf_counter() - t)
"""
        )
        r = code(side, src, timeout=limit)
        figure = f"> {limit:g} s" if r.timed_out else f"{float(r.stdout.split()[-1]):.3g} s"
        parts.append(f"{name}: {figure}")
    return "; ".join(parts)


RULE = """id = "TST001"
title = "A test rule"
severity = "error"
category = "crash_other"
precedence = 99
keywords = ["boom"]
patterns = ['{pattern}']
message = "{message}"
remedy = "Stop the boom."
links = ["https://example.com/boom"]
"""


def _rules(side: Side, name: str, text: str) -> Path:
    d = side.work / f"rules-{name}"
    d.mkdir(exist_ok=True)
    (d / "TST001-test.toml").write_text(text)
    return d


def _boom_log(side: Side, lines: int = 1) -> Path:
    log = side.work / "boom.log"
    log.write_text(
        "".join(f"ERROR 11-29 15:14:25 [x.py:1] boom happened {i}\n" for i in range(lines))
    )
    return log


def compile_bomb(side: Side) -> str:
    rules = _rules(side, "bomb", RULE.format(pattern="(?:(?:a{1000}){1000}){1000}", message="x"))
    r = run(side, ["analyze", "--rules", str(rules), str(_boom_log(side))], timeout=60, mem_gib=3)
    what = (
        "MemoryError at the 3 GiB cap"
        if (r.rc is not None and r.rc < 0) or "MemoryError" in r.err
        else f"exit {r.rc}"
    )
    return f"{secs(r, 60)}, {r.rss_mib:.0f} MiB, {what}: {last_line(r.err)}"


def width_bomb(side: Side) -> str:
    rules = _rules(
        side, "width", RULE.format(pattern=r"boom happened \d+", message="{phase:>100000000}")
    )
    r = run(side, ["analyze", "--rules", str(rules), str(_boom_log(side))], timeout=120)
    return f"{r.out_bytes():,} bytes printed, {r.rss_mib:.0f} MiB, {secs(r, 120)}"


def toml_nesting(side: Side) -> str:
    rules = _rules(
        side,
        "nest",
        RULE.format(pattern="boom", message="x") + "x = " + "[" * 100000 + "]" * 100000 + "\n",
    )
    r = run(side, ["analyze", "--rules", str(rules), str(_boom_log(side))], timeout=60)
    tb = "RecursionError" in r.err
    return f"exit {r.rc}" + (" (RecursionError)" if tb else f": {last_line(r.err)}")


def backtracking(side: Side) -> str:
    rules = _rules(side, "slow", RULE.format(pattern=r"boom (.*)(.*)\1\2Z", message="x"))
    log = side.work / "slow.log"
    log.write_text(
        "".join(f"ERROR 11-29 15:14:25 [x.py:1] boom {i} {'word ' * 600}end\n" for i in range(200))
    )
    r = run(side, ["analyze", "--rules", str(rules), str(log)], timeout=120)
    return f"200 distinct lines: {secs(r, 120)}"


# -- server answers ------------------------------------------------------------------------------

STUB = (
    IMPORTS
    + """
import sys, threading, time, json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import httpx
measure = mod("measure")
kind = sys.argv[1]
def answer(h):
    if kind == "huge":
        h.send_response(200); h.send_header("content-length", str(1 << 40)); h.end_headers()
        block = b'{"x": "' + b"x" * (1 << 20)
        for _ in range(1024):
            h.wfile.write(block)
    elif kind == "chunked":
        h.send_response(200); h.send_header("transfer-encoding", "chunked"); h.end_headers()
        block = b"a" * (1 << 20)
        for _ in range(1024):
            h.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(block), block))
    else:
        h.send_response(200); h.send_header("content-length", "100000"); h.end_headers()
        for _ in range(100000):
            h.wfile.write(b" "); h.wfile.flush(); time.sleep(0.2)
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            answer(self)
        except (BrokenPipeError, ConnectionResetError):
            pass
    def log_message(self, *a):
        pass
srv = ThreadingHTTPServer(("127.0.0.1", 0), H); srv.daemon_threads = True
threading.Thread(target=srv.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{srv.server_address[1]}/v1/chat/completions"
body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
t = time.monotonic()
with httpx.Client(trust_env=False) as c:
    res = measure.chat_request(c, url, body, [], 2 if kind == "trickle" else 30)
print(json.dumps({"s": time.monotonic() - t, "error": res.error}))
"""
)


def server_answers(side: Side) -> str:
    parts = []
    for kind, limit in (("huge", 120), ("chunked", 120), ("trickle", 30)):
        script = side.work / "stub.py"
        script.write_text(STUB)
        r = run(side, [str(script), kind], timeout=limit, mem_gib=4, doctor=False)
        if r.timed_out:
            what = f"> {limit} s, killed"
        elif r.rc:
            what = f"exit {r.rc} ({last_line(r.err, 40)})"
        else:
            res = json.loads(r.stdout)
            what = f"{res['s']:.1f} s, {(res['error'] or 'ok')[:40]}"
        label = {
            "huge": "1 GiB body",
            "chunked": "1 GiB chunked",
            "trickle": "trickle, --request-timeout 2",
        }
        parts.append(f"{label[kind]}: {r.rss_mib:.0f} MiB, {what}")
    return "; ".join(parts)


FLOOD = """#!/bin/sh
{python} -c '
import sys, time
line = b"x" * 4095 + b"\\n"
block = line * 256
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    t = time.monotonic()
    for _ in range(100):  # 100 MB/s
        sys.stdout.buffer.write(block)
    sys.stdout.flush()
    time.sleep(max(0, 1 - (time.monotonic() - t)))
' &
exec {python} {fake} "$@"
"""


def log_flood(side: Side, seconds: int = 10, limit: float = 300) -> str:
    script = side.work / "flood-vllm"
    script.write_text(FLOOD.format(python=sys.executable, fake=FAKE, seconds=seconds))
    script.chmod(0o755)
    out = side.work / "flood-run"
    marker = uuid.uuid4().hex
    env = {"FAKE_VLLM_SCENARIO": "effective", MARKER: marker, "TMPDIR": str(side.work)}
    r = run(side, ["compare", "--vllm-cmd", str(script), "--port", str(free_port()), "--repeats", "1",
                   "--warmup", "0", "--grace", "3", "--out", str(out), "--timeout", "60"],
            env=env, timeout=limit, mem_gib=6, cwd=side.work)  # fmt: skip
    kill_marked(marker)
    saved = sum(p.stat().st_size for p in out.glob("mode-*.log")) if out.is_dir() else 0
    named = "named" if "MB of log in" in (r.stdout + r.err + _report_text(out)) else "not named"
    return (f"{secs(r, limit)}, doctor {r.own_mib:.0f} MiB, mode logs {saved / MB:.0f} MB, "
            f"flood {named}")  # fmt: skip


def _report_text(out: Path) -> str:
    with contextlib.suppress(OSError):
        return (out / "report.json").read_text()
    return ""


# -- inputs -------------------------------------------------------------------------------------


def stdin_zero(side: Side) -> str:
    with open("/dev/zero", "rb") as zero:
        r = run(side, ["analyze", "-"], stdin=zero.fileno(), timeout=60)
    return f"{secs(r, 60)}" + ("" if r.timed_out else f", exit {r.rc}: {last_line(r.err)}")


def _bomb(path: Path, line: bytes, mib: int) -> None:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = line * (MiB // len(line))
    with path.open("wb") as f:
        for _ in range(mib):
            f.write(c.compress(chunk))
        f.write(c.flush())


def gzip_bomb(side: Side, limit: float = 120) -> str:
    bomb = side.work / "bomb.log.gz"
    _bomb(bomb, b"ERROR 11-29 15:14:25 [core.py:1] RuntimeError: CUDA error: out of memory\n", 256)
    r = run(side, ["analyze", "--max-bytes", "0", "--format", "json", str(bomb)], timeout=limit)
    return f"{r.rss_mib:.0f} MiB peak, {secs(r, limit)} (256 MiB of ERROR lines, {bomb.stat().st_size // 1024} KiB gzipped)"


def _file_wall(side: Side, path: Path, limit: float, fmt: str = "json") -> Run:
    return run(side, ["analyze", "--format", fmt, str(path)], timeout=limit)


def ansi_lines(side: Side) -> str:
    rng = random.Random(7)
    finals = [chr(c) for c in range(0x40, 0x7F)]
    pure, coloured = side.work / "ansi.log", side.work / "ansi-error.log"
    with pure.open("w") as f:
        n = 0
        while n < 4_600_000:
            seq = "".join(
                "\x1b[" + ";".join(str(rng.randint(0, 255)) for _ in range(rng.randint(0, 4)))
                + rng.choice(finals) for _ in range(rng.randint(1, 12))
            )  # fmt: skip
            f.write(seq + "\n")
            n += len(seq) + 1
    line = "\x1b[1;31mERROR\x1b[0m\n"
    coloured.write_text(line * (4_600_000 // len(line)))
    a, b = _file_wall(side, pure, 60), _file_wall(side, coloured, 60)
    return f"escapes only: {secs(a, 60)}; coloured `ERROR` lines: {secs(b, 60)} (4.6 MB each, start-up included)"


CRAFTED_16K = {
    "spaces": lambda n: "Error" + " " * n + "x",
    "quotes": lambda n: "Error " + '"' * n,
    "Bearer": lambda n: "Error " + "Bearer " * (n // 7),
}


def crafted_16k(side: Side) -> str:
    parts = []
    for name, make in CRAFTED_16K.items():
        line = make(16 << 10)
        path = side.work / f"crafted-{name}.log"
        path.write_text((line + "\n") * (2 * MB // len(line)))
        r = _file_wall(side, path, 60)
        parts.append(f"{name} {secs(r, 60)}")
    return "; ".join(parts) + " (2 MB each, start-up included)"


def million_lines(side: Side, millions: float = 1.0) -> str:
    path = side.work / "million.log"
    with path.open("w") as fh:
        for i in range(int(millions * 1_000_000)):
            fh.write(
                f"ERROR 11-29 15:14:25 [core.py:1] RuntimeError: failure {i:x} at step {i * 7}\n"
            )
    r = _file_wall(side, path, 600)
    return f"{r.wall / (path.stat().st_size / MB):.2f} s/MB ({path.stat().st_size / MB:.0f} MB, {secs(r, 600)})"


def batch(side: Side, files: int = 10_000) -> str:
    sys.path.insert(0, str(HERE.parent))
    from bench_analyze import DEFAULT_CORPUS
    from bench_batch import build  # the logs bench_batch.py times

    folder = side.work / "batch"
    folder.mkdir(exist_ok=True)
    build(folder, files, DEFAULT_CORPUS)
    r = run(side, ["analyze", "--format", "json", str(folder)], timeout=600)
    return f"{r.rss_mib:.0f} MiB peak, {secs(r, 600)}"


# -- compare: links, signals, disk, exposure -----------------------------------------------------


def compare_argv(out: Path, *more: str) -> list[str]:
    return ["compare", "--vllm-cmd", str(FAKE), "--port", str(free_port()), "--repeats", "1",
            "--warmup", "0", "--grace", "3", "--out", str(out), *more]  # fmt: skip


def _popen(side: Side, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    e = {**os.environ, **env, "PYTHONPATH": str(side.tree), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.Popen([sys.executable, "-m", "vllm_offload_doctor", *argv], env=e,
                            cwd=side.work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=default_signals)  # fmt: skip


def _two_servers_up(marker: str, seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        cmdlines = []
        for p in marked(marker):
            with contextlib.suppress(OSError):
                cmdlines.append(Path(f"/proc/{p.pid}/cmdline").read_bytes())
        if any(b"--cpu-offload-gb\x000.5" in c for c in cmdlines):
            return True
        time.sleep(0.1)
    return False


def signals(side: Side) -> str:
    parts = []
    for sig in (signal.SIGHUP, signal.SIGQUIT):
        tmp = side.work / f"tmp-{sig.name}"
        tmp.mkdir()
        out = side.work / f"sig-{sig.name}"
        marker = uuid.uuid4().hex
        proc = _popen(side, compare_argv(out, "--timeout", "60"),
                      {"FAKE_VLLM_SCENARIO": "hang", MARKER: marker, "TMPDIR": str(tmp)})  # fmt: skip
        up = _two_servers_up(marker)
        time.sleep(1)
        proc.send_signal(sig)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        time.sleep(1)
        left = kill_marked(marker)
        report = json.loads(_report_text(out) or "{}")
        statuses = ",".join(m["status"] for m in report.get("modes", []))
        parts.append(
            f"{sig.name}: exit {proc.returncode}, lock {'left' if (out / '.offload-doctor.lock').exists() else 'removed'}, "
            f"raw folder {'left' if any(tmp.iterdir()) else 'removed'}, report [{statuses}], "
            f"{len(left)} processes left" + ("" if up else " (second server never seen)")
        )
    return "; ".join(parts)


def escapee(side: Side) -> str:
    pidfile = side.work / "escapees"
    out = side.work / "escape-run"
    marker = uuid.uuid4().hex
    env = {"FAKE_VLLM_SCENARIO": "effective", MARKER: marker, "FAKE_VLLM_ESCAPE": str(pidfile)}
    run(side, compare_argv(out), env=env, timeout=120, cwd=side.work)
    time.sleep(1)
    pids = [int(x) for x in pidfile.read_text().split()] if pidfile.exists() else []
    alive = [p for p in pids if Path(f"/proc/{p}").exists()]
    for p in alive:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
    kill_marked(marker)
    return f"{len(alive)} of {len(pids)} setsid escapees alive after the run"


def sigkills(side: Side, n: int, seed: int = 20) -> str:
    """SIGKILL at `n` moments drawn uniformly over a whole run (timed first on this side)."""
    rng = random.Random(seed)
    whole = run(side, compare_argv(side.work / "whole"), env={"FAKE_VLLM_SCENARIO": "effective"},
                timeout=120, cwd=side.work).wall  # fmt: skip
    missing = unreadable = lock = raw = servers = 0
    for i in range(n):
        tmp = side.work / f"kill-tmp-{i}"
        tmp.mkdir()
        out = side.work / f"kill-{i}"
        marker = uuid.uuid4().hex
        proc = _popen(side, compare_argv(out),
                      {"FAKE_VLLM_SCENARIO": "effective", MARKER: marker, "TMPDIR": str(tmp)})  # fmt: skip
        time.sleep(rng.uniform(0.05, whole))
        proc.kill()
        proc.communicate()
        deadline = time.monotonic() + 10  # the guard's SIGTERM, wait, SIGKILL
        while marked(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        servers += bool(kill_marked(marker))
        if out.is_dir():
            try:
                json.loads((out / "report.json").read_text())
            except FileNotFoundError:
                missing += 1
            except ValueError:
                unreadable += 1
            lock += (out / ".offload-doctor.lock").exists()
        raw += any(tmp.iterdir())
    return (f"{n} kills over a {whole:.1f} s run: report.json missing {missing}, unreadable "
            f"{unreadable}; lock file left {lock}; raw-log folder left {raw}; server left "
            f"{servers}")  # fmt: skip


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[bool]:
    where.mkdir(exist_ok=True)
    ok = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, check=False
    ).returncode == 0  # fmt: skip
    try:
        yield ok
    finally:
        if ok:
            subprocess.run(["umount", "-l", str(where)], check=False)


def full_tmpdir(side: Side) -> str:
    parts = []
    extra = side.work / "extra.log"
    extra.write_text("".join(f"INFO line {i} {'x' * 1000}\n" for i in range(110)))
    for size, label in (("4k", "4 KiB tmpfs"), ("72k", "filled by the baseline's log")):
        with tmpfs(side.work / f"tmpfs-{size}", size) as ok:
            if not ok:
                return "needs root to mount a tmpfs: not measured"
            out = side.work / f"full-{size}"
            marker = uuid.uuid4().hex
            env = {"FAKE_VLLM_SCENARIO": "effective", MARKER: marker,
                   "TMPDIR": str(side.work / f"tmpfs-{size}"), "FAKE_VLLM_EXTRA_LOG": str(extra)}  # fmt: skip
            r = run(side, compare_argv(out), env=env, timeout=120, cwd=side.work)
            kill_marked(marker)
            verdict = next((x for x in r.stdout.splitlines() if x.startswith("Verdict")), "")
            said = verdict or last_line(r.err)
            parts.append(f'{label}: {secs(r, 120)}, exit {r.rc}, "{said[:90]}"')
    return "; ".join(parts)


def exposure(side: Side) -> str:
    out = side.work / "exposed"
    r = run(side, compare_argv(out, "--host", "0.0.0.0"), env={"FAKE_VLLM_SCENARIO": "effective"},
            timeout=120, cwd=side.work)  # fmt: skip
    warned = "reachable from every network" in r.err
    recorded = "reachable from every network" in _report_text(out)
    return f"warning {'printed' if warned else 'none'}, report {'records it' if recorded else 'silent'}"


def planted_links(side: Side) -> str:
    victim = side.work / "victim.txt"
    victim.write_text("precious\n")
    out = side.work / "lock-out"
    out.mkdir()
    (out / ".offload-doctor.lock").symlink_to(victim)
    r = run(
        side, compare_argv(out), env={"FAKE_VLLM_SCENARIO": "effective"}, timeout=120, cwd=side.work
    )
    lock = "victim overwritten" if victim.read_text() != "precious\n" else f"refused (exit {r.rc})"
    real = side.work / "someone-else"
    real.mkdir()
    (side.work / "link-out").symlink_to(real)
    r2 = run(side, compare_argv(side.work / "link-out"), env={"FAKE_VLLM_SCENARIO": "effective"},
             timeout=120, cwd=side.work)  # fmt: skip
    into = (
        f"{len(list(real.iterdir()))} files written into the link's target"
        if any(real.iterdir())
        else f"refused (exit {r2.rc})"
    )
    return f"planted lock link: {lock}; --out a link: {into}"


ATTACKS: dict[str, tuple[str, Callable[..., str]]] = {
    "secrets_masker": ("issue 20's 30 named secret shapes, through the masker", secrets_masker),
    "secrets_analyze": (
        "the single-line shapes and 3 file names, through analyze",
        secrets_analyze,
    ),
    "evidence_cut": ("a secret across the 400/600 evidence cut (4 shapes x 2 cuts)", evidence_cut),
    "compare_artifacts": (
        "compare's artifacts: URL passwords with @ and /, %-encoded, terse names",
        compare_artifacts,
    ),
    "check_verbose": ("`check -v`, a URL password holding '/'", check_verbose),
    "normalize": ("normalize.py on the crafted lines", normalize_lines),
    "compile_bomb": ("--rules compile bomb `(?:(?:a{1000}){1000}){1000}`", compile_bomb),
    "width_bomb": ("format-width bomb `{phase:>100000000}`", width_bomb),
    "toml_nesting": ("100,000 nested TOML arrays in a rule file", toml_nesting),
    "backtracking": ("a backtracking user pattern on every distinct line", backtracking),
    "server_answers": ("huge, chunked and trickling server answers", server_answers),
    "log_flood": ("a server printing 100 MB/s of log for 10 s per mode", log_flood),
    "stdin_zero": ("`analyze - < /dev/zero`", stdin_zero),
    "gzip_bomb": ("`--max-bytes 0` on a gzip bomb", gzip_bomb),
    "ansi": ("4.6 MB of ANSI escape lines", ansi_lines),
    "crafted_16k": ("2 MB of 16 KiB lines of `Error` + blanks, quotes, `Bearer`", crafted_16k),
    "million": ("a million distinct exception lines", million_lines),
    "batch": ("10,000 small logs, JSON", batch),
    "signals": ("SIGHUP and SIGQUIT while the second server starts", signals),
    "escapee": ("a server child that leaves with setsid (fake-vllm FAKE_VLLM_ESCAPE)", escapee),
    "sigkills": ("SIGKILL of compare at random moments", sigkills),
    "full_tmpdir": ("a full TMPDIR (raw server logs)", full_tmpdir),
    "exposure": ("`--host 0.0.0.0`", exposure),
    "links": ("a planted `.offload-doctor.lock` link, an --out that is a link", planted_links),
}
AFTER_ONLY = {"million"}  # being reworked elsewhere: today's figure only


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ref", default="fefc042", help="the 'before' tree (default fefc042)")
    ap.add_argument("--only", action="append", choices=sorted(ATTACKS), help="run these attacks")
    ap.add_argument("--sigkills", type=int, default=12, help="random SIGKILL moments per side")
    ap.add_argument("--side", choices=("before", "after"), help="measure one side only")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="issue20-"))
    old = base / "tree"
    old.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.ref, "vllm_offload_doctor", "rules"],
                             capture_output=True, check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    sides = [s for s in (("before", old), ("after", ROOT)) if args.side in (None, s[0])]
    results: dict[str, dict[str, str]] = {}
    try:
        for name in args.only or list(ATTACKS):
            _title, attack = ATTACKS[name]
            results[name] = {}
            for side_name, tree in sides:
                if side_name == "before" and name in AFTER_ONLY:
                    results[name][side_name] = "-"
                    continue
                work = base / f"{name}-{side_name}"
                work.mkdir()
                side = Side(side_name, tree, work)
                t0 = time.monotonic()
                try:
                    kw = {"n": args.sigkills} if name == "sigkills" else {}
                    figure = attack(side, **kw)
                except Exception as exc:  # one attack's failure must not lose the others
                    figure = f"bench error: {type(exc).__name__}: {exc}"
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                results[name][side_name] = figure
                print(
                    f"[{time.monotonic() - t0:6.1f} s] {name} {side_name}: {figure}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"| attack | before ({args.ref}) | after (this tree) |\n|---|---|---|")
    for name, figs in results.items():
        print(f"| {ATTACKS[name][0]} | {figs.get('before', '')} | {figs.get('after', '')} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
