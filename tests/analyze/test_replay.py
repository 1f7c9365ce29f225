"""A line applied from the plan kept for an earlier line with the same key (repeats.py) leaves the
engine's state exactly as feeding it in full does: facts and their evidence, ranks, frames,
clues, rule hits, notable lines, times, on every fixture and corpus log as a crash loop (pids
and times changed) and on crafted lines whose text or pid a repeat must rebuild."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from crash_loops import crash_loop

from vllm_offload_doctor.analyze import engine as analyze
from vllm_offload_doctor.analyze import repeats
from vllm_offload_doctor.analyze.normalize import split_long
from vllm_offload_doctor.analyze.render import Renderer

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT.parent / "shared" / "corpus"
LOGS = sorted(
    [
        *ROOT.glob("fixtures/**/*.log"),
        *ROOT.glob("tests/pasted/*.log"),
        *ROOT.glob("tests/unseen/*.log"),
        *(CORPUS.glob("*.log") if CORPUS.is_dir() else ()),
    ]
)


def _plain(value: Any) -> Any:
    """A comparable form of the state's values (dataclasses, deques, rules by id)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ == "deque":
        return [_plain(v) for v in value]
    if hasattr(value, "id") and hasattr(value, "patterns"):
        return value.id
    return value


def _snapshot(state: analyze._State) -> dict[str, Any]:
    collector = dict(vars(state.collector))
    keep = ("ready_line", "first_fatal_line", "v2_banner", "loading_4dp", "first_stamp",
            "last_stamp", "stamp_text", "interrupt_after", "alarm_after_up", "notable_first",
            "notable_last", "recent", "gave_up", "saw_level", "last_no", "run_sig")  # fmt: skip
    return _plain(
        {
            "collector": collector,
            "clues": state.clues,
            "hits": {k: (h.evidence, h.groups, h.count, h.context) for k, h in state.hits.items()},
            "runs": state.runs.entries,
            **{k: getattr(state, k) for k in keep},
        }
    )


def _fed(lines: Iterable[str], replay: bool) -> tuple[dict[str, Any], str]:
    engine = analyze.default_engine()
    state = analyze._State(engine.rules, engine.knowledge, engine.visible, engine.fast)
    state.replay = replay
    for no, raw in enumerate(lines, start=1):
        for part in split_long(raw.rstrip("\n")):
            state.feed_raw(no, part)
    seen = _snapshot(state)
    result = state.finish("log", lines_read=state.last_no)
    return seen, Renderer(color=False).json([result], [])


def _agree(lines: list[str]) -> int:
    """Asserts both paths agree; returns how many lines were applied from a kept plan."""
    calls = {"started": 0, "fed": 0}
    started, fed = analyze._State.feed_started, analyze._State.feed

    def count_started(self: analyze._State, no: int, raw: str) -> None:
        calls["started"] += 1
        started(self, no, raw)

    def count_fed(self: analyze._State, line: Any) -> Any:
        calls["fed"] += 1
        return fed(self, line)

    full = _fed(lines, replay=False)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(analyze._State, "feed_started", count_started)
        m.setattr(analyze._State, "feed", count_fed)
        replayed = _fed(lines, replay=True)
    assert replayed[0] == full[0]
    assert replayed[1] == full[1]
    return calls["started"] - calls["fed"]


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_a_crash_loop_applied_from_plans_is_what_feeding_it_gives(log: Path) -> None:
    _agree(crash_loop(log.read_bytes().decode("utf-8", "replace"), 3))


