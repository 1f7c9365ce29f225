"""The log engine: stream a log once, collect facts and rule hits, name one root cause."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from vllm_offload_doctor import logread
from vllm_offload_doctor.errors import InputError
from vllm_offload_doctor.facts import CODE_HINTS, PHASES, FactCollector, phase_of_frames
from vllm_offload_doctor.model import (
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
from vllm_offload_doctor.normalize import Line, parse, split_long
from vllm_offload_doctor.rules import Rule, load_rules, render_message

# Needed only until the first served request is seen: access lines are the bulk of a serving log.
UNTIL_SERVED = ("/completions HTTP/1.",)

# Words that every line a fact pattern needs contains; rules add their own keywords.
FACT_KEYWORDS = (
    "version",
    "non-default args",
    "args: Namespace",
    "LLM engine",
    "vllm serve",
    "api_server",
    "LLM(",
    "Model Runner",
    "Model runner",
    "Loading model from scratch",
    "Starting to load model",
    "Offloader",
    "Total CPU offloaded",
    "Model loading took",
    "Loading model weights took",
    # Not bare "KV cache": every serving stats line says "GPU KV cache usage".
    "KV cache memory",
    "KV cache size",
    "KV Cache",
    "GPU blocks",
    "platform",
    "GiB",
    "WSL",
    "startup complete",
    "Uvicorn running",
    "shutdown complete",
    "Shutting down",
    "Finished server process",
    "/completions HTTP/1.",
    'File "',
    "Traceback",
    "Error",
    "ERROR",
    "error",
    "Exception",
    "WARNING",
    "CRITICAL",
    "Killed",
    "Memory profiling",
    "memory profiling",
    "Capturing",
    "Graph capturing",
    "Loading weights",
    "Loading safetensors",
    "compute capability",
    "Route: /v1/",
    "Available routes",
    "Started server process",
    "Waiting for application",
    "init engine",
    "Starting vLLM",
    "standard CPU offloading",
)
_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit)\b:?")
_FATAL_HINT = re.compile(
    r"EngineCore failed to start|Engine core initialization failed|WorkerProc failed to start"
)
MAX_EVIDENCE = 5


@dataclass(slots=True)
class _Hit:
    rule: Rule
    evidence: list[Evidence] = field(default_factory=list)
    groups: dict[str, Any] = field(default_factory=dict)
    count: int = 0
    context: tuple[str, ...] = ()  # messages just before the first match


class Engine:
    """Rules loaded once; `analyze_*` may then be called for many inputs."""

    def __init__(
        self, rules: Sequence[Rule] | None = None, extra_rule_dirs: Iterable[Path] = ()
    ) -> None:
        self.rules = list(rules) if rules is not None else load_rules(extra_rule_dirs)
        words = sorted(
            {*FACT_KEYWORDS, *(k for r in self.rules for k in r.keywords)}, key=len, reverse=True
        )
        self._prefilter = _literal_matcher(words)
        self._prefilter_served = _literal_matcher([w for w in words if w not in UNTIL_SERVED])

    # -- inputs ---------------------------------------------------------------------------
    def analyze_source(self, source: logread.Source) -> Analysis:
        stream = logread.open_source(source)
        try:
            return self._analyze_stream(stream, source.name)
        finally:
            if source.path is not None:
                stream.close()

    def analyze_file(self, path: Path, display_name: str | None = None) -> Analysis:
        name = display_name or str(path)
        if not path.is_file():
            raise InputError(f"{name}: no such file")
        return self.analyze_source(logread.Source(name, path))

    def analyze_lines(self, lines: Iterable[str], name: str = "<lines>") -> Analysis:
        state = _State(self.rules)
        for no, raw in enumerate(lines, start=1):
            for part in split_long(raw.rstrip("\n")):
                state.feed(parse(no, part))
        return state.finish(name, lines_read=state.last_no)

    def _analyze_stream(self, stream: Any, name: str) -> Analysis:
        state = _State(self.rules)
        error: str | None = None
        line_base = 0
        first = True
        try:
            for block in logread.iter_blocks(stream):
                if first:
                    first = False
                    if logread.looks_binary(block[:8192]):
                        raise InputError(f"{name}: binary file, not a log")
                self._scan_block(block, line_base, state)
                line_base += block.count(b"\n")
        except logread.TruncatedInput as exc:
            error = f"input ended early ({exc}); analysed what could be read"
        if first:
            raise InputError(f"{name}: empty file")
        return state.finish(name, lines_read=line_base, error=error)

    def _scan_block(self, block: bytes, line_base: int, state: _State) -> None:
        # One search per interesting line: after a hit, resume at the next line (linear time).
        served = self._prefilter_served if state.collector.served_requests else self._prefilter
        search = served.search
        pos = 0
        counted_to = 0
        line_no = line_base
        size = len(block)
        while pos < size:
            m = search(block, pos)
            if m is None:
                break
            start = block.rfind(b"\n", pos, m.start()) + 1 or pos
            end = block.find(b"\n", m.end())
            if end < 0:
                end = size
            line_no += block.count(b"\n", counted_to, start)
            counted_to = start
            raw = block[start:end].decode("utf-8", "replace")
            for part in split_long(raw):
                state.feed(parse(line_no + 1, part))
            pos = end + 1


def _literal_matcher(words: Sequence[str]) -> Any:
    """One pattern that finds any of the literal words in bytes.

    RE2 scans an alternation of ~150 literals with a DFA at a few hundred MB/s; Python's `re`
    tries every alternative at every position (a few MB/s), so it is only the fallback.
    """
    pattern = b"|".join(re.escape(w.encode()) for w in words)
    try:
        import re2

        return re2.compile(pattern)
    except Exception:  # not installed on this platform, or a pattern RE2 refuses
        return re.compile(pattern)


class _State:
    """Everything kept while one input streams past: bounded whatever its size."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = rules
        self.matching = [r for r in rules if r.patterns]
        self.collector = FactCollector()
        self.hits: dict[str, _Hit] = {}
        self.notable_first: list[Evidence] = []
        self.notable_last: deque[Evidence] = deque(maxlen=6)
        self.ready_line: int | None = None
        self.first_fatal_line: int | None = None
        self.last_no = 0
        self.recent: deque[str] = deque(maxlen=12)

    def feed(self, line: Line) -> None:
        self.last_no = line.no
        self.collector.feed(line)
        msg = line.msg
        if self.ready_line is None and self.collector.facts.reached_ready:
            self.ready_line = line.no
        is_exception = bool(_EXCEPTION.match(msg)) or bool(_FATAL_HINT.search(msg))
        if is_exception and self.first_fatal_line is None:
            self.first_fatal_line = line.no
        if (
            is_exception
            or (line.level in ("ERROR", "CRITICAL")
            and not msg.startswith(("File ", "^", "~")))
        ):
            ev = Evidence(line.no, line.text[:400])
            if len(self.notable_first) < 4:
                self.notable_first.append(ev)
            else:
                self.notable_last.append(ev)
        for rule in self.matching:
            text = line.text if rule.where == "line" else msg
            if not any(k in text for k in rule.keywords):
                continue
            m = rule.search(text)
            if m is None:
                continue
            hit = self.hits.get(rule.id)
            if hit is None:
                hit = self.hits[rule.id] = _Hit(
                    rule,
                    groups={k: v for k, v in m.groupdict().items() if v},
                    context=tuple(self.recent),
                )
            else:
                for key, value in m.groupdict().items():
                    if value and key not in hit.groups:
                        hit.groups[key] = value
            hit.count += 1
            if len(hit.evidence) < MAX_EVIDENCE and all(e.line != line.no for e in hit.evidence):
                hit.evidence.append(Evidence(line.no, line.text[:600]))
        self.recent.append(msg)

    # -- verdict ----------------------------------------------------------------------------
    def finish(self, name: str, lines_read: int, error: str | None = None) -> Analysis:
        facts = self.collector.finish()
        _resolve_runner(facts)
        base = _derived(facts, self.collector.phase)
        base["copy_offload"] = self.collector.copy_offload
        base["serving_setup"] = self.collector.serving_setup
        findings: list[Finding] = []
        for rule in self.rules:
            hit = self.hits.get(rule.id)
            if rule.patterns and hit is None:
                continue
            first_line = hit.evidence[0].line if hit and hit.evidence else None
            values = dict(base)
            values["error_phase"] = self._error_phase(first_line, hit.context if hit else ())
            values["fatal_after_ready"] = bool(
                self.ready_line
                and self.first_fatal_line
                and self.first_fatal_line > self.ready_line
            )
            if not rule.conditions_hold(values):
                continue
            groups = hit.groups if hit else {}
            findings.append(
                Finding(
                    rule_id=rule.id,
                    title=rule.title,
                    severity=rule.severity,
                    category=rule.category,
                    message=render_message(rule.message, groups, values),
                    remedy=render_message(rule.remedy, groups, values),
                    links=rule.links,
                    evidence=tuple(hit.evidence)
                    if hit
                    else _fact_evidence(facts, self.collector.args_evidence),
                    precedence=rule.precedence,
                )
            )
        findings.sort(key=lambda f: (-f.precedence, f.evidence[0].line if f.evidence else 0))
        offload = _offload(facts, findings, copy_offload=self.collector.copy_offload)
        verdict = _verdict(facts, findings, offload, serving_setup=self.collector.serving_setup)
        notable = () if findings else (*self.notable_first, *self.notable_last)
        return Analysis(
            file=name,
            verdict=verdict,
            offload=offload,
            facts=facts,
            findings=tuple(findings),
            lines_read=lines_read,
            notable=tuple(notable),
            error=error,
        )

    def _error_phase(self, line: int | None, context: Sequence[str] = ()) -> str | None:
        """The start-up phase a failure belongs to: traceback frames, then code lines, then log."""
        anchor = line or self.first_fatal_line
        if anchor is None:
            return None
        frames = self.collector.frames
        before = [fn for no, fn in frames if anchor - 250 <= no <= anchor]
        phase = phase_of_frames(before)
        if phase is None:
            after = [fn for no, fn in frames if anchor < no <= anchor + 250]
            phase = phase_of_frames(after)
        if phase is None:
            for text in reversed(context):
                for rx, hint in CODE_HINTS:
                    if rx.search(text):
                        return hint
        return phase or self.collector.phase


