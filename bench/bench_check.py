"""Time `offload-doctor check --format json` against `nvidia-smi -q` in the same run, with a breakdown.

Usage: python bench/bench_check.py [-n 20] [--json] [--no-gpu] [--baseline TREE] [-o FILE]

Each round runs, as fresh subprocesses and interleaved so that all see the same machine state
(GPU power state, page cache):

* `check`: `python -m vllm_offload_doctor check --format json`, the figure the goal is on;
* `nvidia-smi -q`, the baseline (left out with --no-gpu, or when there is none);
* `bare python`: `python -c pass` in the same environment, the floor every Python tool stands on;
* `phases`: one interpreter that imports what `check` imports, then calls each probe of the
  `RealProbe` alone, in turn, then runs every check (`run_checks`, probes overlapped as in `check`)
  and renders the JSON. The sum of the probes against `run_checks` shows what the overlap saves;
* `timeline`: the real `check --format json` through the console script's main, its probes and
  run_checks wrapped to note when each ran: what overlaps, and what waits on what;
* `baseline check` (with --baseline TREE): the same command on another tree (a checkout of main),
  for a before/after in one run.

Prints a table of medians (and min) and then the figures as JSON (--json: the JSON alone; -o FILE:
the JSON to FILE too), and the largest imports of one `python -X importtime` run of `check`.
Without a GPU (--no-gpu) NVML fails at once and only the doctor's own work is timed.
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
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent

# Run in a fresh interpreter (`python -c`); prints one JSON object. Only the public names of the
# check package are used, so that it times an older tree (--baseline) the same way.
PHASES = r"""
import time
t0 = time.perf_counter()
import json
import sys
from vllm_offload_doctor import cli
from vllm_offload_doctor.checks import cli as check_cli
from vllm_offload_doctor.checks import Options, all_checks, run_checks
from vllm_offload_doctor.checks.render import render
from vllm_offload_doctor.machine import probes
from vllm_offload_doctor.output.formats import OutputFormat
all_checks()
out = {"imports": (time.perf_counter() - t0) * 1e3}
notes = {}
probe = probes.RealProbe()

def timed(name, fn):
    start = time.perf_counter()
    try:
        value = fn()
    except Exception as exc:
        value = exc
        notes[name] = "raised " + type(exc).__name__ + ": " + str(exc)
    out[name] = (time.perf_counter() - start) * 1e3
    return value

pynvml = timed("import_pynvml", lambda: __import__("pynvml"))
nvml = timed("nvml", probe.nvml)
if getattr(nvml, "error", None):
    notes["nvml"] = nvml.error
elif hasattr(nvml, "gpus"):
    notes["nvml"] = "%d GPU(s), driver %s" % (len(nvml.gpus), nvml.driver_version)
if hasattr(pynvml, "nvmlInit"):  # the driver's start-up alone, without the queries
    timed("nvml_init", lambda: (pynvml.nvmlInit(), pynvml.nvmlShutdown()))
timed("platform", probe.platform)
interp = timed("interpreter", lambda: probe.interpreter(None))
if hasattr(interp, "source"):
    own = getattr(probes, "read_own_interpreter", None)
    how = "read in-process" if own and own(interp.executable, interp.source) else "a subprocess"
    notes["interpreter"] = "%s (%s), %s: vllm %s" % (
        interp.executable, interp.source, how, interp.vllm_version
    )
timed("host_memory", probe.host_memory)
timed("port", lambda: probe.port("127.0.0.1", 8000))
timed("environ", probe.environ)
report = timed("run_checks", lambda: run_checks(probes.RealProbe(), Options()))
timed("render", lambda: render(report, OutputFormat.JSON))
out["notes"] = notes
print(json.dumps(out))
"""

# The real `check --format json` (the console script's main), each probe and run_checks wrapped
# to note when it ran: prints on stderr the wall clock (time.time()) of each mark, for offsets
# from the spawn.
TIMELINE = r"""
import time
marks = {"python up": time.time()}
import atexit, json, sys

