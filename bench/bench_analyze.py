"""Benchmark `offload-doctor analyze` on a large realistic log against `grep -E -c`.

Builds a log of --size-mb MB (default 1024) in a temp dir from real line shapes: the
start-up of /work/shared/corpus/H-003.log (vLLM 0.25, offload effective), then
uvicorn access lines, `Engine 000: Avg prompt throughput` stats lines, request logs
and an occasional WARNING, ending with a CUDA OOM traceback while serving. Then it
measures, in the same run:

* `offload-doctor analyze --format json FILE`: wall time, MB/s, peak RSS, with bytecode
  cached as an installed package has it;
* `grep -F -c` with 10 keywords a support engineer would grep for (issue 17's baseline),
  alternated with analyze --runs times (default 3), medians compared;
* `grep -E -c` with the engine's prefilter keywords (declared fact words + every
  rule's keywords) as one ERE alternation: MB/s, and the ratio analyze/grep;
* `offload-doctor --version`: median wall time of 10 runs.

Targets: analyze >= grep-10's throughput (issue 17), >= 1/3 of grep -E's, peak RSS < 100 MB,
`--version` < 150 ms.

    python bench/bench_analyze.py [--size-mb 1024] [--runs 3] [--keep] [--corpus DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
DEFAULT_CORPUS = HERE.parents[2] / "shared" / "corpus"
MB = 1_000_000

OOM_TAIL = """\
(EngineCore pid=1802) ERROR 11-29 18:40:12 [core.py:842] EngineCore encountered a fatal error.
(EngineCore pid=1802) ERROR 11-29 18:40:12 [core.py:842] Traceback (most recent call last):
(EngineCore pid=1802) ERROR 11-29 18:40:12 [core.py:842]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 833, in run_engine_core
(EngineCore pid=1802) ERROR 11-29 18:40:12 [core.py:842]     engine_core.run_busy_loop()
(EngineCore pid=1802) ERROR 11-29 18:40:12 [core.py:842]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 860, in run_busy_loop
(EngineCore pid=1802) ERROR 11-29 18:40:12 [core.py:842]     self._process_engine_step()
(EngineCore pid=1802) ERROR 11-29 18:40:12 [core.py:842]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/sample/sampler.py", line 120, in forward
(EngineCore pid=1802) ERROR 11-29 18:40:12 [core.py:842]     logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
(EngineCore pid=1802) ERROR 11-29 18:40:12 [core.py:842]                               ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(EngineCore pid=1802) ERROR 11-29 18:40:12 [core.py:842] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 0 has a total capacity of 139.72 GiB of which 1.05 GiB is free. Including non-PyTorch memory, this process has 138.66 GiB memory in use.
(APIServer pid=1725) ERROR 11-29 18:40:12 [async_llm.py:480] AsyncLLM output_handler failed.
(APIServer pid=1725) ERROR 11-29 18:40:12 [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
(APIServer pid=1725) INFO:     Shutting down
(APIServer pid=1725) INFO:     Application shutdown complete.
(APIServer pid=1725) INFO:     Finished server process [1725]
"""

PROMPTS = (
    "Explain the difference between a process and a thread.",
    "Write a haiku about GPUs.",
    "Summarise the following text in three sentences: The quick brown fox jumps over the lazy dog.",
    "Translate to French: where is the train station?",
    "Give me a Python function that reverses a linked list.",
)


def startup_lines(corpus: Path) -> list[str]:
    src = corpus / "H-003.log"
    if src.is_file():
        lines = src.read_text(encoding="utf-8", errors="replace").splitlines()
        for i, line in enumerate(lines):
            if "Application startup complete" in line:
                return lines[: i + 1]
        return lines
    # Fallback when the corpus is absent: the shape of a 0.25 start-up.
    return [
        "(APIServer pid=1725) INFO 11-29 15:18:46 [utils.py:253] non-default args: "
        "{'model_tag': '/tmp/qwen3-0.6b-random', 'cpu_offload_gb': 0.5}",
        "(EngineCore pid=1802) INFO 11-29 15:19:10 [gpu_model_runner.py:3000] Starting to load model "
        "/tmp/qwen3-0.6b-random...",
        "(EngineCore pid=1802) INFO 11-29 15:19:20 [offloader.py:50] Offloader set to UVAOffloader",
        "(EngineCore pid=1802) INFO 11-29 15:19:20 [uva.py:80] Total CPU offloaded parameters: 0.51 GBs",
        "(EngineCore pid=1802) INFO 11-29 15:19:21 [gpu_model_runner.py:3100] Model loading took 0.62 "
        "GiB memory and 9.1 seconds",
        "(APIServer pid=1725) INFO:     Application startup complete.",
    ]


def serving_chunk(rng: random.Random, minute: int) -> str:
    """About 1 MB of serving-time lines."""
    out: list[str] = []
    size = 0
    second = 0
    while size < MB:
        ts = f"11-29 {15 + minute // 60 % 9:02d}:{minute % 60:02d}:{second % 60:02d}"
        kind = rng.random()
        if kind < 0.70:
            path = rng.choice(
                (
                    "/v1/chat/completions",
                    "/v1/chat/completions",
                    "/v1/completions",
                    "/metrics",
                    "/health",
                )
            )
            verb = "GET" if path in ("/metrics", "/health") else "POST"
            line = (
                f"(APIServer pid=1725) INFO:     10.0.{rng.randrange(256)}.{rng.randrange(256)}:"
                f'{rng.randrange(1024, 65535)} - "{verb} {path} HTTP/1.1" 200 OK'
            )
        elif kind < 0.80:
            line = (
                f"(APIServer pid=1725) INFO {ts} [loggers.py:257] Engine 000: Avg prompt "
                f"throughput: {rng.uniform(0, 9000):.1f} tokens/s, Avg generation throughput: "
                f"{rng.uniform(0, 3000):.1f} tokens/s, Running: {rng.randrange(64)} reqs, "
                f"Waiting: {rng.randrange(8)} reqs, GPU KV cache usage: "
                f"{rng.uniform(0, 99):.1f}%, Prefix cache hit rate: {rng.uniform(0, 80):.1f}%"
            )
        elif kind < 0.999:
            rid = f"chatcmpl-{rng.getrandbits(128):032x}"
            line = (
                f"(APIServer pid=1725) INFO {ts} [logger.py:71] Received request {rid}: "
                f"prompt: '<|im_start|>user\\n{rng.choice(PROMPTS)}<|im_end|>\\n"
                "<|im_start|>assistant\\n', params: SamplingParams(n=1, presence_penalty=0.0, "
                f"frequency_penalty=0.0, repetition_penalty=1.0, temperature={rng.random():.2f}, "
                f"top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[], max_tokens="
                f"{rng.randrange(16, 2048)}, min_tokens=0), lora_request: None."
            )
        else:
            line = (
                f"(EngineCore pid=1802) WARNING {ts} [scheduler.py:1500] Sequence group "
                f"{rng.randrange(10**6)} is preempted by PreemptionMode.RECOMPUTE because "
                "there is not enough KV cache space."
            )
        out.append(line)
        size += len(line) + 1
        second += 1
    return "\n".join(out) + "\n"


def build_log(path: Path, size_mb: int, corpus: Path, seed: int = 1) -> int:
    rng = random.Random(seed)
    chunks = [serving_chunk(rng, m) for m in range(16)]  # reused, so building is I/O-bound
    target = size_mb * MB
    with path.open("w", encoding="utf-8") as f:
        f.write("\n".join(startup_lines(corpus)) + "\n")
        written = f.tell()
        i = 0
        while written < target:
            chunk = chunks[i % len(chunks)]
            f.write(chunk)
            written += len(chunk)
            i += 1
        f.write(OOM_TAIL)
    return path.stat().st_size


def prefilter_ere() -> tuple[str, int]:
    from vllm_offload_doctor.analyze.engine import Engine

    words = [w for w, _ in Engine().prefilter_words()]  # icase words as declared (lower case)
    # ERE escaping: everything that is not a word character is bracketed or backslashed.
    return "|".join(re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", w) for w in words), len(words)


def built(build, log: Path, size_mb: int, corpus: Path) -> int:
    """`build(log, size_mb, corpus)`, its time on stderr; returns the log's size."""
    t0 = time.perf_counter()
    size = build(log, size_mb, corpus)
    print(f"built {log} ({size / MB:.0f} MB) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return size


def grep_words(log: Path, workdir: Path) -> tuple[float, str, int, int]:
    """The baseline: `grep -F -c -f WORDS log`, WORDS the engine's prefilter words, the log in the
    page cache first. (wall seconds, stdout, return code, word count)."""
    from vllm_offload_doctor.analyze.engine import Engine

    words = [w for w, _ in Engine().prefilter_words()]
    words_file = workdir / "words.txt"
    words_file.write_text("\n".join(words) + "\n", encoding="utf-8")
    subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL, check=True)  # warm the cache
    wall, _rss, out, rc = timed(["grep", "-F", "-c", "-f", str(words_file), str(log)])
    return wall, out, rc, len(words)


def installed_env() -> dict[str, str]:
    """This environment, with bytecode cached as an installed package has it:
    PYTHONDONTWRITEBYTECODE would time Python's compiler on every run (~50 ms)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str, int]:
    """Wall seconds, peak RSS (KiB), stdout, return code of one command."""
    time_bin = shutil.which("time") or (
        "/usr/bin/time" if os.path.exists("/usr/bin/time") else None
    )
    if time_bin:
        with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
            t0 = time.perf_counter()
            proc = subprocess.run(
                [time_bin, "-v", "-o", tf.name, *cmd], capture_output=True, text=True, env=env
            )
            wall = time.perf_counter() - t0
            m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", Path(tf.name).read_text())
            if m:
                return wall, int(m.group(1)), proc.stdout, proc.returncode
    # Fallback: a fresh interpreter runs the command so RUSAGE_CHILDREN holds only it.
    probe = (
        "import resource, subprocess, sys, time\n"
        "t = time.perf_counter(); p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "w = time.perf_counter() - t\n"
        "sys.stdout.write(p.stdout)\n"
        "print(f'\\n@@ {w} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss} {p.returncode}')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, *cmd], capture_output=True, text=True, env=env
    )
    body, _, tail = proc.stdout.rpartition("\n@@ ")
    wall_s, rss, rc = tail.split()
    return float(wall_s), int(rss), body, int(rc)


def print_rows(rows: list[tuple[str, str, str]]) -> None:
    """The figures as aligned (name, value, note) columns."""
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    for name, value, note in rows:
        print(f"{name:<{w0}}  {value:<{w1}}  {note}")


def doctor_cmd() -> list[str]:
    exe = shutil.which("offload-doctor")
    return [exe] if exe else [sys.executable, "-m", "vllm_offload_doctor"]


# What a support engineer greps a serving log for: issue 17's baseline ("grep -F -c with 10
# keywords"), far fewer words than the engine looks for.
GREP10 = (
    "ERROR", "CRITICAL", "Traceback", "Error:", "Exception", "out of memory", "OutOfMemory",
    "Killed", "offload", "KV cache",
)  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--size-mb", type=int, default=1024, help="size of the generated log (default 1024)"
    )
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument(
        "--dir", type=Path, default=None, help="where to build the log (default: a temp dir)"
    )
    ap.add_argument(
        "--runs", type=int, default=3, help="runs of analyze and of grep-10, alternated (median)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the generated log")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-analyze-", dir=args.dir))
    log = workdir / "big-serving.log"
    try:
        size = built(build_log, log, args.size_mb, args.corpus)

        # Warm the page cache so neither side pays for the disk.
        subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL, check=True)

        ere, n_words = prefilter_ere()
        grep_wall, _grep_rss, grep_out, grep_rc = timed(["grep", "-E", "-c", ere, str(log)])
        if grep_rc not in (0, 1):
            print(f"grep failed (rc {grep_rc})", file=sys.stderr)
        ten = workdir / "grep10.txt"
        ten.write_text("\n".join(GREP10) + "\n", encoding="utf-8")
        env = installed_env()
        small = workdir / "small.log"
        small.write_text(OOM_TAIL, encoding="utf-8")
        subprocess.run([*doctor_cmd(), "analyze", str(small)], capture_output=True, env=env)
        # Alternated, so a noisy neighbour slows both; the medians are compared.
        g10_walls, an_walls = [], []
        for _ in range(max(1, args.runs)):
            g10_wall, _rss, g10_out, _rc = timed(["grep", "-F", "-c", "-f", str(ten), str(log)])
            g10_walls.append(g10_wall)
            an_wall, an_rss, an_out, an_rc = timed(
                [*doctor_cmd(), "analyze", "--format", "json", str(log)], env
            )
            an_walls.append(an_wall)
        g10_wall, an_wall = statistics.median(g10_walls), statistics.median(an_walls)
        try:
            verdict = json.loads(an_out)["results"][0]["verdict"]["category"]
        except (ValueError, KeyError, IndexError):
            verdict = f"? (rc {an_rc})"

        version_times = []
        for _ in range(10):
            t = time.perf_counter()
            subprocess.run([*doctor_cmd(), "--version"], capture_output=True, check=True, env=env)
            version_times.append(time.perf_counter() - t)
        version_ms = statistics.median(version_times) * 1000

        an_mbs = size / MB / an_wall
        grep_mbs = size / MB / grep_wall
        g10_mbs = size / MB / g10_wall
        ratio = an_mbs / grep_mbs
        rows = [
            ("log size", f"{size / MB:.0f} MB", ""),
            (
                "grep -E -c (prefilter keywords)",
                f"{grep_wall:.2f} s, {grep_mbs:.0f} MB/s",
                f"{grep_out.strip()} matching lines, {n_words} keywords",
            ),
            (
                "grep -F -c (10 keywords)",
                f"{g10_wall:.2f} s, {g10_mbs:.0f} MB/s",
                f"median of {len(g10_walls)}; {g10_out.strip()} matching lines: "
                + ", ".join(GREP10),
            ),
            (
                f"analyze --format json (median of {len(an_walls)})",
                f"{an_wall:.2f} s, {an_mbs:.1f} MB/s",
                f"verdict {verdict}, rc {an_rc}",
            ),
            (
                "analyze / grep throughput",
                f"{ratio:.3f}",
                "target >= 0.333 " + ("OK" if ratio >= 1 / 3 else "MISSED"),
            ),
            (
                "analyze / grep-10 throughput",
                f"{an_mbs / g10_mbs:.3f}",
                "goal >= 1 (issue 17) " + ("OK" if an_mbs >= g10_mbs else "MISSED"),
            ),
            (
                "analyze peak RSS",
                f"{an_rss / 1024:.1f} MiB",
                "target < 100 MB " + ("OK" if an_rss * 1024 < 100 * MB else "MISSED"),
            ),
            (
                "--version (median of 10)",
                f"{version_ms:.0f} ms",
                "target < 150 ms " + ("OK" if version_ms < 150 else "MISSED"),
            ),
        ]
        print_rows(rows)
        if args.json:
            print(
                json.dumps(
                    {
                        "size_bytes": size,
                        "grep_s": grep_wall,
                        "grep_mb_s": grep_mbs,
                        "analyze_s": an_wall,
                        "analyze_runs_s": an_walls,
                        "grep10_runs_s": g10_walls,
                        "analyze_mb_s": an_mbs,
                        "ratio": ratio,
                        "grep10_mb_s": g10_mbs,
                        "ratio_grep10": an_mbs / g10_mbs,
                        "analyze_peak_rss_kib": an_rss,
                        "version_ms": version_ms,
                        "verdict": verdict,
                    }
                )
            )
        return 0
    finally:
        if args.keep:
            print(f"kept {log}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