def _resolve_runner(facts: Facts) -> None:
    if facts.model_runner != "v2?":
        return
    version = _version(facts.vllm_version)
    if version is None:
        facts.model_runner = "unknown"
    elif Version("0.12.0") <= version < Version("0.28.0"):
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
    values = {k: v for k, v in asdict(facts).items() if k not in ("args", "ranks")}
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
    return values


def _fact_evidence(facts: Facts, args_line: tuple[int, str] | None) -> tuple[Evidence, ...]:
    """Evidence for a rule that rests on facts: the args line and the runner line."""
    out = [Evidence(*args_line)] if args_line else []
    if facts.model_runner_evidence:
        no, _, text = facts.model_runner_evidence.partition(": ")
        out.append(Evidence(int(no), text))
    return tuple(out)


def _offload(facts: Facts, findings: list[Finding], *, copy_offload: bool = False) -> Offload:
    requested = facts.cpu_offload_gb
    offloaded = facts.offloaded_gib
    if facts.prefetch_saved_gb is not None and offloaded is None:
        offloaded = facts.prefetch_saved_gb * 1e9 / 2**30
    statuses = _rank_statuses(facts)
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
    return Offload(OffloadStatus.UNKNOWN, requested, None, why, disagree)


def _rank_statuses(facts: Facts) -> list[str]:
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


