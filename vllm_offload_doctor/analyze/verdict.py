"""The verdict: every decision about one server start, in the order it is made.

The engine (engine.py) streams a log once and leaves, per start, what it `Observed`: the facts
collector, each rule's matches and the bounded `Clues` below. `judge` names the root cause in
these steps, each a function of this module (the fallbacks in step 9 are tried in their order):

 1. facts      the collector's facts, filled from pasted reports, an undated V2 runner dated
               (`resolve_runner`), and the values rules' conditions read (`condition_values`)
 2. rules      every rule that matched, or rests on facts alone, and whose conditions hold
               (`rule_findings`; each reads `rule_values`), by precedence, then by first line
 3. first cause  an OOM before a communication error is that error's cause (`first_cause`)
 4. frame      the failing frame of a single-purpose subsystem (rules/maps/frames.toml) goes on
               top unless a finding of higher precedence is there (`with_frame`)
 5. lenders    nothing decided, or only a generic crash: a message only one vLLM subsystem
               raises (`raise_finding`), else a library message (`stack.stack_finding`)
 6. survived   what the server lived through, before it became ready, is dropped (`not_survived`)
 7. wrapped    pydantic's 'Value error, ...' judged by its inner message (`judge_wrapped`)
 8. offload    the offload status, from the findings and the facts (`offload_of`)
 9. verdict    the top finding; with none, the first fallback that applies (`choose`): a
               validation error wrapping another failure, Ctrl+C during start-up, an engine that
               died without an exception (`death_verdict`), up then failed, healthy, not a vLLM
               log, no known cause
10. notes      KV-cache offloading beside an OOM, WSL2 beside a driver failure (`with_*_note`)

Who wins among findings is declared once, below: each rule's own `precedence` (rules/*.toml,
higher wins), with the lenders of steps 4-5 at fixed places between the rules.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from packaging.version import InvalidVersion, Version

from vllm_offload_doctor import runner
from vllm_offload_doctor.analyze import raises, reports, stack
from vllm_offload_doctor.analyze.facts import CODE_HINTS, PHASES, FactCollector, phase_of_frames
from vllm_offload_doctor.analyze.knowledge import FrameEntry, Knowledge
from vllm_offload_doctor.analyze.model import (
    Analysis,
    Category,
    Evidence,
    Facts,
    Finding,
    Offload,
    OffloadStatus,
    Severity,
    Verdict,
)
from vllm_offload_doctor.analyze.patterns import declare
from vllm_offload_doctor.analyze.raises import MIN_LITERAL, RaiseMap
from vllm_offload_doctor.analyze.rules import (
    FACT_CONDITIONS,
    MATCH_TIMEOUT_S,
    MAX_GIVE_UPS,
    Rule,
    render_message,
)
from vllm_offload_doctor.redact import scrub_cut

# Precedence: a rule's own (rules/*.toml) decides among rules; the lenders slot in here.
FRAME_PRECEDENCE = 50  # above the generic crash rules, below every rule that reads the exception
RAISE_PRECEDENCE = 45  # a catalogued vLLM raise message's subsystem: below the failing frame
STACK_PRECEDENCE = 44  # a library message: below the failing frame and vLLM's own raise messages

MAX_EVIDENCE = 5
# Evidence and notable lines are masked only when a start is judged (scrub_cut reads 4x the cut):
# a crash loop's merged starts never pay for it.
EVIDENCE_CUT, NOTABLE_CUT, FRAME_CUT = 600, 400, 400


class Hit(Protocol):
    """A rule's matches in one start (the engine's record)."""

    @property
    def evidence(self) -> Sequence[Evidence]: ...
    @property
    def groups(self) -> Mapping[str, Any]: ...
    @property
    def context(self) -> Sequence[str]: ...


@dataclass(frozen=True, slots=True)
class Observed:
    """What streaming one server start left: everything the verdict reads."""

    rules: Sequence[Rule]
    collector: FactCollector
    reports: reports.Reports
    clues: Clues
    hits: Mapping[str, Hit]
    ready_line: int | None
    first_fatal_line: int | None
    alarm_after_up: Evidence | None  # an engine-level alarm after the server came up
    notable_first: Sequence[Evidence]
    notable_last: Sequence[Evidence]
    v2_banner: bool
    loading_4dp: bool | None
    interrupt_after: float | None
    gave_up: Mapping[str, tuple[int, int, int]]
    saw_level: bool


def judge(seen: Observed, name: str, lines_read: int, error: str | None = None) -> Analysis:
    """One start's analysis, in the steps of this module's docstring."""
    facts = seen.collector.finish()  # 1
    seen.reports.fill(facts)
    resolve_runner(facts)
    base = condition_values(seen, facts)
    findings = rule_findings(seen, facts, base)  # 2
    findings = first_cause(findings)  # 3
    findings = with_frame(seen, findings, base)  # 4
    findings = with_lent(seen, findings, base)  # 5
    findings = not_survived(findings, seen.ready_line, MAX_EVIDENCE)  # 6
    findings, unwrapped = judge_wrapped(findings, seen.clues)  # 7
    offload = offload_of(facts, findings, copy_offload=seen.collector.copy_offload)  # 8
    notable = () if findings else notable_lines(seen)
    final = choose(seen, facts, findings, offload, notable, unwrapped)  # 9
    final = with_wsl_note(with_kv_offload_note(final, facts), facts)  # 10
    return Analysis(
        file=name,
        verdict=final,
        offload=offload,
        facts=facts,
        findings=tuple(findings),
        lines_read=lines_read,
        notable=notable,
        error=error,
        notes=timeout_notes(seen.gave_up),
    )


def decides(run: Analysis, ended: bool) -> bool:
    """Whether a start shows an outcome: a cause, an error line, or its end (not a cut-off)."""
    return run.verdict.category is not Category.UNKNOWN or bool(run.notable) or ended


# -- 1. facts ------------------------------------------------------------------------------
def resolve_runner(facts: Facts) -> None:
    if facts.model_runner != "v2?":
        return
    version = _version(facts.vllm_version)
    if version is None:
        facts.model_runner = "unknown"
    elif runner.ignores_under_v2(version):
        facts.model_runner = "v2"
    else:
        facts.model_runner = "v1"


def _version(text: str | None) -> Version | None:
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _derived(facts: Facts, phase: str) -> dict[str, Any]:
    values = {k: getattr(facts, k) for k in FACT_CONDITIONS}
    values["phase"] = phase
    values["offload_requested"] = bool(
        (facts.cpu_offload_gb or 0) > 0 or (facts.offload_group_size or 0) > 0
    )
    values["progressed"] = PHASES.index(phase) > PHASES.index("start") or bool(
        facts.model_loading_gib
    )
    if facts.gpu_free_gib is not None and facts.gpu_total_gib:
        values["gpu_free_fraction"] = facts.gpu_free_gib / facts.gpu_total_gib
    else:
        values["gpu_free_fraction"] = None
    values.update(kv_numbers(facts))
    # No version line: V2's loading line without "memory" dates the run to 0.12-0.27.1.
    values["undated_v2_unfixed"] = facts.vllm_version is None and facts.loading_says_memory is False
    return values


def kv_numbers(facts: Facts) -> dict[str, Any]:
    """Whether the logged KV numbers leave room for one request of max_model_len, and why not."""
    block = facts.block_size or 16  # vLLM's default block size on GPUs
    tokens = facts.kv_cache_tokens
    if tokens is None and facts.gpu_blocks is not None:
        tokens = facts.gpu_blocks * block
    why = []
    if facts.kv_cache_gib is not None and facts.kv_cache_gib < 0:
        why.append(f"the KV cache budget is negative ({facts.kv_cache_gib:g} GiB)")
    if facts.gpu_blocks == 0:
        why.append("0 KV cache blocks on the GPU")
    elif tokens is not None and facts.max_model_len and tokens < facts.max_model_len:
        held = (
            f"{facts.gpu_blocks} blocks x {block} tokens = {tokens}"
            if facts.kv_cache_tokens is None
            else f"{tokens} tokens"
        )
        why.append(f"the KV cache holds {held}, below max_model_len {facts.max_model_len}")
    return {"kv_tokens": tokens, "kv_short": bool(why), "kv_numbers": "; ".join(why) or None}


def condition_values(seen: Observed, facts: Facts) -> dict[str, Any]:
    """The values rules' conditions read: the facts and what the start shows beside them."""
    base = _derived(facts, seen.collector.phase)
    base["copy_offload"] = seen.collector.copy_offload
    base["serving_setup"] = seen.collector.serving_setup
    # No version line: V2's loading line without "memory" dates the run to 0.12-0.27.1 only when
    # it cannot be V1's line of <=0.11 (same words): the V2 banner, or format_gib's number.
    base["undated_v2_unfixed"] = bool(
        base["undated_v2_unfixed"] and (seen.v2_banner or seen.loading_4dp is False)
    )
    return base


