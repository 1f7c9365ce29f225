"""The log engine: stream a log once, collect facts and rule hits, name one root cause."""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_offload_doctor.analyze import logread, repeats, reports, runs, verdict
from vllm_offload_doctor.analyze.facts import FactCollector
from vllm_offload_doctor.analyze.knowledge import Knowledge, builtin_knowledge, lend_exceptions
from vllm_offload_doctor.analyze.model import (
    Analysis,
    Category,
    Evidence,
)
from vllm_offload_doctor.analyze.normalize import SPLIT_THRESHOLD, Line, parse, split_long
from vllm_offload_doctor.analyze.patterns import (
    block_scanner,
    declare,
    declare_words,
    keyword_index,
    literal_matcher,
    prefilter_words,
    span_finder,
)
from vllm_offload_doctor.analyze.rules import MAX_GIVE_UPS, Rule, load_rules
from vllm_offload_doctor.analyze.verdict import EVIDENCE_CUT, MAX_EVIDENCE, NOTABLE_CUT
from vllm_offload_doctor.errors import InputError
from vllm_offload_doctor.redact import scrub_cut

_LEVEL_PREFIX = re.compile(rb"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d")

_EXCEPTION = declare(
    r"^(?:\w+\.)*+[A-Z]\w*(?:Error|Exception|Interrupt|Exit)\b:?",
    *("Error", "Exception", "Interrupt", "Exit"),
)
_FATAL_HINT = verdict.FATAL_HINT
_LOADING_NUMBER = re.compile(r"Model loading took -?\d+(?:\.(\d*))? GiB")
# Ctrl+C: the exception, the signal's name, the terminal's echo '^C' in front of the next line.
_INTERRUPT = declare(
    r"^(?:\w+\.)*KeyboardInterrupt\b|\bSIGINT\b|^\^C|Aborted!$",
    "KeyboardInterrupt",
    "SIGINT",
    "^C",
    "Aborted!",
)
_CUT_ALARM = re.compile(r"(?:ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[")  # prefix cut off
_STAMP = re.compile(r"\b(?:\d\d-\d\d|\d{4}-\d\d-\d\d)[ T](\d\d):(\d\d):(\d\d)\b")
declare_words("ERROR", "CRITICAL")  # notable lines go by their level
CONTEXT_LINES = 12
_UNSEEN = object()
_NUL_HOLE = re.compile("\0{16,}")
HYPERSCAN_BLOCK = 1 << 20  # a block this big is scanned with Hyperscan, when installed
INDEX_AFTER = 2000  # lines matched against the rules before their words are indexed (Hyperscan)


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
        self,
        rules: Sequence[Rule] | None = None,
        extra_rule_dirs: Iterable[Path] = (),
        max_bytes: int | None = None,
    ) -> None:
        self.max_bytes = max_bytes  # decompressed-size cap (see logread.open_source)
        self.knowledge = builtin_knowledge()
        base = list(rules) if rules is not None else load_rules(extra_rule_dirs)
        self.rules = lend_exceptions(base, self.knowledge)
        self._words = self.prefilter_words()
        self._words_served = self.prefilter_words(served=True)
        self._prefilter = literal_matcher(self._words)
        self._prefilter_served = literal_matcher(self._words_served)
        self._find, self._find_served = (
            span_finder(self._prefilter),
            span_finder(self._prefilter_served),
        )
        # The fast paths (whole starts echoed, runs.Echo); OFFLOAD_DOCTOR_PURE=1 leaves the line by
        # line engine alone, the reference the tests hold them to.
        self.fast = os.environ.get("OFFLOAD_DOCTOR_PURE", "") in ("", "0")
        self._scanners: tuple[Any, ...] | None = None  # Hyperscan's, once a big block came
        self._digit_hits, self._digit_near = _digit_finders(self._words)

    def prefilter_words(self, *, served: bool = False) -> list[tuple[str, bool]]:
        """(word, ignore case): the declared fact words, the knowledge's and the rules' keywords."""
        words = dict(prefilter_words(served=served))
        for word in (*self.knowledge.keywords, *(k for r in self.rules for k in r.keywords)):
            words.setdefault(word, False)
        return sorted(words.items(), key=lambda wi: (-len(wi[0]), wi))

    # -- inputs ---------------------------------------------------------------------------
    def analyze_source(self, source: logread.Source) -> Analysis:
        stream = logread.open_source(source, self.max_bytes)
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

    def visible(self, raw: str) -> bool:
        """Whether a line holds a word that every prefilter keeps (the streaming path sees it)."""
        return self._find_served(raw.encode(), 0) is not None

    def analyze_lines(self, lines: Iterable[str], name: str = "<lines>") -> Analysis:
        state = _State(self.rules, self.knowledge, self.visible, self.fast)
        for no, raw in enumerate(lines, start=1):
            for part in split_long(raw.rstrip("\n")):
                state.feed_raw(no, part)
        return state.finish(name, lines_read=state.last_no)

    def _analyze_stream(self, stream: Any, name: str) -> Analysis:
        state = _State(self.rules, self.knowledge, self.visible, self.fast)
        error: str | None = None
        line_base = 0
        first = True
        try:
            for block in logread.iter_blocks(stream):
                if first:
                    first = False
                    if logread.looks_binary(block[:8192]):
                        raise InputError(f"{name}: binary file, not a log")
                    # vLLM's level prefix on a line the prefilter skips still makes it vLLM's log.
                    if _LEVEL_PREFIX.search(block, 0, 1 << 16):
                        state.saw_level = True
                line_base = self._scan_block(block, line_base, state)
        except logread.InputStopped as exc:
            error = str(exc)
        except logread.TruncatedInput as exc:
            error = f"input ended early ({exc}); analysed what could be read"
        if first:
            raise InputError(f"{name}: empty file")
        return state.finish(name, lines_read=line_base, error=error)

    def _scan_block(self, block: bytes, line_base: int, state: _State) -> int:
        """Feed a block's interesting lines; returns the line count after it."""
        if b"\0" not in block:
            return self._scan(block, line_base, state)
        # A hole of NUL bytes: a second writer's lines follow (runs.py); each side is scanned.
        for i, part in enumerate(logread.NUL_HOLE.split(block)):
            if i:
                state.hole(line_base + 1)
            line_base = self._scan(part, line_base, state)
        return line_base

    def _finders(self, block: bytes, state: _State) -> tuple[Any, Any]:
        """The prefilter's finds over a block (all words, the served ones): Hyperscan's for a big
        block when it is installed (compiled on first need: a short log never pays its 20-40 ms),
        else RE2's."""
        if not self.fast or len(block) < HYPERSCAN_BLOCK:
            return self._find, self._find_served
        if self._scanners is None:
            words = self._words
            served = set(self._words_served)
            scan_all = block_scanner(words)
            scan_served = block_scanner(sorted(served, key=lambda wi: (-len(wi[0]), wi)))
            wanted = [wi in served for wi in words]
            self._scanners = (scan_all, scan_served, wanted) if scan_all and scan_served else ()
        if not self._scanners:
            return self._find, self._find_served
        every, only, keep = self._scanners
        if state.collector.served_requests:  # most of a serving log: its bulk words left out
            return self._find, only(block, [None])[0]  # a start after it begins with RE2's
        find_all, find_served = every(block, [None, keep])
        return find_all, find_served

    def _scan(self, block: bytes, line_base: int, state: _State) -> int:
        # One search per interesting line: after a hit, resume at the next line (linear time).
        find_all, find_served = self._finders(block, state)
        feed = state.feed_raw
        pos = 0
        counted_to = 0
        line_no = line_base
        size = len(block)
        while pos < size:
            # The start's first served request drops the words it no longer needs (a serving
            # log's access and stats lines), from the next line on.
            find = find_served if state.collector.served_requests else find_all
            span = find(block, pos)
            if span is None:
                break
            start = block.rfind(b"\n", pos, span[0]) + 1 or pos
            end = block.find(b"\n", span[1])
            if end < 0:
                end = size
            line_no += block.count(b"\n", counted_to, start)
            counted_to = start
            raw = block[start:end].decode("utf-8", "replace")
            if len(raw) < SPLIT_THRESHOLD:
                feed(line_no + 1, raw)
                if state.started_at == line_no + 1 and self.fast:
                    served = bool(state.collector.served_requests)
                    start, end, line_no = self._echo(block, start, end, line_no, served, state)
                    counted_to = start
            else:
                for part in split_long(raw):
                    feed(line_no + 1, part)
            pos = end + 1
        return line_no + block.count(b"\n", counted_to)

    def _echo(
        self, block: bytes, start: int, end: int, line_no: int, served: bool, state: _State
    ) -> tuple[int, int, int]:
        """At a start's first line (offsets start, end; line line_no + 1): skip the starts from here
        that repeat the echo start (runs.Echo), else make the start that just ended the echo start.
        Returns the offsets and line index of the start's first line that is fed next."""
        mark = state.echo_mark
        moved = False
        for attempt in range(2):
            if attempt:  # the start that just ended, fed in full, becomes the echo start
                if moved or mark is None or mark[0] is not block or mark[1] != served:
                    break
                window = block[mark[2] : end + 1]
                if not runs.Echo.fits(window):
                    break
                ref = runs.Echo(window, line_no + 1 - mark[3], state.closed,
                                state.splitter.snapshot(), self._digit_near)  # fmt: skip
                state.echo = (served, ref)
            while state.echo is not None and state.echo[0] == served:
                ref = state.echo[1]
                if ref.visible and not state.runs.repeats(ref.sig):
                    break  # only a start merged with the one before is skipped unjudged
                rename = ref.rename(block, start, self._digit_hits)
                if rename is None:
                    break
                start += ref.last_at
                end = start + (ref.size - ref.last_at) - 1
                line_no += ref.lines
                state.echo_start(line_no + 1, ref, rename)
                state.feed_started(line_no + 1, block[start:end].decode("utf-8", "replace"))
                moved = True
        state.echo_mark = (block, served, start, line_no + 1)
        return start, end, line_no