spans = {}

def wrap(name, fn):
    def timed(*args, **kwargs):
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            spans.setdefault(name, (start, time.time()))
    return timed

def patch_probes(probes):
    class Timed(probes.RealProbe):
        pass
    for name in ("platform", "interpreter", "nvml", "host_memory", "port", "environ"):
        setattr(Timed, name, wrap(name, getattr(probes.RealProbe, name)))
    probes.RealProbe = Timed
    probes.read_nvml = wrap("read_nvml (NVML itself)", probes.read_nvml)

def patch_checks(checks):
    checks.run_checks = wrap("run_checks", checks.run_checks)

def patch_early(early):
    if hasattr(early, "_init"):
        early._init = wrap("early: import pynvml + nvmlInit", early._init)

class Seen:
    # Notes when the import of a module of interest begins, and patches two once they are
    # loaded, so that nothing of the doctor is imported before main() would import it.
    names = {
        "vllm_offload_doctor.cli": "cli import begins",
        "vllm_offload_doctor.checks.cli": "check command import begins",
        "pynvml": "pynvml import begins",
    }
    patches = {
        "vllm_offload_doctor.machine.probes": patch_probes,
        "vllm_offload_doctor.checks": patch_checks,
        "vllm_offload_doctor.machine.early": patch_early,
    }

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name in cls.names:
            marks.setdefault(cls.names[name], time.time())
        patch = cls.patches.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is not cls and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        else:
            return None
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, Seen)

def done():
    marks["exit handlers"] = time.time()
    sys.stderr.write("TIMELINE " + json.dumps({"marks": marks, "spans": spans}) + "\n")

atexit.register(done)  # registered first, so it runs last of the exit handlers
sys.argv = ["offload-doctor", "check", "--format", "json"]
from vllm_offload_doctor.__main__ import main
main()
"""

# The phases, in the order of the table: (key in the child's answer, label).
PHASE_ROWS = (
    ("imports", "imports (cli, check command, checks, probes)"),
    ("import_pynvml", "  probe: import pynvml"),
    ("nvml", "  probe: nvml (init + queries + shutdown)"),
    ("nvml_init", "    of which nvmlInit + nvmlShutdown alone"),
    ("platform", "  probe: platform"),
    ("interpreter", "  probe: interpreter (vLLM's Python)"),
    ("host_memory", "  probe: host_memory"),
    ("port", "  probe: port"),
    ("environ", "  probe: environ"),
    ("probes_sum", "  sum of the probes, one after another"),
    ("run_checks", "run_checks (every check, probes overlapped)"),
    ("render", "render JSON"),
)


class Run(NamedTuple):
    elapsed_ms: float
    rc: int
    stdout: str
    stderr: str
    spawned: float  # time.time() just before the spawn


def time_once(argv: list[str], env: dict[str, str]) -> Run:
    # In the tree timed: `python -m` puts the working directory first on sys.path.
    cwd = env["PYTHONPATH"].split(os.pathsep)[0]
    spawned = time.time()
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    elapsed = (time.perf_counter() - start) * 1e3
    return Run(elapsed, proc.returncode, proc.stdout, proc.stderr, spawned)


def timeline_offsets(run: Run) -> dict[str, float] | None:
    """Milliseconds from the spawn to each mark, and to the start and end of each span."""
    line = next((x for x in run.stderr.splitlines() if x.startswith("TIMELINE ")), None)
    if line is None:
        return None
    data = json.loads(line.removeprefix("TIMELINE "))
    out = {name: (t - run.spawned) * 1e3 for name, t in data["marks"].items()}
    for name, (start, end) in data["spans"].items():
        out[f"{name} start"] = (start - run.spawned) * 1e3
        out[f"{name} end"] = (end - run.spawned) * 1e3
    out["process exited"] = run.elapsed_ms
    return out


def stats(samples: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(samples), 1),
        "min_ms": round(min(samples), 1),
        "max_ms": round(max(samples), 1),
    }


def tree_env(tree: Path) -> dict[str, str]:
    """This tree first, then whatever the caller's path adds (a dependency installed with --target).

    Bytecode is cached as an installed package has it: PYTHONDONTWRITEBYTECODE would time the
    compiler on every run.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(tree), os.environ.get("PYTHONPATH"))))
    return env