def error_phase(seen: Observed, line: int | None, context: Sequence[str] = ()) -> str | None:
    """The start-up phase a failure belongs to: traceback frames, then code lines, then log."""
    anchor = line or seen.first_fatal_line
    if anchor is None:
        return None
    collector = seen.collector
    frames = collector.all_frames()
    before = [fn for no, fn, _ in frames if anchor - 250 <= no <= anchor]
    phase = phase_of_frames(before)
    if phase is None:
        after = [fn for no, fn, _ in frames if anchor < no <= anchor + 250]
        phase = phase_of_frames(after)
    if phase is None:
        phase = phase_of_frames([m for no, m in seen.clues.methods if abs(no - anchor) <= 50])
    if phase is None:
        for text in reversed(context):
            for rx, hint in CODE_HINTS:
                if rx.search(text):
                    return hint
    if phase is None and collector.phase == "start":
        return "unknown"  # nothing in the log places the failure
    return phase or collector.phase


# -- 2. rules ------------------------------------------------------------------------------
def rule_findings(seen: Observed, facts: Facts, base: dict[str, Any]) -> list[Finding]:
    """A finding per rule that matched (or rests on facts) and whose conditions hold, in order."""
    findings: list[Finding] = []
    for rule in seen.rules:
        hit = seen.hits.get(rule.id)
        if rule.patterns and hit is None:
            continue
        values = rule_values(seen, base, hit)
        if not rule.conditions_hold(values):
            continue
        evidence = (
            tuple(_scrubbed(hit.evidence, EVIDENCE_CUT))
            if hit
            else _fact_evidence(facts, seen.collector, rule)
        )
        groups = hit.groups if hit else {}
        findings.append(rule_finding(rule, values, evidence, groups=groups))
    findings.sort(key=lambda f: (-f.precedence, f.evidence[0].line if f.evidence else 0))
    return findings


