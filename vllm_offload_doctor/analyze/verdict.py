"""Verdict policy beyond the rules: the failing frame, wrappers, an engine that died silently.

Rules read exception lines. When none decides, the innermost frame of a single-purpose
subsystem (rules/maps/frames.toml) names the category; failing that, an exception whose message
only that subsystem's modules raise in vLLM's catalogue (raises.py); when no exception is visible but the
engine process died (killed, signal, Ray actor gone), the verdict says so and how to confirm an
OOM kill; a wrapper line (`Engine core initialization failed`) is never the evidence.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vllm_offload_doctor.analyze.knowledge import (
    FRAME_PRECEDENCE,
    RAISE_PRECEDENCE,
    FrameEntry,
    Knowledge,
)
from vllm_offload_doctor.analyze.model import Category, Evidence, Facts, Finding, Severity, Verdict
from vllm_offload_doctor.analyze.normalize import Line
from vllm_offload_doctor.analyze.raises import MIN_LITERAL, RaiseMap
from vllm_offload_doctor.analyze.rules import Rule, render_message
from vllm_offload_doctor.redact import scrub_cut

_METHOD = re.compile(r"while processing method (\w+)")
_REPR = re.compile(
    r"\b[A-Z]\w*(?:Error|Exception)(?:\(['\"]|: \S)"
)  # an exception quoted in a line
MAX_EXCEPTIONS = 16


@dataclass(slots=True)
class Clues:
    """Bounded clues gathered while lines stream past."""

    frame: tuple[Evidence, FrameEntry] | None = None  # innermost mapped frame seen last
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

    def note_wrapped(self, line: Line, msg: str, rules: Sequence[Rule]) -> None:
        if len(self.wrapped) < MAX_EXCEPTIONS:
            inner = msg.split("Value error, ", 1)[1].split(" [type=", 1)[0].strip()
            others = tuple(
                r.id
                for r in rules
                if r.id != PYDANTIC_RULE and r.category is not Category.CRASH_OTHER
            )
            self.wrapped.append((line.no, inner, others))

    def note_exception(self, line: Line, text: str) -> None:
        self.raised += 1
        if len(self.exceptions) < MAX_EXCEPTIONS and len(text) >= MIN_LITERAL:
            self.exceptions.setdefault(text, Evidence(line.no, scrub_cut(line.text, 600)))

    def feed(self, line: Line, know: Knowledge, frames: Sequence[tuple[int, str, str]]) -> bool:
        """Record what `line` tells; True for a wrapper or a death (never evidence of a cause)."""
        msg = line.msg
        if len(self.stack) < 3:
            from vllm_offload_doctor.analyze.stack import builtin_stack

            lent = builtin_stack().find(msg) if builtin_stack().may_hold(msg) else None
            if lent is not None:
                self.stack.append((Evidence(line.no, scrub_cut(line.text, 400)), lent))
        if frames and frames[-1][0] == line.no:
            _, fn, path = frames[-1]
            entry = know.frame_entry(fn, path)
            if entry is not None:
                self.frame = (Evidence(line.no, scrub_cut(line.text, 400)), entry)
            return False
        if "(" in msg:
            m = know.call_pattern.match(msg)
            if m:
                entry = know.call_entry(m.group("fn"))
                if entry is not None:
                    self.frame = (Evidence(line.no, scrub_cut(line.text, 400)), entry)
                    return False
        if "while processing method" in msg:
            m = _METHOD.search(msg)
            if m:
                self.methods.append((line.no, m.group(1)))
        if any(k in msg for k in know.death_keywords) and know.deaths.search(msg):
            # A death (killed, exit -9, Ray's ActorDiedError) says the process is gone, not why.
            if len(self.deaths) < 3:
                self.deaths.append(Evidence(line.no, scrub_cut(line.text, 400)))
            return True
        wrapped = (
            know.wrappers.search(msg) if any(k in msg for k in know.wrapper_keywords) else None
        )
        if wrapped:
            self.wrappers.append(Evidence(line.no, scrub_cut(line.text, 400)))
            if _REPR.search(msg[wrapped.end() :]):
                self.raised += (
                    1  # 'failed to start: ImportError(...)': the wrapper quotes its cause
                )
            return True
        return False


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
    evidence, entry = clues.frame
    rule = _rule(rules, entry.rule)
    if rule is None:
        return None
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
