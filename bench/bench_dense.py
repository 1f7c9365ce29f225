"""Benchmark `offload-doctor analyze` on diverse, error-dense text against `grep -F -c`.

Every corpus log (/work/shared/corpus/*.log: 232 real logs of many vLLM versions, most of them
failures: tracebacks, error lines, pasted reports) is concatenated, and the concatenation
repeated until --size-mb MiB (default 64). Unlike a crash loop, consecutive starts differ, so
every start is judged; unlike a serving log, a large share of the lines hold a prefilter word.
In one run:

* `grep -F -c -f WORDS FILE` with the engine's prefilter words: MB/s (the baseline);
* `offload-doctor analyze --format json FILE`: wall time, MB/s, peak RSS;
* the ratio analyze/grep (issue 17's goal: >= 0.5).

    python bench/bench_dense.py [--size-mb 64] [--keep] [--corpus DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from bench_analyze import (  # noqa: E402
    DEFAULT_CORPUS,
    MB,
    built,
    doctor_cmd,
    grep_words,
    print_rows,
    timed,
)

MIB = 2**20


def build_log(path: Path, size_mib: int, corpus: Path) -> int:
    texts = [p.read_bytes() for p in sorted(corpus.glob("*.log"))]
    if not texts:
        raise SystemExit(f"no logs in {corpus}: this benchmark needs the corpus")
    one = b"".join(t if t.endswith(b"\n") else t + b"\n" for t in texts)
    with path.open("wb") as f:
        for _ in range(max(1, (size_mib * MIB) // len(one))):
            f.write(one)
    return path.stat().st_size


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size-mb", type=int, default=64, help="log size in MiB (default 64)")
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--keep", action="store_true", help="keep the generated log")
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-dense-"))
    log = workdir / "dense.log"
    try:
        size = built(build_log, log, args.size_mb, args.corpus)
        g_wall, g_out, _, n_words = grep_words(log, workdir)
        a_wall, a_rss, _, a_rc = timed([*doctor_cmd(), "analyze", "--format", "json", str(log)])
        a_mbs, g_mbs = size / MB / a_wall, size / MB / g_wall
        ratio = a_mbs / g_mbs
        total = log.read_bytes().count(b"\n")
        print_rows(
            [
                ("log size", f"{size / MB:.0f} MB", f"{total:,} lines"),
                (
                    "grep -F -c (prefilter words)",
                    f"{g_wall:.2f} s, {g_mbs:.0f} MB/s",
                    f"{int(g_out.strip()):,} matching lines, {n_words} words",
                ),
                ("analyze --format json", f"{a_wall:.2f} s, {a_mbs:.1f} MB/s", f"rc {a_rc}"),
                (
                    "analyze / grep throughput",
                    f"{ratio:.3f}",
                    "goal >= 0.5 " + ("OK" if ratio >= 0.5 else "MISSED"),
                ),
                ("analyze peak RSS", f"{a_rss / 1024:.1f} MiB", ""),
            ]
        )
    finally:
        if args.keep:
            print(f"kept {log}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