def rule_values(seen: Observed, base: dict[str, Any], hit: Hit | None) -> dict[str, Any]:
    """The values one rule's conditions read: the start's, and where its first match lies."""
    ready = seen.ready_line
    first_line = hit.evidence[0].line if hit and hit.evidence else None
    values = dict(base)
    values["error_phase"] = error_phase(seen, first_line, hit.context if hit else ())
    # A wrapper (EngineCore encountered a fatal error, EngineDeadError) after readiness: the
    # engine died while serving, whatever the exception above it.
    values["engine_dead_after_ready"] = bool(
        ready and any(w.line > ready for w in seen.clues.wrappers)
    )
    values["fatal_after_ready"] = bool(
        ready and seen.first_fatal_line and seen.first_fatal_line > ready
    )
    return values


def _scrubbed(evidence: Iterable[Evidence], limit: int) -> list[Evidence]:
    return [Evidence(e.line, scrub_cut(e.text, limit)) for e in evidence]


def _fact_evidence(facts: Facts, collector: FactCollector, rule: Rule) -> tuple[Evidence, ...]:
    """Evidence for a rule that rests on facts: the lines of its numbers, the args and runner lines."""
    named = " ".join(c.fact for c in (*rule.all, *rule.any))
    numbers = [
        Evidence(*v)
        for k, v in collector.number_lines.items()
        if k.startswith("kv_") or k == "gpu_blocks"
    ]
    if "kv_" in named:
        return tuple(sorted(numbers, key=lambda e: e.line))
    out = []
    # The runner line is the telling one (V2 ignores the offload); the args line shows the request.
    if facts.model_runner_evidence:
        no, _, text = facts.model_runner_evidence.partition(": ")
        out.append(Evidence(int(no), text))
    if collector.args_evidence:
        out.append(Evidence(*collector.args_evidence))
    return tuple(out)


def rule_finding(
    rule: Rule,
    values: dict[str, Any],
    evidence: tuple[Evidence, ...],
    *,
    groups: Mapping[str, Any] | None = None,
    remedy_groups: Mapping[str, Any] | None = None,
    category: Category | None = None,
    lead: str = "",
    precedence: int | None = None,
) -> Finding:
    """A rule's finding; a frame or a catalogued message may lend it under its own category and
    precedence, with a sentence (`lead`) saying where the cause was found."""
    groups = groups or {}
    return Finding(
        rule_id=rule.id,
        title=rule.title,
        severity=rule.severity,
        category=category or rule.category,
        message=lead + render_message(rule.message, groups, values),
        remedy=render_message(
            rule.remedy, groups if remedy_groups is None else remedy_groups, values
        ),
        links=rule.links,
        evidence=evidence,
        precedence=rule.precedence if precedence is None else precedence,
    )


def _rule(rules: Sequence[Rule], rule_id: str) -> Rule | None:
    return next((r for r in rules if r.id == rule_id), None)


def frame_finding(
    clues: Clues, rules: Sequence[Rule], values: dict[str, Any], exception: Evidence | None
) -> Finding | None:
    """A finding from the failing frame, explained by the rule its map entry names."""
    if clues.frame is None:
        return None
    (line, text), entry = clues.frame
    rule = _rule(rules, entry.rule)
    if rule is None:
        return None
    evidence = Evidence(line, scrub_cut(text, FRAME_CUT))
    shown = [evidence] if exception is None else sorted([evidence, exception], key=lambda e: e.line)
    where = f"The failing frame lies in {entry.id.replace('-', ' ')} code ({entry.source.split(';')[0]}). "
    return rule_finding(
        rule, values, tuple(shown), category=entry.category, lead=where, precedence=FRAME_PRECEDENCE
    )


def raise_finding(
    clues: Clues,
    rules: Sequence[Rule],
    values: dict[str, Any],
    lent: RaiseMap,
    ready_line: int | None = None,
) -> Finding | None:
    """A finding from the first exception whose message only one subsystem's modules raise.
    Not after the server became ready: it passed its config and argument checks by then."""
    for text, evidence in clues.exceptions.items():
        if ready_line is not None and evidence.line > ready_line:
            break
        raised = lent.find(text)
        if raised is None:
            continue
        entry = raised.entry
        rule = _rule(rules, entry.rule)
        if rule is None:
            continue
        what = entry.source.rsplit(": ", 1)[-1]  # e.g. "config validation"
        return rule_finding(
            rule,
            values,
            (evidence,),
            groups={"why": text[:300].rstrip(". ")},
            remedy_groups={},
            category=entry.category,
            lead=f"vLLM raises this message in {raised.file}, releases {raised.span()} ({what}). ",
            precedence=RAISE_PRECEDENCE,
        )
    return None


# -- 3. first cause, 6. what the server survived ------------------------------------
def first_cause(findings: list[Finding]) -> list[Finding]:
    """A communication error after an out-of-memory error is the OOM's aftermath (the ranks that
    did not crash lose their peer while shutting down): the OOM comes first."""
    if not findings or findings[0].category is not Category.DISTRIBUTED or not findings[0].evidence:
        return findings
    dist_line = findings[0].evidence[0].line
    for i, f in enumerate(findings[1:], start=1):
        if f.category.value.startswith("oom") and f.evidence and f.evidence[0].line < dist_line:
            return [f, *findings[:i], *findings[i + 1 :]]
    return findings


