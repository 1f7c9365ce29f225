"""Benchmark `offload-doctor analyze` on a crash-looping pod's log against `grep -F -c`.

A pod that crash-loops prints the same start-up and traceback on every restart, with new
pids and timestamps. This builds such a log of --size-mb MiB (default 1024, i.e. 1 GiB) from
a real vLLM 0.25.1 start-up that dies with a weights OOM (/work/shared/corpus/H-010.log,
224 lines, half of them ERROR traceback lines), every restart with its own pids and
times. Then, in one run:

* `offload-doctor analyze --format json FILE`: wall time, MB/s, peak RSS;
* `grep -F -c -f WORDS FILE` with the engine's prefilter words: MB/s;
* the ratio analyze/grep (issue 17's goal: >= 0.5) and the RSS (target < 100 MB).

    python bench/bench_crashloop.py [--size-mb 1024] [--keep] [--corpus DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from bench_analyze import (  # noqa: E402
    DEFAULT_CORPUS,
    MB,
    OOM_TAIL,
    built,
    doctor_cmd,
    grep_words,
    print_rows,
    timed,
)

MIB = 2**20
_PID = re.compile(r"pid=(\d+)")
_TIME = re.compile(r"(\d\d-\d\d) (\d\d):(\d\d):(\d\d)")


def restart_block(corpus: Path) -> str:
    src = corpus / "H-010.log"
    if src.is_file():
        return src.read_text(encoding="utf-8", errors="replace")
    return OOM_TAIL  # a serving-time OOM traceback when the corpus is absent


def variant(block: str, restart: int) -> str:
    """The block as restart number `restart` prints it: other pids, later times."""
    shift = restart * 97  # seconds between restarts

    def when(m: re.Match[str]) -> str:
        total = int(m.group(2)) * 3600 + int(m.group(3)) * 60 + int(m.group(4)) + shift
        h, rest = divmod(total % 86400, 3600)
        return f"{m.group(1)} {h:02d}:{rest // 60:02d}:{rest % 60:02d}"

    block = _PID.sub(lambda m: f"pid={int(m.group(1)) + 7 * restart}", block)
    return _TIME.sub(when, block)


def build_log(path: Path, size_mib: int, corpus: Path) -> int:
    block = restart_block(corpus)
    if not block.endswith("\n"):
        block += "\n"
    variants = [variant(block, i) for i in range(64)]
    target = size_mib * MIB
    written = 0
    i = 0
    with path.open("w", encoding="utf-8") as f:
        while written < target:
            chunk = "".join(variants[(i + k) % 64] for k in range(16))
            f.write(chunk)
            written += len(chunk.encode())
            i += 16
    return path.stat().st_size


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size-mb", type=int, default=1024, help="log size in MiB (default 1024)")
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument(
        "--dir", type=Path, default=None, help="where to build the log (default: a temp dir)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the generated log")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-crashloop-", dir=args.dir))
    log = workdir / "crashloop.log"
    try:
        size = built(build_log, log, args.size_mb, args.corpus)
        grep_wall, grep_out, grep_rc, n_words = grep_words(log, workdir)
        if grep_rc not in (0, 1):
            print(f"grep failed (rc {grep_rc})", file=sys.stderr)
        an_wall, an_rss, an_out, an_rc = timed(
            [*doctor_cmd(), "analyze", "--format", "json", str(log)]
        )
        try:
            verdict = json.loads(an_out)["results"][0]["verdict"]["category"]
        except (ValueError, KeyError, IndexError):
            verdict = f"? (rc {an_rc})"

        an_mbs, grep_mbs = size / MB / an_wall, size / MB / grep_wall
        ratio = an_mbs / grep_mbs
        rows = [
            ("log size", f"{size / MB:.0f} MB ({size / MIB:.0f} MiB)", ""),
            (
                "grep -F -c (prefilter words)",
                f"{grep_wall:.2f} s, {grep_mbs:.0f} MB/s",
                f"{grep_out.strip()} matching lines, {n_words} words",
            ),
            (
                "analyze --format json",
                f"{an_wall:.2f} s, {an_mbs:.1f} MB/s",
                f"verdict {verdict}, rc {an_rc}",
            ),
            (
                "analyze / grep throughput",
                f"{ratio:.3f}",
                "goal >= 0.5 " + ("OK" if ratio >= 0.5 else "MISSED"),
            ),
            (
                "analyze peak RSS",
                f"{an_rss / 1024:.1f} MiB",
                "target < 100 MB " + ("OK" if an_rss * 1024 < 100 * MB else "MISSED"),
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
                        "analyze_mb_s": an_mbs,
                        "ratio": ratio,
                        "analyze_peak_rss_kib": an_rss,
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
