"""The literal prefilter gives the same verdicts with RE2 and with the `re` fallback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from shared_corpus import CORPUS

from vllm_offload_doctor.analyze import engine as analyze
from vllm_offload_doctor.analyze import patterns

EXAMPLES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def _logs() -> list[Path]:
    logs = sorted(EXAMPLES.glob("*.log"))
    if CORPUS.is_dir():
        logs += sorted(CORPUS.glob("*.log"))
    return logs


def _verdicts(engine: analyze.Engine) -> list[tuple[str, str, str]]:
    out = []
    for log in _logs():
        a = engine.analyze_file(log)
        out.append((log.name, a.verdict.category.value, a.offload.status.value))
    return out


def test_re2_and_re_fallback_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("re2", reason="google-re2 has no wheel for this platform")
    with_re2 = analyze.Engine()
    assert type(with_re2._prefilter).__module__.startswith("re2")
    monkeypatch.setitem(sys.modules, "re2", None)  # import re2 now fails: the fallback
    # Matchers are compiled once per process: a process without RE2 never had RE2 ones.
    patterns._literal_matcher.cache_clear()
    try:
        with_re = analyze.Engine()
        assert type(with_re._prefilter).__module__ == "re"
        assert _verdicts(with_re2) == _verdicts(with_re)
    finally:
        patterns._literal_matcher.cache_clear()


def test_serving_stats_lines_are_not_candidates() -> None:
    engine = analyze.Engine()
    stats = (
        b"(APIServer pid=1) INFO 11-29 15:20:15 [loggers.py:257] Engine 000: Avg prompt throughput: "
        b"2.1 tokens/s, Avg generation throughput: 3.2 tokens/s, Running: 0 reqs, Waiting: 0 reqs, "
        b"GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%"
    )
    # A stats line proves the engine ran requests (readiness): a candidate only until then.
    assert engine._prefilter.search(stats) is not None
    assert engine._prefilter_served.search(stats) is None
    access = (
        b'(APIServer pid=1) INFO:     127.0.0.1:39388 - "POST /v1/chat/completions HTTP/1.1" 200 OK'
    )
    assert engine._prefilter.search(access) is not None  # until the first served request
    assert engine._prefilter_served.search(access) is None