def not_survived(
    findings: list[Finding], ready_line: int | None, max_evidence: int
) -> list[Finding]:
    """Drop what the server lived through: an error logged before it became ready (a retried
    download, a warning quoting an import error) did not stop it. An ignored offload stays, and
    so does a finding whose evidence list is full (a later match may lie after readiness)."""
    if ready_line is None:
        return findings
    return [
        f
        for f in findings
        if f.category is Category.OFFLOAD_IGNORED
        or not f.evidence
        or len(f.evidence) >= max_evidence
        or any(e.line >= ready_line for e in f.evidence)
    ]


# -- 4. the failing frame, 5. the lenders --------------------------------------------------
def with_frame(seen: Observed, findings: list[Finding], base: dict[str, Any]) -> list[Finding]:
    """The failing frame's finding on top, unless a finding of higher precedence is there."""
    crash = next((f for f in findings if f.category is Category.CRASH_OTHER), None)
    frame = frame_finding(
        seen.clues, seen.rules, base, crash.evidence[0] if crash and crash.evidence else None
    )
    if frame is not None and (not findings or findings[0].precedence < frame.precedence):
        return [frame, *findings]
    return findings


def with_lent(seen: Observed, findings: list[Finding], base: dict[str, Any]) -> list[Finding]:
    """Nothing decided, or only a generic crash: a vLLM raise message, else a library message."""
    if findings and findings[0].category is not Category.CRASH_OTHER:
        return findings
    lent = raise_finding(
        seen.clues, seen.rules, base, raises.builtin_raises(), seen.ready_line
    ) or stack.stack_finding(seen.clues.stack, seen.rules, base)
    return findings if lent is None else [lent, *findings]


# -- 7. pydantic's wrapped messages --------------------------------------------------------
PYDANTIC_RULE = (
    "ARG001"  # reads pydantic's wrapper ('N validation error for X', 'Value error, ...')
)
# Inner messages that say nothing about the arguments: Python's json decoder (an empty or broken
# file as much as a bad JSON flag), and messages that point elsewhere for their cause.
_NOT_ARGS = re.compile(
    r"^(?:Expecting (?:value|property name enclosed in double quotes|'[,:]' delimiter)|Extra data|"
    r"Unterminated string starting at|Invalid control character at|Invalid \\escape)"
    r": line \d+ column \d+|Please check the logs for more details|See (?:root cause|stack trace) above"
)


def judge_wrapped(findings: list[Finding], clues: Clues) -> tuple[list[Finding], Verdict | None]:
    """pydantic wraps whatever a validator raised: judge it by the inner message. Another rule that
    reads that message decides; a message that is not about the arguments is no bad_args."""
    if not findings or findings[0].rule_id != PYDANTIC_RULE or not clues.wrapped:
        return findings, None
    top = findings[0]
    lines = {no for no, _, _ in clues.wrapped}
    pydantic_only = all(e.line in lines or "validation error" in e.text for e in top.evidence)
    if not pydantic_only:
        return findings, None  # argparse or vLLM's own check: not a wrapped message
    others = {rid for _, _, rids in clues.wrapped for rid in rids}
    rest = [f for f in findings if f.rule_id != PYDANTIC_RULE]
    if others:
        return [f for f in rest if f.rule_id in others] + [
            f for f in rest if f.rule_id not in others
        ], None
    foreign = [inner for _, inner, _ in clues.wrapped if _NOT_ARGS.search(inner)]
    if len(foreign) < len(clues.wrapped):
        return findings, None
    kept = [
        f
        for f in rest
        if not (
            f.category is Category.CRASH_OTHER
            and all("validation error" in e.text or e.line in lines for e in f.evidence)
        )
    ]
    if kept:
        return kept, None
    return kept, Verdict(
        Category.UNKNOWN,
        None,
        "A validation error wraps a failure from elsewhere",
        "vLLM's config validation (pydantic) reports a message that is not about the arguments: "
        f"'{foreign[0][:200]}'; the log does not show what caused it (an empty or broken file "
        "such as config.json, or an error logged elsewhere)",
        Severity.ERROR,
        "Look above this error for the first exception (or rerun with VLLM_LOGGING_LEVEL=DEBUG), "
        "check that the model's config.json and any JSON flag are complete, and attach the whole "
        "log with `offload-doctor check` output.",
    )


