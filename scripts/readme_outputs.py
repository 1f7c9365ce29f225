#!/usr/bin/env python3
"""Write the README's sample outputs from the CLI itself (never typed by hand), or check them.

    python scripts/readme_outputs.py --write README.md   # refresh every block
    python scripts/readme_outputs.py --check README.md   # exit 1 when one is stale

A block sits between `<!-- output: KIND ARGS -->` and `<!-- /output -->`; KIND is
  run ARGS          `offload-doctor ARGS` run in the repository root: the transcript, stdout and
                    stderr as a terminal shows them, then its exit status
  compare DIR       DIR/report.json (a real run on an H200) through today's compare text renderer
  capture FILE A-B  lines A to B of FILE: output captured on a real machine, kept as it was
tests/cli/test_readme_recipes.py fails when a block drifts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- output: (.+?) -->\n)(.*?)(<!-- /output -->)", re.S)


def env() -> dict[str, str]:
    """A plain 80-column terminal with no colour, the same on every machine."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SYSTEMROOT")}
    # Unbuffered: stdout and stderr interleave in the order they are written, as on a terminal.
    return keep | {
        "COLUMNS": "80",
        "NO_COLOR": "1",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }


def run(args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", *shlex.split(args)],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
    )
    out = done.stdout if done.stdout.endswith("\n") or not done.stdout else done.stdout + "\n"
    return f"$ offload-doctor {args}\n{out}$ echo $?\n{done.returncode}\n"


def compare(folder: str) -> str:
    sys.path.insert(0, str(ROOT))
    from vllm_offload_doctor.compare.model import CompareReport
    from vllm_offload_doctor.compare.render import render_text

    data = json.loads((ROOT / folder / "report.json").read_text(encoding="utf-8"))
    return render_text(CompareReport.from_dict(data), folder).rstrip("\n") + "\n"


def capture(spec: str) -> str:
    path, span = spec.rsplit(" ", 1)
    first, last = (int(n) for n in span.split("-"))
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    return "\n".join(lines[first - 1 : last]) + "\n"


def body(spec: str) -> str:
    kind, _, rest = spec.partition(" ")
    makers = {"run": run, "compare": compare, "capture": capture}
    if kind not in makers:
        raise SystemExit(f"unknown block kind {kind!r} in <!-- output: {spec} -->")
    fence = "console" if kind == "run" else "text"
    return f"```{fence}\n{makers[kind](rest)}```\n"


def refresh(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + body(m.group(2)) + m.group(4), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the blocks in place")
    mode.add_argument("--check", action="store_true", help="exit 1 when a block is stale")
    parser.add_argument("file", nargs="?", default=str(ROOT / "README.md"))
    ns = parser.parse_args()
    path = Path(ns.file)
    text = path.read_text(encoding="utf-8")
    new = refresh(text)
    if ns.write:
        path.write_text(new, encoding="utf-8")
        return 0
    if new != text:
        print(f"{path}: sample outputs are stale: run scripts/readme_outputs.py --write {path}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
