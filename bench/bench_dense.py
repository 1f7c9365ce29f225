"""Benchmark `offload-doctor analyze` on diverse, error-dense text against `grep -F -c`.

Every corpus log (/work/shared/corpus/*.log: 232 real logs of many vLLM versions, most of them
failures: tracebacks, error lines, pasted reports) is concatenated, and the concatenation
repeated until --size-mb MiB (default 64). Unlike a crash loop, consecutive starts differ, so
every start is judged; unlike a serving log, a large share of the lines hold a prefilter word.
Two logs are built:

* "identical copies": the concatenation repeated byte for byte (issue 17's row). From the third
  copy on, every start is one the engine judged twice before (analyze/recall.py): it is skipped;
* "copies with other pids and times": each copy's pids and clock moved, as another run of the
  same servers would print them. No start repeats byte for byte, so every start is fed and
  judged; only lines repeat (repeats.py). This is the figure for real, varied error-dense text
  that is not new; text never seen at all is bench_hostile.py's million distinct lines.

For each, in one run: `grep -F -c -f WORDS FILE` with the engine's prefilter words (the
baseline), `offload-doctor analyze --format json FILE` (wall time, MB/s, peak RSS) and the
ratio analyze/grep (issue 17's goal: >= 0.5).

    python bench/bench_dense.py [--size-mb 64] [--keep] [--corpus DIR] [--only identical|copies]
"""

from __future__ import annotations

import argparse
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
    built,
    doctor_cmd,
    grep_words,
    print_rows,
    timed,
)

MIB = 2**20


_PID = re.compile(rb"pid=(\d+)")
_CLOCK = re.compile(rb"\b(\d\d):(\d\d):(\d\d)\b")


def _concatenation(corpus: Path) -> bytes:
    texts = [p.read_bytes() for p in sorted(corpus.glob("*.log"))]
    if not texts:
        raise SystemExit(f"no logs in {corpus}: this benchmark needs the corpus")
    return b"".join(t if t.endswith(b"\n") else t + b"\n" for t in texts)


def _moved(one: bytes, copy: int) -> bytes:
    """Copy number `copy` as another run would print it: pids and clock times moved."""
    one = _PID.sub(lambda m: b"pid=%d" % (int(m[1]) + 7 * copy), one)
    shift = 37 * copy

    def clock(m: re.Match[bytes]) -> bytes:
        t = (int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) + shift) % 86400
        return b"%02d:%02d:%02d" % (t // 3600, t // 60 % 60, t % 60)

    return _CLOCK.sub(clock, one)


def build_log(path: Path, size_mib: int, corpus: Path) -> int:
    """The concatenation repeated byte for byte."""
    one = _concatenation(corpus)
    with path.open("wb") as f:
        for _ in range(max(1, (size_mib * MIB) // len(one))):
            f.write(one)
    return path.stat().st_size


def build_varied(path: Path, size_mib: int, corpus: Path) -> int:
    """The concatenation repeated, each copy with other pids and times (cycling over 64)."""
    one = _concatenation(corpus)
    copies = [_moved(one, c) for c in range(min(64, max(1, (size_mib * MIB) // len(one))))]
    written = 0
    with path.open("wb") as f:
        while written < size_mib * MIB:
            copy = copies[(written // len(one)) % len(copies)]
            f.write(copy)
            written += len(copy)
    return path.stat().st_size


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size-mb", type=int, default=64, help="log size in MiB (default 64)")
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--keep", action="store_true", help="keep the generated logs")
    ap.add_argument("--only", choices=["identical", "copies"], help="build and time one log")
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-dense-"))
    kinds = [("identical copies", build_log), ("copies with other pids and times", build_varied)]
    try:
        for label, build in kinds:
            if args.only and not label.startswith(args.only):
                continue
            log = workdir / ("dense.log" if build is build_log else "varied.log")
            size = built(build, log, args.size_mb, args.corpus)
            g_wall, g_out, _, n_words = grep_words(log, workdir)
            a_wall, a_rss, _, a_rc = timed([*doctor_cmd(), "analyze", "--format", "json", str(log)])
            a_mbs, g_mbs = size / MB / a_wall, size / MB / g_wall
            ratio = a_mbs / g_mbs
            total = log.read_bytes().count(b"\n")
            print(f"-- {label}")
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
            if not args.keep:
                log.unlink()
    finally:
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