# -- 8. offload ---------------------------------------------------------------------------
def offload_of(facts: Facts, findings: list[Finding], *, copy_offload: bool = False) -> Offload:
    requested = facts.cpu_offload_gb
    offloaded = facts.offloaded_gib
    if facts.prefetch_saved_gb is not None and offloaded is None:
        offloaded = facts.prefetch_saved_gb * 1e9 / 2**30
    statuses = rank_statuses(facts)
    disagree = len(set(statuses)) > 1
    ignored = [f for f in findings if f.category is Category.OFFLOAD_IGNORED]
    if ignored and findings[0] is ignored[0]:
        return Offload(
            OffloadStatus.IGNORED,
            requested,
            offloaded,
            "offload was requested, but the V2 model runner never installed an offloader: no "
            "'Offloader set to' line and no 'Total CPU offloaded parameters' line",
            disagree,
        )
    if ignored:
        return Offload(
            OffloadStatus.UNKNOWN,
            requested,
            None,
            f"the server failed first ({findings[0].category.value}); the log also shows the V2 runner "
            "without an offloader, so once that is fixed expect --cpu-offload-gb to be ignored too "
            "(set VLLM_USE_V2_MODEL_RUNNER=0 or upgrade to vLLM >= 0.28.0)",
            disagree,
        )
    if any(f.category is Category.OFFLOAD_ERROR for f in findings):
        return Offload(
            OffloadStatus.ERROR,
            requested,
            offloaded,
            "offloading itself failed or is unsupported here",
            disagree,
        )
    if offloaded:
        detail = f"{offloaded:.2f} GiB of weights were moved to host memory"
        if len(statuses) > 1:
            detail += (
                " (largest per rank; "
                + ", ".join(
                    f"{r.process}: {r.offloaded_gib if r.offloaded_gib is not None else 'none'}"
                    for r in facts.ranks.values()
                    if r.offloaded_gib is not None or r.offloader
                )
                + ")"
            )
        if disagree:
            detail += "; ranks disagree: some logged no offload"
        return Offload(OffloadStatus.EFFECTIVE, requested, offloaded, detail, disagree)
    if copy_offload:
        return Offload(
            OffloadStatus.EFFECTIVE,
            requested,
            None,
            "weights were offloaded, but through the slow copy-per-forward fallback (no UVA / pinned "
            "memory on this platform): expect a large slowdown",
            disagree,
        )
    if not requested and not (facts.offload_group_size or 0) > 0:
        if requested is None and facts.offloader in ("UVAOffloader", "PrefetchOffloader"):
            return Offload(
                OffloadStatus.UNKNOWN,
                None,
                None,
                "an offloader was installed but no offloaded amount was logged",
            )
        return Offload(
            OffloadStatus.NOT_REQUESTED, requested, None, "no --cpu-offload-gb above 0 in the log"
        )
    if facts.device_cpu:
        return Offload(
            OffloadStatus.UNKNOWN,
            requested,
            None,
            "--cpu-offload-gb has no meaning on the CPU backend (device=cpu): everything is in host memory already",
        )
    version = _version(facts.vllm_version)
    if version is not None and version < Version("0.17.0"):
        why = (
            f"vLLM {facts.vllm_version} logs nothing about offloading (the log lines exist from 0.17). "
            "To tell, compare 'Model loading took' here against a run with --cpu-offload-gb 0: "
            "it drops by about the offloaded GiB when offloading works"
        )
    elif version is None:
        why = (
            "the log shows no vLLM version and no offload line; vLLM before 0.17 logs nothing about "
            "offloading. Compare 'Model loading took' against a --cpu-offload-gb 0 run to tell"
        )
    elif facts.model_loading_gib is None and not facts.reached_ready:
        why = "the log ends before the model was loaded, so it cannot show whether offloading happened"
    else:
        why = (
            "offload was requested but no 'Total CPU offloaded parameters' line appears: the model may "
            "not build its layers with make_layers, a --cpu-offload-params filter may match nothing, or "
            "the log is partial"
        )
        if runner.ignores_under_v2(version) and facts.model_runner == "unknown":
            why += (
                f"; vLLM {facts.vllm_version} ignores the flag whenever the V2 model runner runs, and "
                "this log does not say which runner ran (no 'Using V2 Model Runner' or 'Starting to "
                "load model' line): `offload-doctor compare` tells"
            )
    return Offload(OffloadStatus.UNKNOWN, requested, None, why, disagree)


def rank_statuses(facts: Facts) -> list[str]:
    statuses = []
    for rank in facts.ranks.values():
        if rank.offloaded_gib:
            rank.status = OffloadStatus.EFFECTIVE
        elif rank.model_loading_gib is not None and (facts.cpu_offload_gb or 0) > 0:
            rank.status = OffloadStatus.UNKNOWN
        else:
            continue
        statuses.append(rank.status.value)
    return statuses


# -- 9. the verdict ------------------------------------------------------------------------
def notable_lines(seen: Observed) -> tuple[Evidence, ...]:
    """The lines shown when no finding explains the start: deaths, then the error lines."""
    notable = (
        *seen.clues.deaths,
        *_scrubbed(seen.notable_first, NOTABLE_CUT),
        *_scrubbed(seen.notable_last, NOTABLE_CUT),
    )
    return tuple({e.line: e for e in notable}.values())


def choose(
    seen: Observed,
    facts: Facts,
    findings: list[Finding],
    offload: Offload,
    notable: Sequence[Evidence],
    unwrapped: Verdict | None,
) -> Verdict:
    """The top finding; with none, the first fallback that applies, in this order."""
    if findings:
        top = findings[0]
        return Verdict(
            top.category, top.rule_id, top.title, top.message, top.severity, top.remedy, top.links
        )
    up = facts.reached_ready or seen.collector.serving_setup
    alarm = seen.alarm_after_up
    return (
        unwrapped
        # Ctrl+C after readiness is an ordinary stop: only a start-up is "interrupted".
        or (
            None
            if up
            else interrupt_verdict(seen.clues, seen.collector.phase, seen.interrupt_after)
        )
        or death_verdict(seen.clues, facts, up=up)
        or (failed_after_up(alarm) if up and alarm is not None else None)
        or (healthy(facts, offload) if up else None)
        or (None if notable or vllm_seen(seen, facts) else NOT_VLLM)
        or no_known_cause(facts, notable)
    )


