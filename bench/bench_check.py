"""Time `offload-doctor check --format json` against `nvidia-smi -q` in the same run.

Usage: python bench/bench_check.py [-n 20] [--json]

Both commands are run as fresh subprocesses, interleaved, so that they see the same machine
state (GPU power state, page cache). Prints median and min wall time of each and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def time_once(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.run(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False
    )
    return time.perf_counter() - start, proc.returncode


def stats(samples: list[float]) -> dict[str, float]:
    return {
        "median_ms": statistics.median(samples) * 1e3,
        "min_ms": min(samples) * 1e3,
        "max_ms": max(samples) * 1e3,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="runs of each command (default 20)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()

    # This tree first, then whatever the caller's path adds (a dependency installed with --target).
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
    }
    check = [sys.executable, "-m", "vllm_offload_doctor", "check", "--format", "json"]
    smi_path = shutil.which("nvidia-smi")
    smi = [smi_path, "-q"] if smi_path else None

    time_once(check, env)  # warm the page cache for both before measuring
    if smi:
        time_once(smi, env)
    check_t: list[float] = []
    smi_t: list[float] = []
    check_rc: set[int] = set()
    smi_rc: set[int] = set()
    for _ in range(args.n):
        elapsed, rc = time_once(check, env)
        check_t.append(elapsed)
        check_rc.add(rc)
        if smi:
            elapsed, rc = time_once(smi, env)
            smi_t.append(elapsed)
            smi_rc.add(rc)

    result: dict[str, object] = {
        "runs": args.n,
        "check": {**stats(check_t), "exit_codes": sorted(check_rc)},
        "nvidia_smi_q": {**stats(smi_t), "exit_codes": sorted(smi_rc)} if smi else None,
    }
    if smi:
        result["ratio_check_over_smi_median"] = statistics.median(check_t) / statistics.median(
            smi_t
        )
    if 3 in check_rc:  # a bug of the doctor: the times would measure a crash
        print("offload-doctor check crashed (exit 3); run it by hand to see why", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    c = stats(check_t)
    print(f"runs: {args.n} each, interleaved")
    print(
        f"offload-doctor check --format json: median {c['median_ms']:.0f} ms, "
        f"min {c['min_ms']:.0f} ms (exit codes {sorted(check_rc)})"
    )
    if smi:
        s = stats(smi_t)
        print(
            f"nvidia-smi -q:                      median {s['median_ms']:.0f} ms, "
            f"min {s['min_ms']:.0f} ms (exit codes {sorted(smi_rc)})"
        )
        print(f"ratio check / nvidia-smi -q (median): {result['ratio_check_over_smi_median']:.2f}")
    else:
        print("nvidia-smi not found on PATH: only check was timed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
