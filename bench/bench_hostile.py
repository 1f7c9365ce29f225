"""Worst crafted line per pattern family: seconds per MB, before (git main) and after (this tree).

Every pattern of the package meets lines made to make a backtracking regex work hard: a
pattern's own literal words followed by long runs of spaces, of one letter, of brackets, of
`key=value,` pairs, of its word repeated, and so on. For each family it prints the worst
line's time per MB of line:

* normalize: `normalize.parse` and `split_long` on the raw line (every line goes through them);
* facts: every fact pattern (`search` as the engine calls it, gate and cap included), and the
  collector's `feed` on the parsed line;
* rules: every rule's `search` (with its timeout; timeouts are counted);
* knowledge/reports/other: the clue, report and remaining module patterns;
* analyze: `Engine.analyze_lines` on the line, in a subprocess with a time limit (the product);
* files: 2 MB files of issue 20's crafted lines (`[` + `a.` x n, `repeated` + blanks, `</b `
  repeated, `│` + blanks, `Error` + blanks, quotes or `Bearer` runs, lines of ANSI escapes and
  of ANSI-coloured `ERROR`) and a million distinct
  exception lines, analysed end to end (start-up excluded; the issue's target: <= 0.5 s/MB).

The "before" figures come from the same script run in a subprocess on `git archive REF` (default
main), so both sides are measured in the same run on the same machine.

    python bench/bench_hostile.py [--ref main] [--size-kb 256] [--limit-s 20] [--only after]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
MB = 1_000_000

GENERIC = (
    "version", "non-default args: ", "args: Namespace(", "model", "ERROR", "Error: ", "pid=",
    "File \"", ", line ", "--cpu-offload-gb", "GiB", "http://", "Traceback", "LLM engine",
)  # fmt: skip


def shapes(word: str, n: int) -> Iterable[tuple[str, str]]:
    """(name, line) of about n characters built around `word`."""
    reps = max(1, n // max(1, len(word) + 1))
    yield "word+spaces", word + " " * n
    yield "spaces+word", " " * n + word
    yield "word repeated", (word + " ") * reps
    yield "word glued", word * reps
    yield "word+letters", word + "A" * n
    yield "word+digits", word + "1." * (n // 2)
    yield "word+tabs+x", word + "\t" * n + "x"
    yield "word+parens", word + "(" * n
    yield "word+brackets", word + "[" * n
    yield "word+braces", word + "{'a': " * (n // 6)
    yield "word+kv", word + "a=1, " * (n // 5)
    yield "word+quotes", word + "'a'," * (n // 4)
    yield "word+spaces+word", word + " " * n + word + " x"
    yield "x+spaces+word+spaces", "x" + " " * (n // 2) + word + " " * (n // 2)
    yield "prefixed", "(EngineCore pid=1) ERROR 11-29 15:50:42 [core.py:1] " + word + " " * n


# -- what is measured -------------------------------------------------------------------------


def _words_of(obj: Any) -> tuple[str, ...]:
    words = getattr(obj, "words", None) or getattr(obj, "keywords", None) or ()
    return tuple(words)


def _compiled(value: Any) -> bool:
    return hasattr(value, "pattern") and hasattr(value, "search")


def _search(p: Any) -> Callable[[str], Any]:
    """`p.search` on a line; a bytes pattern (the engine's block scans) is given the line's bytes."""
    if isinstance(getattr(p, "pattern", None), bytes):
        return lambda t: p.search(t.encode())
    return p.search  # type: ignore[no-any-return]


def _module(name: str) -> Any:
    """A module of the code under test, wherever its layout keeps it."""
    for package in (
        "vllm_offload_doctor.analyze",
        "vllm_offload_doctor.compare",
        "vllm_offload_doctor",
    ):
        try:
            return importlib.import_module(f"{package}.{name}")
        except ImportError:
            continue
    raise ImportError(name)


def _module_patterns(mod: Any, skip: set[int]) -> list[tuple[str, Any]]:
    out = []
    for name, value in vars(mod).items():
        items = value if isinstance(value, tuple | list) else (value,)
        for i, item in enumerate(items):
            for sub in item if isinstance(item, tuple) else (item,):
                if isinstance(sub, type) or id(sub) in skip:
                    continue
                if _compiled(sub) or hasattr(sub, "rx"):
                    skip.add(id(sub))
                    out.append((f"{mod.__name__.rsplit('.', 1)[-1]}.{name}[{i}]", sub))
    return out


def families() -> dict[str, list[tuple[str, Callable[[str], Any], tuple[str, ...]]]]:
    """family -> [(name, run(line), words)] for the package on sys.path."""
    # The package layout of the code under test (a --ref may predate analyze/).
    try:
        from vllm_offload_doctor.analyze import engine as analyze
        from vllm_offload_doctor.analyze import normalize
    except ImportError:
        analyze = importlib.import_module("vllm_offload_doctor.analyze")
        normalize = importlib.import_module("vllm_offload_doctor.normalize")
    fam: dict[str, list[tuple[str, Callable[[str], Any], tuple[str, ...]]]] = {}
    fam["normalize"] = [
        ("normalize.parse", lambda t: normalize.parse(1, t), ()),
        (
            "normalize.split_long",
            lambda t: [normalize.parse(1, p) for p in normalize.split_long(t)],
            (),
        ),
    ]
    seen: set[int] = set()
    facts_mod = _module("facts")
    fact_list = []
    for name, p in _module_patterns(facts_mod, seen) + _module_patterns(analyze, seen):
        fact_list.append((name, _search(p), _words_of(p)))

    def collector(t: str) -> None:
        c = facts_mod.FactCollector()
        c.feed(normalize.parse(1, t))
        c.finish()

    fact_list.append(("facts.FactCollector.feed", collector, ()))
    fam["facts"] = fact_list
    engine = analyze.Engine()
    fam["rules"] = [
        (f"rule {r.id}", r.search, tuple(r.keywords)) for r in engine.rules if r.patterns
    ]
    other = []
    for modname in ("verdict", "reports", "progress", "knowledge"):
        try:
            mod = _module(modname)
        except ImportError:
            continue
        for name, p in _module_patterns(mod, seen):
            other.append((name, _search(p), _words_of(p)))
    know = getattr(engine, "knowledge", None)
    if know is not None:
        for attr in ("wrappers", "deaths", "call_pattern"):  # as verdict.Clues calls them
            p = getattr(know, attr, None)
            if p is not None:
                run = p.match if attr == "call_pattern" else p.search
                other.append(
                    (f"knowledge.{attr}", run, tuple(getattr(know, f"{attr[:-1]}_keywords", ())))
                )
    fam["knowledge/reports/other"] = other
    return fam


def measure(size: int, budget_s: float) -> dict[str, Any]:
    """Worst s/MB per family, and per pattern, for crafted lines of `size` characters."""
    out: dict[str, Any] = {}
    for family, runs in families().items():
        worst: tuple[float, str, str, str, str] = (0.0, "", "", "", "")
        per: dict[str, float] = {}
        timeouts = 0
        for name, run, words in runs:
            spent = 0.0
            for word in dict.fromkeys((*words[:6], *GENERIC)):
                for shape, line in shapes(word, size):
                    t0 = time.perf_counter()
                    try:
                        run(line)
                    except TimeoutError:
                        timeouts += 1
                    dt = time.perf_counter() - t0
                    spent += dt
                    rate = dt / (len(line.encode()) / MB)
                    per[name] = max(per.get(name, 0.0), rate)
                    if rate > worst[0]:
                        worst = (rate, name, f"{shape} ({word!r})", shape, word)
                    if spent > budget_s:
                        break
                if spent > budget_s:
                    break
        out[family] = {"worst_s_per_mb": worst[0], "pattern": worst[1], "line": worst[2],
                       "shape": worst[3], "word": worst[4],
                       "timeouts": timeouts, "patterns": len(runs),
                       "top": sorted(per.items(), key=lambda kv: -kv[1])[:3]}  # fmt: skip
    return out


def analyze_worst(size: int, limit_s: float, shapes_of: Iterable[tuple[str, str]]) -> list[Any]:
    """`analyze` on files of one crafted line each, each run in a subprocess with a time limit."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        for shape, word in shapes_of:
            line = dict(shapes(word, size))[shape]
            path = Path(tmp) / "line.log"
            path.write_text(line + "\n", encoding="utf-8")
            dt, hung = _timed_analyze(path, limit_s)
            rows.append((f"{shape} ({word!r})", dt / (path.stat().st_size / MB), hung))
    return rows


E2E = (
    ("word+spaces", "version"), ("x+spaces+word+spaces", "version"), ("word+spaces+word", "version"), ("word+letters", "non-default args: "),
    ("word+kv", "args: Namespace("), ("word+spaces", "  model"), ("word+tabs+x", "ERROR"),
    ("word+parens", "LLM engine"), ("word+quotes", "non-default args: "), ("spaces+word", "Traceback"),
    ("prefixed", "File \""), ("word+braces", "non-default args: "), ("word repeated", "pid="),
)  # fmt: skip


# Issue 20's crafted lines (quadratic in main's normalize.py), analysed end to end.
CRAFTED_LINES: dict[str, Callable[[int], str]] = {
    "[ + a. x n + ERROR": lambda n: "[" + "a." * (n // 2) + " ERROR",
    "repeated + spaces": lambda n: "(Worker pid=1) ERROR repeated" + " " * n + "x",
    "</b repeated": lambda n: "ERROR " + "</b " * (n // 4),
    "box + spaces": lambda n: "│ ERROR" + " " * n + "x",
    "Error + spaces": lambda n: "Error" + " " * n + "x",
    "Error + quotes": lambda n: "Error " + '"' * n,
    "Error + Bearer": lambda n: "Error " + "Bearer " * (n // 7),
    "ANSI escapes only": lambda n: "\x1b[1;31m\x1b[0m" * (n // 11),
    "ANSI-coloured ERROR": lambda n: "\x1b[1;31mERROR\x1b[0m",  # short lines, n aside
}


def _timed_analyze(path: Path, limit_s: float) -> tuple[float, bool]:
    """Seconds `Engine.analyze_file(path)` takes (start-up excluded), or the limit if it hangs."""
    code = (
        "import sys, time; from pathlib import Path\n"
        "try:\n    from vllm_offload_doctor.analyze import engine as analyze\n"
        "except ImportError:\n    from vllm_offload_doctor import analyze\n"  # an older tree
        "e = analyze.Engine(); t = time.perf_counter(); e.analyze_file(Path(sys.argv[1])); "
        "print(time.perf_counter() - t)"
    )
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                              text=True, timeout=limit_s, check=True, env=os.environ.copy())  # fmt: skip
    except subprocess.TimeoutExpired:
        return limit_s, True
    return float(proc.stdout.split()[-1]), False


def crafted_files(size: int, limit_s: float, millions: float) -> list[Any]:
    """Files made of the crafted lines (2 MB each: many lines of `size`), and `millions` of
    distinct exception lines: seconds per MB of file, start-up excluded."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        path = Path(tmp) / "crafted.log"
        for name, make in CRAFTED_LINES.items():
            line = make(size)
            path.write_text((line + "\n") * max(1, (2 * MB) // len(line)), encoding="utf-8")
            dt, hung = _timed_analyze(path, limit_s)
            width = f"{len(line) // 1024} KiB" if len(line) >= 1024 else f"{len(line)} B"
            rows.append((f"2 MB of {name} ({width} lines)", dt / (path.stat().st_size / MB), hung))
        with path.open("w", encoding="utf-8") as fh:
            for i in range(int(millions * 1_000_000)):
                fh.write(
                    f"ERROR 11-29 15:14:25 [core.py:1] RuntimeError: failure {i:x} at step {i * 7}\n"
                )
        dt, hung = _timed_analyze(path, limit_s)
        rows.append(
            (f"{millions:g} M distinct exception lines", dt / (path.stat().st_size / MB), hung)
        )
    return rows


def run_side(src: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    """This script's --measure in a subprocess importing the package from `src` (None: this tree)."""
    env = os.environ.copy()
    env["PYTHONPATH"] = str(src or ROOT)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = [sys.executable, str(HERE), "--measure", "--size-kb", str(args.size_kb),
           "--budget-s", str(args.budget_s), "--limit-s", str(args.limit_s),
           "--crafted-kb", str(args.crafted_kb), "--millions", str(args.millions)]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, check=False, cwd=src or ROOT
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:] or [f"rc {proc.returncode}"]}
    return dict(json.loads(proc.stdout))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ref", default="main", help="git ref measured as 'before' (default main)")
    ap.add_argument(
        "--size-kb", type=int, default=64, help="crafted line length for the pattern scan"
    )
    ap.add_argument("--analyze-kb", type=int, default=256, help="crafted line length for analyze")
    ap.add_argument("--budget-s", type=float, default=3.0, help="time per pattern before moving on")
    ap.add_argument("--limit-s", type=float, default=20.0, help="time limit of one analyze run")
    ap.add_argument("--crafted-kb", type=int, default=16, help="line length of the crafted files")
    ap.add_argument(
        "--millions", type=float, default=1.0, help="distinct exception lines, millions"
    )
    ap.add_argument("--only", choices=("before", "after"), help="measure one side only")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.measure:
        result = measure(args.size_kb * 1024, args.budget_s)
        # The fixed cases, and each family's worst line.
        cases = dict.fromkeys(
            [*E2E, *((r["shape"], r["word"]) for r in result.values() if r["shape"])]
        )
        result["analyze"] = analyze_worst(args.analyze_kb * 1024, args.limit_s, cases)
        result["files"] = crafted_files(args.crafted_kb * 1024, args.limit_s, args.millions)
        print(json.dumps(result))
        return 0

    sides: dict[str, dict[str, Any]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="hostile-before-"))
    try:
        if args.only != "after":
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.ref, "vllm_offload_doctor", "rules"],
                                     capture_output=True, check=True).stdout  # fmt: skip
            subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
            sides[f"before ({args.ref})"] = run_side(tmp, args)
        if args.only != "before":
            sides["after (this tree)"] = run_side(None, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"crafted lines: {args.size_kb} KiB per pattern scan, {args.analyze_kb} KiB for analyze "
          f"(limit {args.limit_s:g} s per run); worst line, seconds per MB of line")  # fmt: skip
    for side, res in sides.items():
        print(f"\n== {side}")
        if "error" in res:
            print(f"  failed: {res['error']}")
            continue
        for family, r in res.items():
            if family == "files":
                for name, rate, hung in r:
                    print(f"  {name:<44} {rate:9.3f} s/MB" + ("  [hit the limit]" if hung else ""))
                continue
            if family == "analyze":
                worst = max(r, key=lambda row: row[1])
                hung = sum(1 for row in r if row[2])
                print(f"  {'analyze (end to end)':<26} {worst[1]:9.3f} s/MB  {worst[0]}"
                      + (f"  [{hung} runs hit the {args.limit_s:g} s limit]" if hung else ""))  # fmt: skip
                continue
            top = ", ".join(f"{n} {v:.3g}" for n, v in r["top"])
            print(f"  {family:<26} {r['worst_s_per_mb']:9.3f} s/MB  {r['pattern']} on {r['line']}"
                  f"  ({r['patterns']} patterns; {r['timeouts']} timeouts; top: {top})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