def failed_after_up(alarm: Evidence) -> Verdict:
    """Readiness followed by a fatal event whose exception the log does not show."""
    return Verdict(
        Category.UNKNOWN,
        None,
        "The server came up, then failed without a visible cause",
        "the server came up, but a fatal event follows (line "
        f"{alarm.line}: {alarm.text[:160].strip()}); the log does not show the exception that "
        "caused it, so it is not healthy and the cause is cut off",
        Severity.ERROR,
        "Attach the whole log around that line (the engine or worker traceback above the "
        "error) and the output of `offload-doctor check`.",
    )


def healthy(facts: Facts, offload: Offload) -> Verdict:
    summary = (
        "the server started; no failure found in the log"
        if facts.reached_ready
        else "the log reaches the server's route table / engine start-up without any error "
        "(it ends before the explicit 'Application startup complete' line)"
    )
    if offload.status is OffloadStatus.EFFECTIVE:
        summary += f"; offloading took effect ({offload.offloaded_gib:.2f} GiB)"
    return Verdict(Category.HEALTHY, None, "Server healthy", summary, Severity.INFO)


NOT_VLLM = Verdict(
    Category.UNKNOWN,
    None,
    "Not a vLLM server log",
    "this does not look like a vLLM server log: no vLLM version, arguments, start-up "
    "line, traceback frame in vLLM or known error in it",
    Severity.INFO,
    "Pass the output of `vllm serve` (from its command line to the end), not another "
    "program's output.",
)


def vllm_seen(seen: Observed, facts: Facts) -> bool:
    """Whether anything in the input is vLLM's: a version, arguments, a start-up phase, a frame."""
    collector = seen.collector
    return bool(
        facts.vllm_version
        or facts.args
        or collector.cli_args
        or facts.model
        or collector.phase != "start"
        or collector.serving_setup
        or facts.reached_ready
        or facts.platform
        or seen.saw_level
        or seen.hits
        or seen.clues.wrappers
        or any("vllm" in path.lower() for _, _, path in collector.all_frames())
    )


def no_known_cause(facts: Facts, notable: Sequence[Evidence]) -> Verdict:
    summary = (
        "no failure that a rule explains, and the log does not show the server becoming ready; "
        "the error lines below are all it shows (the cause may be cut off)"
        if notable
        else "the log shows no failure and does not show the server becoming ready: it may be cut "
        "off before the cause, or before start-up finished"
    )
    if facts.pasted_reports:
        summary += (
            "; it holds pasted " + ", ".join(facts.pasted_reports) + " output, read for its facts "
            "only (never as log lines)"
        )
    return Verdict(
        Category.UNKNOWN,
        None,
        "No known cause found",
        summary,
        Severity.INFO,
        "Attach the whole log (from the `vllm serve` command line to the end) and the output of "
        "`offload-doctor check`.",
    )


# Pinned offload from this many GiB up makes the OOM killer the likely end of an engine that
# died without an exception (pinned memory takes up to 2 x the offload per GPU).
LARGE_OFFLOAD_GIB = 8.0


def silent_death(clues: Clues, *, up: bool = False) -> bool:
    """The engine is gone: a death line, or before readiness a wrapper with no real exception
    anywhere (after readiness a bare wrapper is the 'came up, then failed' fallback's)."""
    if clues.interrupt is not None and clues.interrupt.line <= min(
        (e.line for e in (*clues.deaths, *clues.wrappers)), default=clues.interrupt.line
    ):
        return False  # what dies after Ctrl+C was stopped, not killed
    return bool(clues.deaths) or (not up and bool(clues.wrappers) and clues.raised == 0)


def host_oom_verdict(clues: Clues, facts: Facts, *, up: bool = False) -> Verdict | None:
    """An engine that died silently under a large pinned offload: the kernel's OOM killer."""
    offload = facts.cpu_offload_gb or 0
    if not silent_death(clues, up=up) or offload < LARGE_OFFLOAD_GIB or clues.interrupt is not None:
        return None
    gpus = max(1, facts.tensor_parallel_size or 1)
    pinned = offload * gpus
    summary = (
        "the engine process died without raising an exception ("
        + (
            "a death line"
            if clues.deaths
            else "only a wrapper such as 'Engine core initialization "
            "failed', no exception of its own"
        )
        + f") while --cpu-offload-gb {offload:g} was pinning host memory: the kernel's OOM killer is "
        f"the usual cause; pinned memory took about {offload:g} GiB per GPU"
        + (f" ({pinned:g} GiB over {gpus} GPUs)" if gpus > 1 else "")
        + f", and up to 2 x --cpu-offload-gb per GPU (about {2 * offload:g} GiB each) while loading"
    )
    return Verdict(
        Category.OOM_HOST,
        "OOM005",
        "The engine was killed, most likely by the kernel's OOM killer (pinned offload memory)",
        summary,
        Severity.ERROR,
        "Confirm with `dmesg -T | grep -i -E 'killed process|oom'` or `journalctl -k`; then lower "
        "--cpu-offload-gb, add host RAM or raise the container's memory limit, and run "
        "`offload-doctor check --offload-gb X` for the pinned-memory budget.",
    )


