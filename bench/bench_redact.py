"""Benchmark secret masking on crafted long lines: this tree's redact.py against a baseline.

For each crafted line (spaces, repeated `token=`, long token values, open quotes and lists,
...) of --kb KiB it times `scrub_text` of this tree, and the baseline's `redact` (by default
`git show main:vllm_offload_doctor/redact.py`, loaded from a temp file) in the same run. Each
measurement runs in its own interpreter under a --timeout, so a quadratic baseline shows as
"> N s" instead of stalling the run. It also times this tree at half and double the size:
a linear pattern takes about 2x per doubling, a quadratic one 4x.

Figures are seconds per MB of line (the issue's target: < 1 s/MB for any input line).

    python bench/bench_redact.py [--kb 256] [--timeout 30] [--baseline-ref main] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> (unit, prefix); the line is prefix + unit repeated to the size asked.
CRAFTED: dict[str, tuple[str, str]] = {
    "version + spaces": (" ", "vLLM API server version"),
    "repeated token=": ("token=", ""),
    "repeated 'token= '": ("token= ", ""),
    "non-default args, long TOKEN value": ("A1b2", "non-default args: {'api_key': ['TOKEN"),
    "long base64 blob": ("aB3/", ""),
    "scheme:// + 'a:'": ("a:", "https://"),
    "repeated 'https://a:'": ("https://a:", ""),
    "repeated Authorization:": ("Authorization: ", ""),
    "repeated Bearer": ("Bearer ", ""),
    "repeated --token": ("--token ", ""),
    "repeated PEM begin": ("-----BEGIN PRIVATE KEY-----", ""),
    "repeated password='": ("password='", ""),
    "repeated api_key: [": ("api_key: [", ""),
    "repeated 'secret: x '": ("secret: x ", ""),
    "repeated eyJ..": ("eyJabcdefgh.", ""),
    "repeated hf_": ("hf_", ""),
    "TOKEN repeated": ("TOKEN", ""),
}

WORKER = r"""
import importlib.util, json, sys, time
path, name, kb, unit, prefix = sys.argv[1:6]
spec = importlib.util.spec_from_file_location("redact_under_test", path)
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
fn = getattr(mod, "scrub_text", None) or mod.redact
n = int(kb) * 1024
line = prefix + unit * ((n - len(prefix)) // len(unit) + 1)
line = line[:n]
t = time.perf_counter(); fn(line); dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "bytes": len(line.encode())}))
"""


def _measure(module: Path, unit: str, prefix: str, kb: int, timeout: float) -> float | None:
    """Seconds to mask one line, or None when it ran past `timeout`."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", WORKER, str(module), "x", str(kb), unit, prefix],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        raise SystemExit(f"worker failed: {proc.stderr[-500:]}")
    return float(json.loads(proc.stdout)["seconds"])


def _per_mb(seconds: float | None, kb: int, timeout: float) -> str:
    if seconds is None:
        return f"> {timeout / (kb * 1024 / 1e6):.0f} s/MB (timeout)"
    return f"{seconds / (kb * 1024 / 1e6):.3f} s/MB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kb", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--baseline-ref", default="main")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    current = ROOT / "vllm_offload_doctor" / "redact.py"
    with tempfile.TemporaryDirectory() as tmp:
        baseline: Path | None = Path(tmp) / "redact_baseline.py"
        shown = subprocess.run(
            ["git", "show", f"{args.baseline_ref}:vllm_offload_doctor/redact.py"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if shown.returncode == 0:
            baseline.write_text(shown.stdout)
        else:
            print(f"no baseline ({args.baseline_ref}): {shown.stderr.strip()}", file=sys.stderr)
            baseline = None
        rows = []
        for name, (unit, prefix) in CRAFTED.items():
            now = _measure(current, unit, prefix, args.kb, args.timeout)
            half = _measure(current, unit, prefix, args.kb // 2, args.timeout)
            double = _measure(current, unit, prefix, args.kb * 2, args.timeout)
            before = _measure(baseline, unit, prefix, args.kb, args.timeout) if baseline else None
            growth = double / half if (double and half) else None
            rows.append(
                {
                    "line": name,
                    "before_s": before,
                    "after_s": now,
                    "after_half_s": half,
                    "after_double_s": double,
                    "growth_4x_size": growth,
                }
            )
            print(
                f"{name:38s} before {_per_mb(before, args.kb, args.timeout):>24s}   "
                f"after {_per_mb(now, args.kb, args.timeout):>14s}   "
                f"x{growth:.1f} time for 4x size"
                if growth
                else f"{name}: timeout",
                flush=True,
            )
    worst = max((r["after_s"] or float("inf")) for r in rows) / (args.kb * 1024 / 1e6)
    print(f"worst crafted line after: {worst:.3f} s/MB (target < 1 s/MB)")
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
