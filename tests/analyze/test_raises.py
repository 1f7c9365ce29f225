"""The catalogue lends verdicts: an exception whose message only config / argument checks raise.

Cases are built from the catalogue's own templates, filled with sample values and set in the log
prefixes of several vLLM releases; a specific rule still wins, and a short template never lends.
"""

from __future__ import annotations

import pytest

from vllm_offload_doctor.analyze import catalogue
from vllm_offload_doctor.analyze.engine import analyze_lines
from vllm_offload_doctor.analyze.knowledge import builtin_knowledge
from vllm_offload_doctor.analyze.model import Analysis, Category
from vllm_offload_doctor.analyze.raises import (
    MIN_LITERAL,
    RaiseMap,
    build,
    builtin_raises,
    template_regex,
)
from vllm_offload_doctor.analyze.verdict import RAISE_PRECEDENCE

CAT = catalogue.load()
RAISES = builtin_raises()

# How an engine's exception line looks in each generation of vLLM's logs.
PREFIXES = {
    "0.4-0.6": ["INFO 07-01 10:00:00 [api_server.py:100] vLLM API server version {v}", "{exc}"],
    "0.8": [
        "INFO 04-17 15:10:00 [api_server.py:1000] vLLM API server version {v}",
        "ERROR 04-17 15:10:09 [engine.py:448] {exc}",
    ],
    "0.10": [
        "(APIServer pid=11) INFO 09-03 11:03:22 [api_server.py:1805] vLLM API server version {v}",
        "(EngineCore_0 pid=1810465) ERROR 09-03 11:03:37 [core.py:712] EngineCore failed to start.",
        "(EngineCore_0 pid=1810465) ERROR 09-03 11:03:37 [core.py:712] {exc}",
    ],
    "0.11+ (docker)": [
        "[2026-02-24T20:21:52Z] (APIServer pid=1) INFO 02-24 12:21:52 [api_server.py:1896] vLLM API server version {v}",
        "[2026-02-24T20:21:58Z] (EngineCore_DP0 pid=6940) {exc}",
    ],
}


def _log(prefix: str, exc: str, version: str) -> list[str]:
    return [line.format(v=version, exc=exc) for line in PREFIXES[prefix]]


def _bare(message: catalogue.Message) -> str:
    """The message filled with sample values, as its exception line shows it."""
    text = catalogue.samples(message)[0].split("\n", 1)[0]
    return f"{message.type}: {text}"


def _lent(a: Analysis) -> bool:
    """Whether the catalogue lent the top finding (a rule that reads the line decides first)."""
    return bool(a.findings) and a.findings[0].precedence == RAISE_PRECEDENCE


def _sampled() -> list[tuple[str, catalogue.Message]]:
    """Every 25th lending message, with a log prefix in turn (deterministic)."""
    lent = {r.template for r in RAISES.raised}
    msgs = [m for m in CAT.messages if m.kind == "raise" and m.template in lent]
    prefixes = list(PREFIXES)
    return [(prefixes[i % len(prefixes)], m) for i, m in enumerate(msgs[::25])]


@pytest.mark.parametrize(
    ("prefix", "message"), _sampled(), ids=lambda x: x if isinstance(x, str) else x.where()
)
def test_catalogued_config_message_gives_bad_args(prefix: str, message: catalogue.Message) -> None:
    exc = _bare(message)
    a = analyze_lines(_log(prefix, exc, message.last))
    if a.findings and a.findings[0].precedence > RAISE_PRECEDENCE:
        assert a.verdict.category is not Category.CRASH_OTHER  # a specific rule decides
        return
    # The subsystem whose modules raise it names the category: config validation gives bad_args.
    lends = {r.entry.category for r in RAISES.raised if r.template == message.template}
    assert _lent(a) and lends == {a.verdict.category}, (exc, a.verdict)
    top = a.findings[0]
    assert "vLLM raises this message in " in top.message and "releases " in top.message
    assert top.evidence[-1].text.endswith(exc)


def test_most_samples_are_decided_by_the_catalogue() -> None:
    lent = [m for prefix, m in _sampled() if _lent(analyze_lines(_log(prefix, _bare(m), m.last)))]
    assert len(lent) >= 0.8 * len(_sampled())
    assert {"config", "engine"} <= {m.file.split("/")[1] for m in lent}