# A start whose workers print the same lines under their own pids (a fact's rank is per pid for
# Ray's workers), lines cleaned before they are read (ANSI after the vLLM prefix, a compose
# prefix, a stray CR), records without a process prefix (V0's, or after a compose prefix) whose
# times differ, records cut off after their time (the message holds the time), fact lines of
# every kind, and a Ctrl+C that reads the last time.
CRAFTED = """\
(APIServer pid=11) INFO 12-02 10:00:00 [api_server.py:1] vLLM API server version 0.25.1
(APIServer pid=11) INFO 12-02 10:00:00 [utils.py:1] non-default args: {'model': '/m', 'cpu_offload_gb': 4}
(RayWorkerWrapper pid=21) INFO 12-02 10:00:01 [base.py:123] Offloader set to UVAOffloader
(RayWorkerWrapper pid=22) INFO 12-02 10:00:01 [base.py:123] Offloader set to UVAOffloader
(RayWorkerWrapper pid=21) INFO 12-02 10:00:02 [uva.py:58] Total CPU offloaded parameters: 0.51
(RayWorkerWrapper pid=22) INFO 12-02 10:00:02 [uva.py:58] Total CPU offloaded parameters: 0.75
(RayWorkerWrapper pid=21) INFO 12-02 10:00:03 [gpu_model_runner.py:1] \x1b[1mModel loading took 0.62 GiB memory and 1.2 seconds\x1b[0m
(RayWorkerWrapper pid=22) INFO 12-02 10:00:03 [gpu_model_runner.py:1] \x1b[1mModel loading took 0.71 GiB memory and 1.2 seconds\x1b[0m
vllm-1  | INFO 12-02 10:00:04 [kv_cache_utils.py:1] Available KV cache memory: 3.20 GiB\r
(EngineCore pid=31) INFO 12-02 10:00:04 [kv_cache_utils.py:1] GPU KV cache size: 41,200 tokens
(EngineCore pid=31) INFO 12-02 10:00:05 [core.py:1] init engine (profile, create kv cache, warmup model) took 9.10 seconds
(APIServer pid=11) INFO 12-02 10:00:06 [launcher.py:1] Application startup complete.
(EngineCore pid=31) INFO 12-02 10:00:06 [gpu_model_runner.py:
(EngineCore pid=31) INFO 12-02 10:00:07 [gpu_model_runner.py:
WARNING 12-02 10:00:06 cut off
WARNING 12-02 10:00:07 cut off
INFO 12-02 10:00:06 worker.py:267] Memory profiling takes 3.25 seconds
INFO 12-02 10:00:07 worker.py:267] Memory profiling takes 3.25 seconds
INFO 12-02 10:00:07 executor_base.py:111] # cuda blocks: 4681, # CPU blocks: 4681
vllm-1  | ERROR 12-02 10:00:07 [core.py:390] \x1b[31mAssertionError: CPU tensor must be pinned\x1b[0m
vllm-1  | ERROR 12-02 10:00:08 [core.py:390] \x1b[31mAssertionError: CPU tensor must be pinned\x1b[0m
vllm-1  | ERROR 12-02 10:00:08 [core.py:390] RuntimeError: tensor not pinned
vllm-1  | ERROR 12-02 10:00:09 [core.py:390] RuntimeError: tensor not pinned
(RayWorkerWrapper pid=21) ERROR 12-02 10:00:07 [worker.py:1] \x1b[31mRuntimeError: worker failed\x1b[0m
(RayWorkerWrapper pid=22) ERROR 12-02 10:00:07 [worker.py:1] \x1b[31mRuntimeError: worker failed\x1b[0m
vllm-1  | ValueError: compose worker failed\r
vllm-1  | ValueError: compose worker failed\r
(EngineCore pid=31) ERROR 12-02 10:00:07 [core.py:1] EngineCore encountered a fatal error.
(EngineCore pid=31) ERROR 12-02 10:00:07 [core.py:1] Traceback (most recent call last):
(EngineCore pid=31) ERROR 12-02 10:00:07 [core.py:1]   File "/v/worker/gpu_model_runner.py", line 1, in execute_model
(EngineCore pid=31) ERROR 12-02 10:00:07 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free.
(APIServer pid=11) ERROR 12-02 10:00:08 [core_client.py:1] Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.
(APIServer pid=11) INFO 12-02 10:00:09 [launcher.py:1] Shutting down FastAPI HTTP server.
^C(APIServer pid=11) INFO 12-02 10:00:10 [launcher.py:1] Aborted!
"""


def test_crafted_repeats_applied_from_plans_are_what_feeding_them_gives() -> None:
    lines = crash_loop(CRAFTED, 4)
    assert _agree(lines) > len(lines) // 2


@pytest.mark.parametrize("mistake", ["text", "pid", "time in the message", "record"])
def test_the_crafted_repeats_catch_a_plan_that_rebuilds_its_line_wrongly(
    mistake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check above is worth something only if a repeat given the first sight's text, pid or
    # message would show.
    real = analyze._replayable

    def careless(
        plan: Any, line: Any, raw: str, start: int, end: int, prefix: bool, timed: bool
    ) -> Any:
        if mistake == "time in the message":
            prefix = False
        plan = real(plan, line, raw, start, end, prefix, timed)
        if plan is not None and mistake == "text":
            plan.tail, plan.start = None, 0
        elif plan is not None and mistake == "pid":
            plan.pid_in_head = False
        return plan

    monkeypatch.setattr(analyze, "_replayable", careless)
    if mistake == "record":  # a record cut off after its time taken as read
        monkeypatch.setattr(analyze, "_recorded", lambda line: True)
    lines = crash_loop(CRAFTED, 4)
    assert _fed(lines, replay=True) != _fed(lines, replay=False)


def test_a_plan_is_kept_from_a_lines_second_sight() -> None:
    # Most lines of an error-dense log never come again: keeping theirs only cost memory.
    engine = analyze.default_engine()
    state = analyze._State(engine.rules, engine.knowledge, engine.visible, engine.fast)
    line = "(EngineCore pid=7) ERROR 12-02 10:00:00 [core.py:1] RuntimeError: boom 1f"
    known = repeats.split(line)[1]
    state.feed_raw(1, line)
    assert state.plans.get(known) is None
    state.feed_raw(2, line.replace("pid=7", "pid=8"))
    assert isinstance(state.plans.get(known), repeats.Plan)


def test_a_pasted_report_line_is_fed_in_full_every_time() -> None:
    # Its reading depends on the reports read before it, so no plan is kept for it.
    engine = analyze.default_engine()
    state = analyze._State(engine.rules, engine.knowledge, engine.visible, engine.fast)
    prompt = "$ vllm serve /m --cpu-offload-gb 4"
    for no in (1, 2):
        state.feed_raw(no, prompt)
    assert state.plans.entries[repeats.key(prompt)][1] is None
    assert json.loads(_fed([prompt] * 3, True)[1]) == json.loads(_fed([prompt] * 3, False)[1])
