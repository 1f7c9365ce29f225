"""The fast paths give what the line-by-line engine (OFFLOAD_DOCTOR_PURE=1) gives, byte for byte.

Every fixture, pasted, unseen and corpus log, as it is and as a crash loop (each restart with
other pids and times), is analysed by both engines and rendered as analyze's JSON. Crafted
loops change one restart in a way that matters (a number, a pid pattern, a digit a prefilter
word holds): a comparison that ignored it would merge that restart with the one before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_offload_doctor.analyze import engine as analyze
from vllm_offload_doctor.analyze import runs
from vllm_offload_doctor.analyze.render import Renderer

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT.parent / "shared" / "corpus"
LOGS = sorted(
    [
        *ROOT.glob("fixtures/**/*.log"),
        *ROOT.glob("tests/pasted/*.log"),
        *ROOT.glob("tests/unseen/*.log"),
    ]
)
CORPUS_LOGS = sorted(CORPUS.glob("*.log")) if CORPUS.is_dir() else []
OOM = ROOT / "fixtures" / "logs" / "oom-weights-0.25.1.log"
HEALTHY = ROOT / "fixtures" / "logs" / "healthy-0.25.1.log"
_PID = re.compile(r"pid=(\d+)")
_SECOND = re.compile(r"(\d\d-\d\d \d\d:\d\d):(\d\d)")


# A rule whose keyword holds digits (the built-in ones are all found by a word without digits too).
DIGIT_RULE = """id = "ZZ401"
name = "client-denied"
title = "Denied"
severity = "error"
category = "model_download"
precedence = 84
keywords = ["401 Client"]
patterns = ['40[13] Client']
message = "denied"
remedy = "none"
"""


def _pair(rule_dirs: list[Path]) -> tuple[analyze.Engine, analyze.Engine]:
    fast, pure = (
        analyze.Engine(extra_rule_dirs=rule_dirs),
        analyze.Engine(extra_rule_dirs=rule_dirs),
    )
    pure.fast = False
    assert fast.fast
    return fast, pure


@pytest.fixture(scope="module", autouse=True)
def _hyperscan_for_every_block() -> Iterator[None]:
    # The fast engine scans a block of 1 MiB or more with Hyperscan, and selects the rule patterns
    # a line may match with Hyperscan after INDEX_AFTER lines: here every block, from the first line.
    with pytest.MonkeyPatch.context() as m:
        m.setattr(analyze, "HYPERSCAN_BLOCK", 0)
        m.setattr(analyze, "INDEX_AFTER", 1)
        yield


@pytest.fixture(scope="module")
def engines() -> tuple[analyze.Engine, analyze.Engine]:
    return _pair([])


@pytest.fixture(scope="module")
def crafted_engines(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[analyze.Engine, analyze.Engine]:
    rules = tmp_path_factory.mktemp("rules")
    (rules / "ZZ401-client-denied.toml").write_text(DIGIT_RULE, encoding="utf-8")
    return _pair([rules])


def _json(engine: analyze.Engine, path: Path) -> str:
    return Renderer(color=False).json([engine.analyze_file(path, display_name="log")], [])


def restart(text: str, r: int) -> str:
    """Restart number r of a crash loop: other pids (as many digits) and times."""
    block = _PID.sub(lambda m: f"pid={int(m[1]) + r}", text)
    block = _SECOND.sub(lambda m: f"{m[1]}:{(int(m[2]) + 7 * r) % 60:02d}", block)
    return block if block.endswith("\n") else block + "\n"


def loop(text: str, restarts: int) -> str:
    return "".join(restart(text, r) for r in range(restarts))


def _agree(engines: tuple[analyze.Engine, analyze.Engine], path: Path) -> str:
    fast, pure = engines
    out = _json(fast, path)
    assert out == _json(pure, path), path.name
    return out


def _echoes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lines at which the fast path skipped a start (engine._State.echo_start)."""
    seen: list[int] = []
    real = analyze._State.echo_start

    def watch(self: analyze._State, no: int, *args: object) -> None:
        seen.append(no)
        real(self, no, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(analyze._State, "echo_start", watch)
    return seen


@pytest.mark.parametrize("log", LOGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_fixture_logs_agree(engines: tuple[analyze.Engine, analyze.Engine], log: Path) -> None:
    _agree(engines, log)


@pytest.mark.parametrize("log", LOGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_fixture_loops_agree(
    engines: tuple[analyze.Engine, analyze.Engine], log: Path, tmp_path: Path
) -> None:
    path = tmp_path / "loop.log"
    path.write_text(loop(log.read_text(encoding="utf-8", errors="replace"), 5), encoding="utf-8")
    _agree(engines, path)


@pytest.mark.skipif(not CORPUS_LOGS, reason="../shared/corpus is absent (it lives beside the repo)")
def test_corpus_logs_and_their_loops_agree(
    engines: tuple[analyze.Engine, analyze.Engine], tmp_path: Path
) -> None:
    path = tmp_path / "loop.log"
    for log in CORPUS_LOGS:
        _agree(engines, log)
        path.write_text(loop(log.read_text(encoding="utf-8", errors="replace"), 5), "utf-8")
        _agree(engines, path)


def test_a_crash_loop_is_echoed_and_agrees(
    engines: tuple[analyze.Engine, analyze.Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    echoed = _echoes(monkeypatch)
    path = tmp_path / "loop.log"
    path.write_text(loop(OOM.read_text(encoding="utf-8"), 8), encoding="utf-8")
    out = json.loads(_agree(engines, path))
    lines = OOM.read_text(encoding="utf-8").count("\n")
    # Restarts 3 to 7 are skipped: the 2nd is the echo start, the last is judged as it ends. Each
    # start begins at its banner (line 3 of a restart).
    assert echoed == [lines * k + 3 for k in range(3, 8)]
    assert out["results"][0]["verdict"]["category"] == "oom_weights"
    assert [r["starts"] for r in out["results"][0]["runs"]] == [8]


def _crafted(kind: str) -> str:
    text = OOM.read_text(encoding="utf-8")
    # Offload asked for, so that a restart asking for none ends another way.
    text = text.replace("non-default args: {", "non-default args: {'cpu_offload_gb': 4, ", 1)
    blocks = [restart(text, r) for r in range(8)]
    if kind == "offload number":  # one restart asks for no offload
        blocks[4] = blocks[4].replace("'cpu_offload_gb': 4,", "'cpu_offload_gb': 0,")
    elif kind == "second engine pid":  # its engine core logs under another pid once it failed
        head, sep, tail = blocks[4].partition("torch.OutOfMemoryError")
        blocks[4] = head + sep + tail.replace("(EngineCore pid=1046)", "(EngineCore pid=1099)")
    elif kind == "digit word in a time":  # the time's fraction makes the word '401 Client'
        # A start cut off while loading: the line (fed only where the word is) decides it.
        text = "\n".join(text.split("\n")[:24]) + "\n"
        blocks = [
            restart(text, r) + f"(APIServer pid=1) INFO 11-29 15:50:18.40{r} Client denied\n"
            for r in range(8)
        ]
    return "".join(blocks)


CRAFTED = ("offload number", "second engine pid", "digit word in a time")


@pytest.mark.parametrize("kind", CRAFTED)
def test_crafted_loops_agree(
    crafted_engines: tuple[analyze.Engine, analyze.Engine], kind: str, tmp_path: Path
) -> None:
    path = tmp_path / "loop.log"
    path.write_text(_crafted(kind), encoding="utf-8")
    _agree(crafted_engines, path)


@pytest.mark.parametrize("kind", CRAFTED)
def test_the_crafted_loops_catch_a_comparison_that_ignores_the_change(
    crafted_engines: tuple[analyze.Engine, analyze.Engine],
    kind: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The check above is worth something only if merging that restart would show.
    path = tmp_path / "loop.log"
    path.write_text(_crafted(kind), encoding="utf-8")
    fast, pure = crafted_engines
    expected = _json(pure, path)

    def careless(self: runs.Echo, block: bytes, at: int, digits: object) -> object:
        # The same shape, every digit free: pids paired by place, not one to one.
        window = block[at : at + self.size]
        if len(window) != self.size:
            return None
        if self.window is not None:
            self._prepare(self.window, digits)  # type: ignore[arg-type]
        if window.translate(runs._BLIND) != self.blind:
            return None
        rename = {
            a.decode(): b.decode()
            for a, b in zip(self.pids, runs._PIDS.findall(window), strict=True)
        }
        _, pids, head = self.splitter
        m = runs._PID.match(head)
        return {p: p for p in (*pids.values(), *((m[2],) if m else ()))} | rename

    monkeypatch.setattr(runs.Echo, "rename", careless)
    assert _json(fast, path) != expected


def _wrapping(text: str, restarts: int, pids: tuple[int, ...]) -> str:
    """A crash loop whose container reuses pids: restart r adds pids[r % len(pids)], so the
    starts change their pids' number of digits and come back to it."""
    out = []
    for r in range(restarts):
        block = _PID.sub(lambda m, r=r: f"pid={int(m[1]) + pids[r % len(pids)]}", text)
        block = _SECOND.sub(lambda m, r=r: f"{m[1]}:{(int(m[2]) + 7 * r) % 60:02d}", block)
        out.append(block if block.endswith("\n") else block + "\n")
    return "".join(out)


def test_a_loop_whose_pids_change_their_digits_is_echoed_and_agrees(
    engines: tuple[analyze.Engine, analyze.Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = OOM.read_text(encoding="utf-8")
    low = min(int(p) for p in _PID.findall(text))
    # 3-digit pids, then 4-digit ones, then 3 again: four shapes of a start and its successor's
    # first line (3-3, 3-4, 4-4, 4-3), each met again every cycle.
    shift = (100 - low, 103 - low, 1100 - low, 1103 - low)
    echoed = _echoes(monkeypatch)
    path = tmp_path / "loop.log"
    path.write_text(_wrapping(text, 24, shift), encoding="utf-8")
    out = json.loads(_agree(engines, path))
    assert [r["starts"] for r in out["results"][0]["runs"]] == [24]
    # Every start from the 6th on is echoed: each shape was kept the first time it was fed.
    lines = text.count("\n")
    assert set(echoed) >= {lines * k + 3 for k in range(6, 24)}


def test_a_restart_that_straddles_two_blocks_is_echoed_and_agrees(
    engines: tuple[analyze.Engine, analyze.Engine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_offload_doctor.analyze import logread

    text = OOM.read_text(encoding="utf-8")
    # Blocks of about 2.5 starts: most block ends cut a restart in two.
    monkeypatch.setattr(logread, "BLOCK", len(text.encode()) * 5 // 2)
    echoed = _echoes(monkeypatch)
    path = tmp_path / "loop.log"
    path.write_text(loop(text, 20), encoding="utf-8")
    out = json.loads(_agree(engines, path))
    assert [r["starts"] for r in out["results"][0]["runs"]] == [20]
    lines = text.count("\n")
    assert echoed == [lines * k + 3 for k in range(3, 20)]