def interrupt_verdict(clues: Clues, phase: str, seconds: float | None) -> Verdict | None:
    """A start-up the user stopped (Ctrl+C / SIGINT): no failure, and not 'no known cause'."""
    if clues.interrupt is None:
        return None
    where = {
        "start": "during start-up",
        "loading": "while loading the weights",
        "loaded": "after the weights loaded",
        "profiling": "while profiling memory",
        "kv_cache": "while sizing the KV cache",
        "graphs": "while capturing CUDA graphs",
    }.get(phase, "during start-up")
    after = f" after {seconds:.0f} s" if seconds is not None and seconds >= 0 else ""
    return Verdict(
        Category.UNKNOWN,
        None,
        "Stopped by the user",
        f"stopped by Ctrl+C / SIGINT {where}{after} (line {clues.interrupt.line}): no failure of "
        "vLLM's own, and nothing in the log says why it was stopped (slow start-up?)",
        Severity.INFO,
        "Let it run to 'Application startup complete'; if start-up seemed stuck, attach the whole "
        "log and `offload-doctor check` output.",
    )


def death_verdict(clues: Clues, facts: Facts, *, up: bool = False) -> Verdict | None:
    """The engine process died without an exception of its own."""
    host = host_oom_verdict(clues, facts, up=up)
    if host is not None:
        return host
    if not silent_death(clues, up=up):
        return None
    if not clues.deaths:
        return Verdict(
            Category.UNKNOWN,
            None,
            "The engine was killed without an exception",
            "the engine was killed: the log shows only a wrapper ('Engine core initialization "
            "failed', 'Failed core proc(s)') and no exception of its own, so the process was ended "
            "from outside (a signal, the kernel's OOM killer, the container runtime); the log "
            "cannot show which",
            Severity.ERROR,
            "Confirm an OOM kill with `dmesg -T | grep -i -E 'killed process|oom'` or "
            "`journalctl -k`; check the container's memory limit and exit code (137 = SIGKILL).",
        )
    summary = (
        "the engine process died without raising an exception (killed by a signal, 'Killed', "
        "'died unexpectedly', exit -9 or a Ray actor gone); the log cannot show why"
    )
    offload = facts.cpu_offload_gb or 0
    if offload > 0:
        summary += (
            f". With --cpu-offload-gb {offload:g} the usual cause is the kernel's OOM killer: pinned "
            f"host memory can take up to 2 x --cpu-offload-gb per GPU (about {2 * offload:g} GiB each)"
        )
    else:
        summary += "; the usual cause is the kernel's OOM killer (host RAM or the container limit)"
    kv = kv_offload_in(facts)
    if kv is not None:
        summary += f"; KV-cache offloading ({kv}) also keeps its blocks in pinned host RAM"
    return Verdict(
        Category.UNKNOWN,
        None,
        "The engine died without an exception",
        summary,
        Severity.ERROR,
        "Confirm an OOM kill with `dmesg -T | grep -i -E 'killed process|oom'` or `journalctl -k`; "
        "check the container's memory limit, lower --cpu-offload-gb or add host RAM, and run "
        "`offload-doctor check --offload-gb X` for the pinned-memory budget.",
    )


# -- 10. notes ----------------------------------------------------------------------------
_KV_OFFLOAD_CONNECTOR = re.compile(r"\b\w*OffloadingConnector|LMCache\w*")  # \b: linear


def kv_offload_in(facts: Facts) -> str | None:
    """The KV-cache offloading a log shows (a different feature from weight offloading), if any."""
    args = facts.args
    if (args.get("kv_offloading_size") or 0) not in (0, "0", None, False):
        return f"--kv-offloading-size {args['kv_offloading_size']}"
    for key in ("kv_transfer_config", "kv_offloading_backend"):
        value = str(args.get(key) or "")
        m = _KV_OFFLOAD_CONNECTOR.search(value)
        if m:
            return f"--{key.replace('_', '-')} ({m.group(0)})"
    return None


def with_kv_offload_note(final: Verdict, facts: Facts) -> Verdict:
    """Say that KV-cache offloading, when the log shows it, never fixes a weight OOM."""
    kv = kv_offload_in(facts)
    if kv is None or not final.category.value.startswith("oom"):
        return final
    note = (
        f" KV-cache offloading is configured ({kv}): it moves KV blocks to host RAM, a different "
        "feature from weight offloading; it never reduces the weights' GPU memory nor fixes an OOM "
        "while loading them (that is --cpu-offload-gb)."
    )
    return replace(final, summary=final.summary.rstrip() + note)


def with_wsl_note(final: Verdict, facts: Facts) -> Verdict:
    """Under WSL2 CUDA comes from the Windows driver: a Linux driver fix is the wrong remedy."""
    if not facts.wsl or final.category is not Category.DRIVER_CUDA:
        return final
    note = (
        " This runs under WSL2, where CUDA comes from the Windows NVIDIA driver through "
        "/usr/lib/wsl/lib/libcuda.so: update the driver on Windows, and do not install a Linux "
        "NVIDIA driver inside WSL (it shadows that library)."
    )
    return replace(final, summary=final.summary.rstrip() + note)