def top_imports(argv: list[str], env: dict[str, str], count: int = 12) -> list[dict[str, object]]:
    """The top-level imports of one `-X importtime` run, largest cumulative first."""
    proc = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]],
        capture_output=True,
        text=True,
        env=env,
        cwd=env["PYTHONPATH"].split(os.pathsep)[0],
        check=False,
    )
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or line.endswith("imported package"):
            continue
        self_us, cumulative_us, name = line.removeprefix("import time:").split("|")
        if name.startswith("  "):  # nested: counted in its parent's cumulative time
            continue
        rows.append(
            {
                "module": name.strip(),
                "self_ms": int(self_us) / 1e3,
                "cumulative_ms": int(cumulative_us) / 1e3,
            }
        )
    return sorted(rows, key=lambda r: -float(r["cumulative_ms"]))[:count]  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="rounds (default 20)")
    parser.add_argument("--json", action="store_true", help="print only the JSON")
    parser.add_argument("-o", "--output", type=Path, help="write the JSON to this file too")
    parser.add_argument(
        "--no-gpu", action="store_true", help="do not run nvidia-smi (a machine without a GPU)"
    )
    parser.add_argument(
        "--baseline", type=Path, help="another tree (e.g. a checkout of main) to time alongside"
    )
    args = parser.parse_args()

    py = sys.executable
    check_argv = [py, "-m", "vllm_offload_doctor", "check", "--format", "json"]
    env = tree_env(ROOT)
    smi_path = None if args.no_gpu else shutil.which("nvidia-smi")
    commands: dict[str, tuple[list[str], dict[str, str]]] = {
        "check": (check_argv, env),
        "bare_python": ([py, "-c", "pass"], env),
        "phases": ([py, "-c", PHASES], env),
        "timeline": ([py, "-c", TIMELINE], env),
    }
    if smi_path:
        commands["nvidia_smi_q"] = ([smi_path, "-q"], env)
    if args.baseline:
        commands["baseline_check"] = (check_argv, tree_env(args.baseline.resolve()))

    for argv, cmd_env in commands.values():  # warm the page cache and the bytecode caches
        time_once(argv, cmd_env)
    walls: dict[str, list[float]] = {name: [] for name in commands}
    codes: dict[str, set[int]] = {name: set() for name in commands}
    phases: list[dict[str, float]] = []
    timelines: list[dict[str, float]] = []
    notes: dict[str, str] = {}
    for _ in range(args.n):
        for name, (argv, cmd_env) in commands.items():
            run = time_once(argv, cmd_env)
            walls[name].append(run.elapsed_ms)
            codes[name].add(run.rc)
            if name == "timeline" and (offsets := timeline_offsets(run)) is not None:
                timelines.append(offsets)
            if name == "phases" and run.rc == 0:
                answer = json.loads(run.stdout.strip().splitlines()[-1])
                notes = answer.pop("notes")
                answer["probes_sum"] = sum(
                    answer[k]
                    for k in ("nvml", "platform", "interpreter", "host_memory", "port", "environ")
                )
                phases.append(answer)

    if 3 in codes["check"] or 3 in codes.get("baseline_check", ()):
        # A bug of the doctor: the times would measure a crash.
        print("offload-doctor check crashed (exit 3); run it by hand to see why", file=sys.stderr)
        return 1
    if not phases:
        print("the phase run failed; run bench/bench_check.py's PHASES by hand", file=sys.stderr)
        return 1

    med = {name: statistics.median(samples) for name, samples in walls.items()}
    result: dict[str, object] = {
        "runs": args.n,
        "python": py,
        "python_version": ".".join(map(str, sys.version_info[:3])),
        "commands": {
            name: {**stats(walls[name]), "exit_codes": sorted(codes[name])} for name in commands
        },
        "phases_ms": {
            key: round(statistics.median(p.get(key, 0.0) for p in phases), 1)
            for key, _ in PHASE_ROWS
        },
        "phase_notes": notes,
        "timeline_ms": {
            key: round(statistics.median(t[key] for t in timelines), 1)
            for key in (timelines[0] if timelines else {})
            if all(key in t for t in timelines)
        },
        "doctor_over_bare_python_ms": round(med["check"] - med["bare_python"], 1),
    }
    if smi_path:
        result["ratio_check_over_smi_median"] = round(med["check"] / med["nvidia_smi_q"], 3)
    if args.baseline:
        result["ratio_check_over_baseline_median"] = round(med["check"] / med["baseline_check"], 3)
        result["baseline_tree"] = str(args.baseline)
    result["top_imports"] = top_imports(check_argv, env)

    text = json.dumps(result, indent=2)
    if args.output:
        args.output.write_text(text + "\n")
    if not args.json:
        print(table(result, smi_path is not None, args.baseline is not None))
        print()
    print(text)
    return 0