def test_message_from_another_subsystem_does_not_lend() -> None:
    lent = {r.template for r in RAISES.raised}
    other = next(
        m
        for m in CAT.messages
        if m.kind == "raise"
        and m.file.startswith("vllm/v1/worker/")
        and template_regex(m.template)[1] >= 40
        and m.template not in lent
    )
    a = analyze_lines(_log("0.10", _bare(other), other.last))
    assert not _lent(a) and a.verdict.category is Category.CRASH_OTHER, (other.template, a.verdict)


def test_uncatalogued_error_stays_crash_other() -> None:
    exc = "ValueError: The widget registry could not be reconciled with the current plugin list."
    assert RAISES.find(exc.partition(": ")[2]) is None
    assert analyze_lines(_log("0.8", exc, "0.8.4")).verdict.category is Category.CRASH_OTHER


def test_short_templates_never_lend() -> None:
    assert all(template_regex(r.template)[1] >= MIN_LITERAL for r in RAISES.raised)
    lenders = [e for e in builtin_knowledge().frames if e.raises]
    short = [
        m
        for m in CAT.messages
        if m.kind == "raise"
        and any(p in m.file for e in lenders for p in e.raises)
        and "{" in m.template
        and template_regex(m.template)[1] < MIN_LITERAL
    ]
    assert short, "the catalogue has short config templates: this test needs one"
    for m in short:
        # Filled with ordinary words, a short template reads as arbitrary text: it must not lend.
        text = catalogue.samples(m)[2].split("\n", 1)[0]
        assert RAISES.find(text) is None, m.template
    assert RAISES.find("is not supported") is None
    assert RAISES.find("x" * 400) is None


def test_a_specific_rule_wins() -> None:
    # A config-module message that the driver rule reads: the rule's category, not bad_args.
    exc = "RuntimeError: Failed to infer device type"
    assert RAISES.find("Failed to infer device type") is not None
    a = analyze_lines(_log("0.8", exc, "0.8.4"))
    assert a.verdict.category is Category.DRIVER_CUDA
    # An OOM before a catalogued config message: the OOM is the cause.
    lines = [
        "ERROR 04-17 15:10:09 [engine.py:448] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.55 GiB of which 1.12 GiB is free.",
        "ERROR 04-17 15:10:09 [engine.py:448] ValueError: Chunked prefill is not supported with sliding window. Set --disable-sliding-window to disable sliding window.",
    ]
    assert analyze_lines(lines).verdict.category.value.startswith("oom")


def test_failing_frame_decides_before_the_message() -> None:
    exc = "ValueError: Chunked prefill is not supported with sliding window. Set --disable-sliding-window to disable sliding window."
    lines = [
        "Traceback (most recent call last):",
        '  File "/x/vllm/distributed/device_communicators/pynccl.py", line 99, in __init__',
        exc,
    ]
    assert analyze_lines(lines).verdict.category is Category.DISTRIBUTED


def test_ambiguous_template_is_dropped() -> None:
    # The same template raised by a config module and by one that lends nothing: no verdict.
    m = next(m for m in CAT.messages if m.template in {r.template for r in RAISES.raised})
    twin = catalogue.Message(
        m.template, "raise", m.type, "vllm/v1/worker/gpu_worker.py", 1, m.first, m.last
    )
    alone = build(builtin_knowledge(), catalogue.Catalogue(CAT.versions, "test", (m,)))
    both = build(builtin_knowledge(), catalogue.Catalogue(CAT.versions, "test", (m, twin)))
    text = catalogue.samples(m)[0].split("\n", 1)[0]
    assert alone.find(text) is not None
    assert both.find(text) is None


def test_every_raises_key_lends_messages() -> None:
    for entry in builtin_knowledge().frames:
        if entry.raises:
            assert any(r.entry is entry for r in RAISES.raised), entry.id