def _digit_finders(
    words: Sequence[tuple[str, bool]],
) -> tuple[Callable[[bytes], list[int]], Callable[[bytes], list[int]]]:
    """Where the prefilter words with digits match, and where they match with every digit made 0
    in a text whose digits are made 0 (runs.Echo: a digit they hold might change)."""
    digit_words = [wi for wi in words if any(c.isdigit() for c in wi[0])]
    if not digit_words:
        return (lambda data: []), (lambda data: [])
    hits = literal_matcher(digit_words)

    def at(data: bytes) -> list[int]:
        return [m.start() for m in hits.finditer(data)]

    if any(len(w) > runs.NEAR for w, _ in digit_words):  # Echo looks only this far around a digit
        return at, (lambda data: list(range(0, len(data), runs.NEAR)))
    zero = str.maketrans("0123456789", "0000000000")
    near = literal_matcher([(w.translate(zero), i) for w, i in digit_words])
    return at, (lambda data: [m.start() for m in near.finditer(data)])


class _State:
    """Everything kept while one input streams past: bounded whatever its size."""

    replay = True  # repeated lines replayed from their plan (tests compare with False)

    def __init__(
        self,
        rules: Sequence[Rule],
        knowledge: Knowledge,
        visible: Callable[[str], bool],
        fast: bool = False,
    ) -> None:
        self.rules = rules
        self.knowledge = knowledge
        self.matching = [r for r in rules if r.patterns]
        self._rule_words = span_finder(
            literal_matcher(sorted({(k, False) for r in self.matching for k in r.keywords}))
        )
        self._by_line = any(r.where == "line" for r in self.matching)
        self.fast = fast
        self._matched_lines = 0  # lines matched against the rules so far
        self.keywords: Callable[[bytes], list[int]] | None = None  # patterns.keyword_index
        self._match_cache = repeats.Memo()  # text -> ((rule, groups), ...)
        self.plans = repeats.Memo()  # key -> Plan, or None: always processed in full
        self.matched: list[str] = []  # rule ids matched by the line being fed
        # rule id -> (first line, its characters, give-ups): timed out; tried no more at the cap
        self.gave_up: dict[str, tuple[int, int, int]] = {}
        self.saw_level = False
        self.last_no = 0
        self.splitter = runs.Splitter(visible)
        self.runs = runs.Runs()
        self.started_at = 0  # the line where the Splitter last began a start
        self.closed = (0, False)  # run_sig and run_visible of the start that ended there
        self.echo: tuple[bool, runs.Echo] | None = None  # (served, start) Engine._echo skips
        # (block, served, offset, line) of the last start's first line (served: the prefilter
        # left the served words out when it was fed)
        self.echo_mark: tuple[bytes, bool, int, int] | None = None
        self._start_run(1)

    def _start_run(self, first_line: int) -> None:
        """What belongs to one server start; the caches above serve every start."""
        self.run_first_line = first_line
        self.run_sig = 0  # a fingerprint of the start's lines, pids and times left out
        self.run_visible = False  # whether the start holds a line the streaming path sees
        self.open_now = -1  # _open's bits, or -1: to be computed
        self.clues = verdict.Clues()
        self.collector = FactCollector()
        self.hits: dict[str, _Hit] = {}
        self.notable_first: list[Evidence] = []
        self.notable_last: deque[Evidence] = deque(maxlen=6)
        self.ready_line: int | None = None
        self.first_fatal_line: int | None = None
        # (line, message) of the last lines: the context of a rule's first match.
        self.recent: deque[tuple[int, str]] = deque(maxlen=CONTEXT_LINES)
        self.reports = reports.Reports()
        # Dating an undated V2 run: 'Using V2 Model Runner' exists from 0.16; a loading line with
        # four decimals is the %.4f of V1 <=0.11 (or V2 0.12-0.13), two or fewer is format_gib (0.14+).
        self.v2_banner = False
        self.loading_4dp: bool | None = None
        self.first_stamp: int | None = None  # seconds of the day of the first dated line
        self.last_stamp: int | None = None
        self.stamp_text: str | None = None  # a replayed dated line later than last_stamp, unread
        self.interrupt_after: float | None = None
        # An engine-level alarm (CRITICAL/ERROR line, death, wrapper) after the server came up:
        # readiness followed by a fatal event is not healthy.
        self.alarm_after_up: Evidence | None = None

    def feed(self, line: Line) -> None:
        self.matched.clear()  # the rules of this line only: a flood of matching lines stays bounded
        self.last_no = line.no
        self.open_now = -1
        report = self.reports.feed(line)
        if report is not None:
            if report == "shell prompt":
                self.collector.feed(line)  # the command line still gives the arguments
            return  # a pasted report, not an event of this run
        self.collector.feed(line)
        msg = line.msg
        if line.level is not None:
            self.saw_level = True  # vLLM's 'LEVEL mm-dd hh:mm:ss [file:line]' or uvicorn's prefix
        if msg.startswith("Using V2 Model Runner"):
            self.v2_banner = True
        elif msg.startswith("Model loading took "):
            m = _LOADING_NUMBER.match(msg)
            if m:
                self.loading_4dp = len(m.group(1) or "") == 4
        if self.ready_line is None and self.collector.facts.reached_ready:
            self.ready_line = line.no
        wrapper = self.clues.feed(line, self.knowledge, self.collector.frames)
        if line.level:
            self._stamp(line.text)
        if self.clues.interrupt is None and (_INTERRUPT.search(msg) or line.text.startswith("^C")):
            self.clues.interrupt = Evidence(line.no, scrub_cut(line.text, 400))
            if self.stamp_text is not None:
                self._stamp(self.stamp_text)
            if self.first_stamp is not None and self.last_stamp is not None:
                self.interrupt_after = (self.last_stamp - self.first_stamp) % 86400
        if (
            self._armed()
            and (wrapper or line.level in ("ERROR", "CRITICAL") or _CUT_ALARM.match(msg))
            and not _request_level(line)
        ):
            self.alarm_after_up = Evidence(line.no, scrub_cut(line.text, 400))
        exc = _EXCEPTION.match(msg)
        is_exception = bool(exc) or bool(_FATAL_HINT.search(msg))
        if exc is not None and not wrapper:
            self.clues.note_exception(line, msg[exc.end() :].strip())
        if is_exception and self.first_fatal_line is None:
            self.first_fatal_line = line.no
        if is_exception or (
            line.level in ("ERROR", "CRITICAL") and not msg.startswith(("File ", "^", "~"))
        ):
            ev = Evidence(line.no, line.text[: NOTABLE_CUT * 4])
            if len(self.notable_first) < 4:
                self.notable_first.append(ev)
            else:
                self.notable_last.append(ev)
        matches = self._matches(line)
        if "Value error, " in msg:
            self.clues.note_wrapped(line, msg, [r for r, _ in matches])
        for rule, groups in matches:
            if wrapper and rule.category is Category.CRASH_OTHER:
                continue  # a wrapper announces a failure; its cause is elsewhere
            hit = self.hits.get(rule.id)
            if hit is None:
                hit = self.hits[rule.id] = _Hit(
                    rule,
                    groups=dict(groups),
                    # By line number, so lines the prefilter drops make no difference.
                    context=tuple(t for n, t in self.recent if n >= line.no - CONTEXT_LINES),
                )
            else:
                for key, value in groups.items():
                    hit.groups.setdefault(key, value)
            self.matched.append(rule.id)
            hit.count += 1
            if len(hit.evidence) < MAX_EVIDENCE and all(e.line != line.no for e in hit.evidence):
                hit.evidence.append(Evidence(line.no, line.text[: EVIDENCE_CUT * 4]))
        self.recent.append((line.no, msg))

    def _armed(self) -> bool:
        """Whether an alarm line now would be a fatal event after the server came up."""
        return bool(
            self.alarm_after_up is None
            and self.clues.interrupt is None  # errors while stopping on Ctrl+C are not the cause
            and not self.collector.facts.shut_down
            and (
                self.ready_line is not None
                or self.collector.serving_setup
                or self.collector.served_requests
            )
        )

    def _stamp(self, text: str) -> bool:
        """Note the time of a dated line; False when it has none."""
        stamp = _STAMP.search(text[:80])
        if stamp is None:
            return False
        secs = int(stamp[1]) * 3600 + int(stamp[2]) * 60 + int(stamp[3])
        if self.first_stamp is None:
            self.first_stamp = secs
        self.last_stamp = secs
        self.stamp_text = None
        return True

    def _open(self) -> int:
        """The bounded or one-time clues a line could still add to, as bits (replays keep them)."""
        if self.open_now < 0:  # only a line fed in full changes them
            c = self.clues
            self.open_now = (
                self._armed()
                | (c.interrupt is None) << 1
                | (len(c.stack) < 3) << 2
                | (len(c.deaths) < 3) << 3
                | (len(c.wrapped) < verdict.MAX_EXCEPTIONS) << 4
            )
        return self.open_now

    def _matches(self, line: Line) -> tuple[tuple[Rule, dict[str, Any]], ...]:
        """The rules whose patterns match this line, with their named groups (cached by text)."""
        key = (line.msg, line.text) if self._by_line else line.msg
        found: tuple[tuple[Rule, dict[str, Any]], ...] | None = self._match_cache.get(key)
        if found is not None:
            return found
        found = ()
        data = line.text.encode()
        if self._matched_lines < INDEX_AFTER or self.keywords is None:
            self._matched_lines += 1
            if self._matched_lines == INDEX_AFTER and self.fast:  # many lines: worth compiling
                self.keywords = keyword_index([r.keywords for r in self.matching])
            # One scan for all keywords (most lines hold none), then each rule's words.
            rules = self.matching if self._rule_words(data, 0) else ()
        else:
            rules = [self.matching[i] for i in self.keywords(data)]  # the rules with a word here
        if rules:
            for rule in rules:
                text = line.text if rule.where == "line" else line.msg
                first = self.gave_up.get(rule.id)
                if first is not None and first[2] >= MAX_GIVE_UPS:
                    continue
                if any(k in text for k in rule.keywords):
                    m, gave_up = rule.attempt(text)
                    if gave_up:
                        no, chars, times = first or (line.no, len(text), 0)
                        self.gave_up[rule.id] = (no, chars, times + 1)
                    if m is not None:
                        found += ((rule, {k: v for k, v in m.groupdict().items() if v}),)
        if len(line.text) <= repeats.MAX_KEY:
            self._match_cache.remember(key, len(line.text), found)
        return found

    # -- repeated lines (repeats.py) -------------------------------------------------------
    def feed_raw(self, no: int, raw: str) -> None:
        """Feed one raw line; one that repeats an earlier line but for pid and time is replayed."""
        if "\0" in raw:
            parts = _NUL_HOLE.split(raw)
            if len(parts) > 1:  # two writers' lines either side of a hole (runs.py)
                for i, part in enumerate(parts):
                    if i:
                        self.hole(no)
                    if part:
                        self._feed_raw(no, part)
                return
        self._feed_raw(no, raw)

    def _feed_raw(self, no: int, raw: str) -> None:
        # In an input that holds pasted reports (compare's commands.txt), a command line is theirs.
        if self.splitter.new_start(raw, self._ended, self._progressed) and not self.reports.kinds:
            self.new_start(no)
            self.started_at = no
        self.feed_started(no, raw)

    def feed_started(self, no: int, raw: str) -> None:
        """Feed a line once the Splitter has said whether it begins a start."""
        if not self.run_visible:
            self.run_visible = self.splitter.visible(raw)
        key = repeats.key(raw)
        # The same fingerprint on both paths: identical starts are merged alike (runs.Runs.repeat).
        self.run_sig = hash(
            (self.run_sig, key if key is not None else raw, no - self.run_first_line)
        )
        plan = self.plans.get(key, _UNSEEN) if self.replay and key is not None else None
        if (
            isinstance(plan, repeats.Plan)
            and plan.reports == self.reports.state(no)
            # A plan made in an earlier start: its rules' first match in this one is fed in full.
            and (not plan.rules or all(r in self.hits for r in plan.rules))
            # Nothing open now that was closed when the plan was made (its effect is the same).
            and not (self._open() & ~plan.open)
        ):
            self._replay(no, raw.rstrip(), plan)
            return
        line = parse(no, raw)
        if plan is None or key is None:
            self.feed(line)
            return
        self.plans.remember(key, 2 * len(key), self._observe(line, raw))

    def _reports_state(self, no: int) -> tuple[Any, ...]:
        return self.reports.state(no)

    def _observe(self, line: Line, raw: str) -> repeats.Plan | None:
        """Feed `line` and note what it did, when that can be replayed for a repeat."""
        frames, clues = self.collector.frames, self.clues
        last_frame = frames[-1] if frames else None
        clue_state = (clues.frame, len(clues.deaths), tuple(clues.wrappers), tuple(clues.methods))
        exceptions = len(clues.exceptions)
        notables = (len(self.notable_first), self.notable_last[-1] if self.notable_last else None)
        report_lines, report_state = self.reports.lines, self._reports_state(line.no)
        open_before = self._open()
        events = self._events()
        self.matched.clear()
        self.feed(line)
        if events != self._events():
            return None  # an exception, an interrupt, a wrapped message, a fatal line after ready
        framed = bool(frames) and frames[-1] is not last_frame
        if line.text != raw.rstrip() or (not framed and self.collector.touches(line.text)):
            return None  # a fact line, or one a collector prefix or ANSI codes change
        if self.reports.lines != report_lines or self._reports_state(line.no) != report_state:
            return None  # a pasted report's line
        if clue_state[1:] != (len(clues.deaths), tuple(clues.wrappers), tuple(clues.methods)):
            return None  # a wrapper, a death, a worker's method
        if len(clues.exceptions) != exceptions:
            return None  # a new exception message: its first line must stay the evidence
        entry = None
        if clues.frame is not clue_state[0]:
            if not framed or clues.frame is None:
                return None
            entry = clues.frame[1]
        notable = notables != (
            len(self.notable_first),
            self.notable_last[-1] if self.notable_last else None,
        )
        frame = (frames[-1][1], frames[-1][2]) if framed else None
        return repeats.Plan(
            line.msg,
            frame,
            entry,
            notable,
            tuple(self.matched),
            report_state,
            fatal=bool(_EXCEPTION.match(line.msg) or _FATAL_HINT.search(line.msg)),
            dated=bool(line.level) and _STAMP.search(line.text[:80]) is not None,
            open=open_before,
        )

    def _events(self) -> tuple[Any, ...]:
        c = self.clues
        return (c.raised, c.interrupt, len(c.wrapped), len(c.stack), self.alarm_after_up)

    def _replay(self, no: int, text: str, plan: repeats.Plan) -> None:
        """What `feed` does for a repeat of a line whose plan this is, without parsing it."""
        self.last_no = no
        if plan.fatal and self.first_fatal_line is None:
            self.first_fatal_line = no
        if plan.dated:
            if self.first_stamp is None:
                self._stamp(text)
            else:
                self.stamp_text = text  # read only if an interrupt needs it
        if plan.frame is not None:
            self.collector.add_frame(no, *plan.frame)
            if plan.frame_entry is not None:
                self.clues.frame = (Evidence(no, scrub_cut(text, 400)), plan.frame_entry)
        if plan.notable:
            ev = Evidence(no, text[: NOTABLE_CUT * 4])
            if len(self.notable_first) < 4:
                self.notable_first.append(ev)
            else:
                self.notable_last.append(ev)
        for rule_id in plan.rules:
            hit = self.hits[rule_id]
            hit.count += 1
            if len(hit.evidence) < MAX_EVIDENCE and all(e.line != no for e in hit.evidence):
                hit.evidence.append(Evidence(no, text[: EVIDENCE_CUT * 4]))
        self.recent.append((no, plan.msg))

    # -- server starts (runs.py) -----------------------------------------------------------
    def _ended(self) -> bool:
        """Whether the current start has ended: a fatal line, a death, an interrupt, a shutdown."""
        c = self.clues
        return bool(
            self.first_fatal_line is not None
            or c.deaths
            or c.interrupt is not None
            or self.collector.facts.shut_down
        )

    def _progressed(self) -> bool:
        """Whether the current start got past its header: a start-up phase, or its end."""
        return self.collector.phase != "start" or self._ended()

    def hole(self, no: int) -> None:
        """A hole of NUL bytes at line `no`: another writer's lines follow."""
        self.splitter.hole()
        self.new_start(no)

    def new_start(self, no: int) -> None:
        """A server start begins at line `no`: judge the one before on its own, then start afresh."""
        if self.run_visible:
            last = no - 1
            if not self.runs.repeat(self.run_sig, last):
                run = self._finish_run("", last)
                self.runs.add(
                    self.run_first_line,
                    last,
                    run,
                    verdict.decides(run, self._ended()),
                    self.run_sig,
                )
        self.closed = (self.run_sig, self.run_visible)
        self._start_run(no)

    def echo_start(self, no: int, ref: runs.Echo, rename: dict[str, str]) -> None:
        """The lines up to `no` repeat `ref`'s start (runs.Echo): what feeding them would leave.

        Its start is merged with the one before unjudged, and the Splitter is where it was after
        `ref`'s last line, pids renamed; line `no` begins a start (it is fed next).
        """
        self.run_sig, self.run_visible = ref.sig, ref.visible
        self.new_start(no)
        self.splitter.restore(ref.splitter, rename)
        self.started_at = no

    # -- verdict (verdict.py decides) -------------------------------------------------------
    def finish(self, name: str, lines_read: int, error: str | None = None) -> Analysis:
        last = self._finish_run(name, lines_read, error)
        end = max(lines_read, self.run_first_line)
        return self.runs.result(
            self.run_first_line, end, last, verdict.decides(last, self._ended())
        )

    def _finish_run(self, name: str, lines_read: int, error: str | None = None) -> Analysis:
        seen = verdict.Observed(
            rules=self.rules,
            collector=self.collector,
            reports=self.reports,
            clues=self.clues,
            hits=self.hits,
            ready_line=self.ready_line,
            first_fatal_line=self.first_fatal_line,
            alarm_after_up=self.alarm_after_up,
            notable_first=self.notable_first,
            notable_last=self.notable_last,
            v2_banner=self.v2_banner,
            loading_4dp=self.loading_4dp,
            interrupt_after=self.interrupt_after,
            gave_up=self.gave_up,
            saw_level=self.saw_level,
        )
        return verdict.judge(seen, name, lines_read, error)


# The OpenAI front end's files: their ERROR lines are about one request (old prefixes have no '[').
_REQUEST_FILE = re.compile(
    r"[\[\s](?:serving_\w*|protocol|api_server|launcher|logger|chat_utils|\w*tool_parser|\w*reasoning\w*"
    r"|harmony_utils|responses\w*)\.py:\d+\]"
)


def _request_level(line: Line) -> bool:
    """An ERROR about one request (a 4xx, a bad prompt) is the server working, not dying."""
    if line.level != "ERROR":
        return False
    return bool(_REQUEST_FILE.search(line.text[:200])) and "dead" not in line.msg


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
