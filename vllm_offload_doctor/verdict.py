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

from vllm_offload_doctor.knowledge import FRAME_PRECEDENCE, RAISE_PRECEDENCE, FrameEntry, Knowledge
from vllm_offload_doctor.model import Category, Evidence, Facts, Finding, Severity, Verdict
from vllm_offload_doctor.normalize import Line
from vllm_offload_doctor.raises import MIN_LITERAL, RaiseMap
from vllm_offload_doctor.redact import scrub_cut
from vllm_offload_doctor.rules import Rule, render_message

_METHOD = re.compile(r"while processing method (\w+)")
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

    def note_exception(self, line: Line, text: str) -> None:
        if len(self.exceptions) < MAX_EXCEPTIONS and len(text) >= MIN_LITERAL:
            self.exceptions.setdefault(text, Evidence(line.no, scrub_cut(line.text, 600)))

    def feed(self, line: Line, know: Knowledge, frames: Sequence[tuple[int, str, str]]) -> bool:
        """Record what `line` tells; True for a wrapper or a death (never evidence of a cause)."""
        msg = line.msg
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
        if any(k in msg for k in know.wrapper_keywords) and know.wrappers.search(msg):
            self.wrappers.append(Evidence(line.no, scrub_cut(line.text, 400)))
            return True
        return False


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
        remedy=render_message(rule.remedy, groups if remedy_groups is None else remedy_groups, values),
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


def death_verdict(clues: Clues, facts: Facts) -> Verdict | None:
    """The engine process died without an exception of its own."""
    if not clues.deaths:
        return None
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
