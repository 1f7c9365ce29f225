"""Crafted long lines (>= 256 KB) against every pattern of the package: bounded work, right answers.

Lines are built to make a backtracking regex work hard: a pattern's own literal words followed
by long runs of spaces, letters, brackets, `key=value,` pairs, or the word glued to itself.
Nothing here times anything: the runs happen in a subprocess whose generous limit only guards
against a hang (a quadratic pattern takes minutes on one such line, the whole run seconds).
bench/bench_hostile.py prints the time per MB, before and after.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from vllm_offload_doctor.analyze import engine as analyze
from vllm_offload_doctor.analyze.knowledge import builtin_knowledge
from vllm_offload_doctor.analyze.patterns import MAX_TEXT, Bounded, declared

ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 120
LONG = 256 * 1024

SHAPES = """
def shapes(word, n):
    reps = max(1, n // (len(word) + 1))
    return [word + " " * n, " " * n + word, (word + " ") * reps, word * reps, word + "A" * n,
            word + "1." * (n // 2), word + "\\t" * n + "x", word + "(" * n, word + "[" * n,
            word + "{'a': " * (n // 6), word + "a=1, " * (n // 5), word + "'a'," * (n // 4),
            word + " " * n + word + " x", "x" + " " * (n // 2) + word + " " * (n // 2)]
"""

# Every family, as the engine calls it, on every crafted line of every pattern's words.
EVERY_PATTERN = (
    SHAPES
    + """
import json
from vllm_offload_doctor.analyze import engine as analyze
from vllm_offload_doctor.analyze import normalize
from vllm_offload_doctor.analyze.facts import FactCollector
from vllm_offload_doctor.analyze.patterns import declared
engine = analyze.Engine()
know = engine.knowledge
runs = {"normalize": 0, "declared": 0, "rules": 0, "knowledge": 0, "collector": 0}
words = set()
for d in declared():
    words.update(d.words)
    for line in shapes(d.words[0], LONG):
        d.search(line); d.match(line); runs["declared"] += 1
for rule in engine.rules:
    words.update(rule.keywords[:3])
    for line in shapes(rule.keywords[0], LONG) if rule.patterns else ():
        rule.search(line); runs["rules"] += 1
for kw in (*know.wrapper_keywords, *know.death_keywords, "load_model(", "x = y.load_model("):
    for line in shapes(kw, LONG):
        know.wrappers.search(line); know.deaths.search(line); know.call_pattern.match(line)
        runs["knowledge"] += 1
for word in sorted(words)[:: max(1, len(words) // 40)]:
    for line in shapes(word, LONG):
        for part in normalize.split_long(line):
            parsed = normalize.parse(1, part)
            FactCollector().feed(parsed)
            runs["collector"] += 1
        runs["normalize"] += 1
runs["patterns"] = len(declared())
runs["rule patterns"] = sum(1 for r in engine.rules if r.patterns)
print(json.dumps(runs))
"""
)


def _python(code: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=True,
        cwd=ROOT,
    )
    return proc.stdout


def test_every_pattern_meets_long_crafted_lines() -> None:
    runs = json.loads(_python(f"LONG = {LONG}\n" + EVERY_PATTERN))
    assert runs["patterns"] == len(declared()) > 40
    assert runs["declared"] >= 13 * runs["patterns"]
    assert runs["rules"] >= 13 * runs["rule patterns"] > 13 * 20
    assert all(runs[family] > 0 for family in runs), runs


def test_rule_and_knowledge_patterns_are_bounded() -> None:
    # RE2 (linear) where the pattern fits; the rest keep `regex` under a timeout; all capped.
    engine = analyze.default_engine()
    know = builtin_knowledge()
    patterns = [p for r in engine.rules for p in r.patterns]
    patterns += [know.wrappers, know.deaths, know.call_pattern]
    assert all(isinstance(p, Bounded) for p in patterns)
    linear = [p for p in patterns if p.linear]
    assert len(linear) >= len(patterns) - 3, [p.pattern for p in patterns if not p.linear]


def test_a_pattern_sees_at_most_max_text() -> None:
    assert Bounded("needle").search("needle") is not None
    assert Bounded("needle").search("x" * MAX_TEXT + "needle") is None
    d = next(d for d in declared() if d.rx.search(d.words[0]))  # a pattern matching its own word
    assert d.search(d.words[0]) is not None
    assert d.search(" " * MAX_TEXT + d.words[0]) is None


def _log_with_hostile_lines(tmp_path: Path) -> Path:
    base = (ROOT / "fixtures" / "logs" / "oom-weights-0.25.1.log").read_text(encoding="utf-8")
    prefix = "(APIServer pid=7) INFO 11-29 15:50:18 [utils.py:1] "
    token = "TOKEN" + "x" * LONG
    hostile = [
        prefix + "version" + " " * LONG,
        prefix + "x" + " " * LONG + "version" + " " * LONG,  # quadratic before: 289 s for 250 KB
        prefix + "non-default args: {'cpu_offload_gb': 4, 'api_key': '" + token + "'}",  # was 216 s
        prefix + "    " + " " * LONG + "model = load_model(",  # the failing-call pattern
        prefix + "Offload" * (LONG // 7),  # OFF003's `offload\\w*.{0,60}`
        prefix + "kv_transfer_config " + "A" * LONG + "OffloadingConnector",
        prefix + "args: Namespace(" + "a=1, " * (LONG // 5),
        prefix + "Error: " + "{'a': " * (LONG // 6),
        prefix + "ERROR" + "\t" * LONG + "x",
    ]
    lines = base.rstrip("\n").split("\n")
    # The hostile lines come before the failure, as noise in a real log would.
    text = "\n".join(lines[:5] + hostile + lines[5:]) + "\n"
    path = tmp_path / "hostile.log"
    path.write_text(text, encoding="utf-8")
    return path


def test_analyze_of_hostile_lines_completes_with_the_right_verdict(tmp_path: Path) -> None:
    log = _log_with_hostile_lines(tmp_path)
    assert log.stat().st_size > 2 * 1024 * 1024
    code = (
        "import sys; from vllm_offload_doctor.cli import main; "
        "sys.argv = ['offload-doctor', 'analyze', '--format', 'json', sys.argv[1]]; main()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(log)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        cwd=ROOT,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]  # a failure was found
    result = json.loads(proc.stdout)["results"][0]
    assert result["verdict"]["category"] == "oom_weights"
    facts = result["facts"]
    assert facts["vllm_version"] == "0.25.1"  # from the banner, not from `version` + spaces
    assert facts["cpu_offload_gb"] == 4  # read from the capped args dict before the long token
    assert facts["model"] == "/tmp/qwen3-81b-shape"