def timeout_notes(gave_up: Mapping[str, tuple[int, int, int]]) -> tuple[str, ...]:
    """A rule that gave up on a line may be the missing verdict: say so, never silently."""
    ms = round(MATCH_TIMEOUT_S * 1000)
    return tuple(
        f"rule {rule_id} gave up on line {no} ({chars:,} characters) after {ms} ms; "
        "its verdict may be missing"
        + (
            f"; after {times} give-ups it was not tried on the rest of the log"
            if times >= MAX_GIVE_UPS
            else ""
        )
        for rule_id, (no, chars, times) in sorted(gave_up.items())
    )


# -- clues gathered while the lines stream past --------------------------------------------
# The wrappers that say a start failed (compare's live display reads them too).
FATAL_HINT = declare(
    r"EngineCore failed to start|Engine core initialization failed|WorkerProc failed to start",
    *("failed to start", "Engine core initialization failed"),
)
_METHOD = re.compile(r"while processing method (\w+)")
_REPR = re.compile(
    r"\b[A-Z]\w*(?:Error|Exception)(?:\(['\"]|: \S)"
)  # an exception quoted in a line
MAX_EXCEPTIONS = 16


@dataclass(slots=True)
class Clues:
    """Bounded clues gathered while lines stream past."""

    # The innermost mapped frame seen last: its line, unmasked (masked when judged: a traceback
    # names many mapped frames, the last one counts), and its entry.
    frame: tuple[tuple[int, str], FrameEntry] | None = None
    deaths: list[Evidence] = field(default_factory=list)
    wrappers: deque[Evidence] = field(default_factory=lambda: deque(maxlen=2))
    # 'Exception in worker X while processing method load_model': the phase of a worker failure.
    methods: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=8))
    # The first distinct exception messages (text after `Class: `), looked up in the catalogue
    # only when no rule or frame decides (raises.py).
    exceptions: dict[str, Evidence] = field(default_factory=dict)
    # Library messages of the stack catalogue that lend a category (stack.py), first few seen.
    stack: list[tuple[Evidence, Any]] = field(default_factory=list)
    raised: int = 0  # exception lines that are not wrappers, whatever their length
    interrupt: Evidence | None = None  # KeyboardInterrupt / SIGINT: the user stopped it

    # pydantic's 'Value error, <inner>' lines: (line, inner message, ids of other rules it matched)
    wrapped: list[tuple[int, str, tuple[str, ...]]] = field(default_factory=list)

    def note_wrapped(self, no: int, wrapped: tuple[str, tuple[str, ...]]) -> None:
        if len(self.wrapped) < MAX_EXCEPTIONS:
            self.wrapped.append((no, *wrapped))

    def note_exception(self, no: int, text: str, said: str) -> None:
        """An exception line (`text`) whose message after `Class: ` is `said`."""
        self.raised += 1
        if (
            len(self.exceptions) < MAX_EXCEPTIONS
            and len(said) >= MIN_LITERAL
            and said not in self.exceptions
        ):
            self.exceptions[said] = Evidence(no, scrub_cut(text, 600))


def wrapped_of(msg: str, rules: Sequence[Rule]) -> tuple[str, tuple[str, ...]]:
    """A 'Value error, <inner>' line's inner message, and the ids of the other rules it matched
    that name a cause (`rules`: those whose patterns match it)."""
    inner = msg.split("Value error, ", 1)[1].split(" [type=", 1)[0].strip()
    others = tuple(
        r.id for r in rules if r.id != PYDANTIC_RULE and r.category is not Category.CRASH_OTHER
    )
    return inner, others


def lent_of(msg: str) -> Any:
    """The stack catalogue's entry for a library message (stack.py), or None."""
    return stack.builtin_stack().find(msg)


@dataclass(frozen=True, slots=True)
class Clue:
    """What a line other than a traceback frame tells the clues: a function of its message alone
    (the engine keeps it with the line's plan; Clues are updated from it for every repeat)."""

    call: FrameEntry | None = None  # the call site of a mapped function (`fn(`)
    method: str | None = None  # 'while processing method X': the worker's method
    death: bool = False  # the engine died without an exception (killed, exit -9, ...)
    wrapper: bool = False  # wraps a cause and is never evidence of one
    raises: bool = False  # a wrapper quoting its cause: 'failed to start: ImportError(...)'


NO_CLUE = Clue()


def read_clue(msg: str, know: Knowledge) -> Clue:
    """The Clue of a line's message (a frame line's clue is its frame's entry instead)."""
    if "(" in msg:
        m = know.call_pattern.match(msg)
        if m:
            entry = know.call_entry(m.group("fn"))
            if entry is not None:
                return Clue(call=entry)
    method = None
    if "while processing method" in msg:
        m = _METHOD.search(msg)
        if m:
            method = m.group(1)
    if any(k in msg for k in know.death_keywords) and know.deaths.search(msg):
        return Clue(method=method, death=True)
    wrapped = know.wrappers.search(msg) if any(k in msg for k in know.wrapper_keywords) else None
    if wrapped:
        return Clue(method=method, wrapper=True, raises=bool(_REPR.search(msg[wrapped.end() :])))
    return NO_CLUE if method is None else Clue(method=method)
