"""Start-up of the doctor against the floor it stands on, measured side by side in one run.

* `offload-doctor --version` against a bare `python -c pass` (goal: <= 0.06 s);
* `offload-doctor analyze` on a one-line log against an interpreter that only imports click,
  psutil, httpx and re2 (goal: <= 2.5 x those imports);
* `offload-doctor rules` (loads every rule file) for reference.

Each figure is the median wall time of --runs runs (default 9).

    python bench/bench_startup.py [--runs 9]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from bench_analyze import doctor_cmd, print_rows  # noqa: E402


def median_wall(cmd: list[str], runs: int) -> float:
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    doctor = doctor_cmd()
    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp) / "one.log"
        one.write_text("INFO 12-02 10:00:00 [api_server.py:1] vLLM API server version 0.25.1\n")
        bare = median_wall([sys.executable, "-c", "pass"], args.runs)
        imports = median_wall([sys.executable, "-c", "import click, psutil, httpx, re2"], args.runs)
        version = median_wall([*doctor, "--version"], args.runs)
        analyze = median_wall([*doctor, "analyze", str(one)], args.runs)
        rules = median_wall([*doctor, "rules"], args.runs)
    print_rows(
        [
            ("bare python", f"{bare * 1e3:.0f} ms", "baseline"),
            ("import click psutil httpx re2", f"{imports * 1e3:.0f} ms", "baseline"),
            (
                "--version",
                f"{version * 1e3:.0f} ms",
                f"{version / bare:.2f} x bare python (goal <= 60 ms)",
            ),
            (
                "analyze one line",
                f"{analyze * 1e3:.0f} ms",
                f"{analyze / imports:.2f} x the imports (goal <= 2.5 x)",
            ),
            ("rules", f"{rules * 1e3:.0f} ms", f"{rules / imports:.2f} x the imports"),
        ]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