def table(result: dict[str, object], smi: bool, baseline: bool) -> str:
    cmds = result["commands"]
    phases = result["phases_ms"]
    assert isinstance(cmds, dict) and isinstance(phases, dict)
    lines = [f"runs: {result['runs']} rounds, interleaved; python {result['python_version']}"]
    lines.append(f"{'':<50} {'median ms':>10} {'min ms':>8}")

    def row(label: str, name: str) -> None:
        c = cmds[name]
        lines.append(f"{label:<50} {c['median_ms']:>10.0f} {c['min_ms']:>8.0f}")

    row("offload-doctor check --format json", "check")
    if baseline:
        row("baseline tree: check --format json", "baseline_check")
    if smi:
        row("nvidia-smi -q", "nvidia_smi_q")
    row("bare python (python -c pass)", "bare_python")
    lines.append(f"{'check - bare python':<50} {result['doctor_over_bare_python_ms']:>10.0f}")
    lines.append("phases (one interpreter, each probe alone; median):")
    for key, label in PHASE_ROWS:
        lines.append(f"  {label:<48} {phases[key]:>10.1f}")
    timeline = result["timeline_ms"]
    assert isinstance(timeline, dict)
    if timeline:
        lines.append("timeline of one real check (ms from the spawn; median), in order:")
        rows: list[tuple[float, str, str]] = []
        for key, t in timeline.items():
            if key.endswith(" end"):
                continue
            if key.endswith(" start"):
                span, end = key.removesuffix(" start"), timeline[key.replace(" start", " end")]
                rows.append((t, f"{span}: {t:.1f} to {end:.1f}", f"{end - t:>10.1f}"))
            else:
                rows.append((t, key, f"{t:>10.1f}"))
        lines.extend(f"  {label:<48} {figure}" for _, label, figure in sorted(rows))
    notes = result["phase_notes"]
    assert isinstance(notes, dict)
    lines.extend(f"  note, {k}: {v}" for k, v in notes.items())
    if smi:
        lines.append(
            f"ratio check / nvidia-smi -q (median): {result['ratio_check_over_smi_median']:.2f}"
            " (goal <= 2, issue 17)"
        )
    else:
        lines.append("no nvidia-smi timed (--no-gpu or none on PATH)")
    if baseline:
        lines.append(
            f"ratio check / baseline tree (median): {result['ratio_check_over_baseline_median']:.2f}"
        )
    lines.append("largest top-level imports of one check (-X importtime, cumulative ms):")
    top = result["top_imports"]
    assert isinstance(top, list)
    lines.extend(f"  {r['module']:<48} {r['cumulative_ms']:>10.1f}" for r in top)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
