"""A support engineer's batch: `offload-doctor analyze DIR` on --files small logs against `grep -r`.

Builds --files logs (default 10,000) in a temp folder from the corpus's small logs (each under
20 KB, taken in turn; a built-in OOM tail when the corpus is absent), then in one run:

* `grep -r -F -c -f WORDS DIR` with the engine's prefilter words: files/s (the baseline);
* `offload-doctor analyze --format json DIR` and `--format text DIR`: files/s, peak RSS;
* the ratios, against the goals (>= 1,000 files/s on 2 cores, RSS < 100 MiB).

    python bench/bench_batch.py [--files 10000] [--corpus DIR] [--keep]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from bench_analyze import DEFAULT_CORPUS, OOM_TAIL, doctor_cmd, print_rows, timed  # noqa: E402


def build(folder: Path, files: int, corpus: Path) -> int:
    texts = [p.read_bytes() for p in sorted(corpus.glob("*.log")) if p.stat().st_size < 20_000]
    if not texts:
        texts = [OOM_TAIL.encode()]
    total = 0
    for i in range(files):
        text = texts[i % len(texts)]
        (folder / f"{i:06d}.log").write_bytes(text)
        total += len(text)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    from vllm_offload_doctor.analyze.engine import Engine

    work = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    logs = work / "logs"
    logs.mkdir()
    try:
        size = build(logs, args.files, args.corpus)
        words = work / "words.txt"
        words.write_text(
            "\n".join(w for w, _ in Engine().prefilter_words()) + "\n", encoding="utf-8"
        )
        subprocess.run(["cat", *map(str, logs.iterdir())], stdout=subprocess.DEVNULL, check=False)
        g_wall, _, _, _ = timed(["grep", "-r", "-F", "-c", "-f", str(words), str(logs)])
        j_wall, j_rss, _, j_rc = timed([*doctor_cmd(), "analyze", "--format", "json", str(logs)])
        t_wall, t_rss, _, t_rc = timed([*doctor_cmd(), "analyze", str(logs)])
        n = args.files
        rows = [
            ("files", f"{n}", f"{size / 2**20:.1f} MiB in all"),
            ("grep -r -F -c", f"{n / g_wall:,.0f} files/s", f"{g_wall:.2f} s (baseline)"),
            (
                "analyze --format json",
                f"{n / j_wall:,.0f} files/s",
                f"{j_wall:.2f} s, {j_rss / 1024:.0f} MiB peak RSS, exit {j_rc}, "
                f"{g_wall / j_wall:.3f} x grep (goal >= 1,000 files/s, RSS < 100 MiB)",
            ),
            (
                "analyze (text)",
                f"{n / t_wall:,.0f} files/s",
                f"{t_wall:.2f} s, {t_rss / 1024:.0f} MiB peak RSS, exit {t_rc}, {g_wall / t_wall:.3f} x grep",
            ),
        ]
        print_rows(rows)
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