def test_every_lending_template_finds_its_own_sample() -> None:
    # The RE2 set runs within a memory budget: a set that silently stopped matching would fail here.
    for r in RAISES.raised:
        m = catalogue.Message(r.template, "raise", r.type, r.file, 1, r.first, r.last)
        whole = [t for t in catalogue.samples(m) if catalogue.instance_of(r.template, t)]
        assert whole
        for text in whole:  # every sample value
            found = RAISES.find(text.split("\n", 1)[0])
            assert found is not None and found.entry.category is r.entry.category, r.template


def test_without_re2_the_regex_fallback_agrees() -> None:
    fallback = RaiseMap(RAISES.raised, RAISES.patterns)
    fallback._set = None  # as on a platform without google-re2
    for r in RAISES.raised[::20]:
        m = catalogue.Message(r.template, "raise", r.type, r.file, 1, r.first, r.last)
        text = catalogue.samples(m)[0].split("\n", 1)[0]
        assert fallback.find(text) == RAISES.find(text), r.template
    assert (
        fallback.find("The widget registry could not be reconciled with the plugin list.") is None
    )


def test_an_empty_catalogue_lends_nothing() -> None:
    empty = build(builtin_knowledge(), catalogue.Catalogue((), "none", ()))
    assert (
        empty.raised == ()
        and empty.find("Chunked prefill is not supported with sliding window.") is None
    )


def test_after_readiness_a_config_message_lends_nothing() -> None:
    exc = "ValueError: Chunked prefill is not supported with sliding window. Set --disable-sliding-window to disable sliding window."
    start = ["INFO 04-17 15:10:00 [api_server.py:1000] vLLM API server version 0.8.4"]
    failed = analyze_lines([*start, f"ERROR 04-17 15:10:09 [engine.py:448] {exc}"])
    assert _lent(failed)
    served = analyze_lines(
        [
            *start,
            "INFO:     Application startup complete.",
            'INFO:     127.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200 OK',
            f"ERROR 04-17 15:20:09 [engine.py:448] {exc}",
        ]
    )
    assert not _lent(served) and served.verdict.category is not Category.BAD_ARGS


def test_the_shipped_lending_set_is_what_the_catalogue_and_frame_map_give():
    from vllm_offload_doctor.analyze import raises

    derived = raises.derive_builtin()
    shipped = raises._cached(builtin_knowledge())
    assert shipped is not None, "data/vllm-lending.json is stale: run scripts/build_lending.py"
    assert shipped.patterns == derived.patterns
    assert shipped.raised == derived.raised
    assert len(shipped.raised) > 100


def test_a_stale_or_damaged_lending_set_is_derived_again(monkeypatch, tmp_path):
    from vllm_offload_doctor.analyze import raises

    knowledge = builtin_knowledge()
    monkeypatch.setattr(raises, "inputs_digest", lambda: "0" * 64)  # the catalogue changed since
    assert raises._cached(knowledge) is None
    monkeypatch.undo()
    damaged = tmp_path / "vllm-lending.json"
    damaged.write_text(
        f'{{"format": "{raises.CACHE_FORMAT}", "inputs_sha256": "{raises.inputs_digest()}", "kept": [[1]]}}'
    )
    monkeypatch.setattr(raises, "cache_path", lambda: damaged)
    assert raises._cached(knowledge) is None
    monkeypatch.setattr(raises, "_BUILTIN", None)
    assert builtin_raises().patterns == RAISES.patterns  # derived from the catalogue instead


def test_ray_cluster_messages_lend_distributed() -> None:
    # Raised only by the Ray cluster set-up (ray_utils.py): the module names the subsystem.
    exc = "ValueError: The number of required GPUs exceeds the total number of available GPUs in the placement group."
    a = analyze_lines(_log("0.4-0.6", exc, "0.5.3"))
    assert _lent(a) and a.verdict.category is Category.DISTRIBUTED
    assert "vllm/executor/ray_utils.py" in a.findings[0].message


def test_offloader_messages_lend_offload_error() -> None:
    # Raised only by the offloaders' own code: offload was active and it failed.
    exc = "AssertionError: CPU storage not initialized"
    a = analyze_lines(_log("0.11+ (docker)", exc, "0.25.1"))
    assert _lent(a) and a.verdict.category is Category.OFFLOAD_ERROR
    assert "vllm/model_executor/offloader/" in a.findings[0].message