def _verdict(
    facts: Facts, findings: list[Finding], offload: Offload, *, serving_setup: bool = False
) -> Verdict:
    if findings:
        top = findings[0]
        return Verdict(
            top.category, top.rule_id, top.title, top.message, top.severity, top.remedy, top.links
        )
    if facts.reached_ready or serving_setup:
        summary = (
            "the server started; no failure found in the log"
            if facts.reached_ready
            else "the log reaches the server's route table / engine start-up without any error "
            "(it ends before the explicit 'Application startup complete' line)"
        )
        if offload.status is OffloadStatus.EFFECTIVE:
            summary += f"; offloading took effect ({offload.offloaded_gib:.2f} GiB)"
        return Verdict(Category.HEALTHY, None, "Server healthy", summary, Severity.INFO)
    return Verdict(
        Category.UNKNOWN,
        None,
        "No known cause found",
        "no rule matched and the log does not show the server becoming ready; the most relevant lines "
        "are listed",
        Severity.INFO,
        "Attach the whole log (from the `vllm serve` command line to the end) and the output of "
        "`offload-doctor check`.",
    )


_DEFAULT: Engine | None = None


def default_engine() -> Engine:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Engine()
    return _DEFAULT


def analyze_file(path: Path, display_name: str | None = None) -> Analysis:
    """Analyse one log file with the built-in rules."""
    return default_engine().analyze_file(path, display_name)


def analyze_lines(lines: Iterable[str], name: str = "<lines>") -> Analysis:
    """Analyse log lines already in memory with the built-in rules."""
    return default_engine().analyze_lines(lines, name)
