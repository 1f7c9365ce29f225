"""The log engine: stream a log once, collect facts and rule hits, name one root cause."""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_offload_doctor.analyze import logread, recall, repeats, reports, runs, verdict
from vllm_offload_doctor.analyze.ahead import PieceScan, Reads
from vllm_offload_doctor.analyze.facts import FactCollector, Ops, extract, frame_of
from vllm_offload_doctor.analyze.knowledge import Knowledge, builtin_knowledge, lend_exceptions
from vllm_offload_doctor.analyze.model import (
    Analysis,
    Category,
    Evidence,
)
from vllm_offload_doctor.analyze.normalize import SPLIT_THRESHOLD, Line, parse, split_long
from vllm_offload_doctor.analyze.patterns import (
    MAX_TEXT,
    Piece,
    Selected,
    block_scanner,
    declare,
    declare_words,
    literal_matcher,
    prefilter_words,
    rule_selector,
    span_finder,
)
from vllm_offload_doctor.analyze.rules import MAX_GIVE_UPS, Rule, load_rules
from vllm_offload_doctor.analyze.verdict import EVIDENCE_CUT, FRAME_CUT, MAX_EVIDENCE, NOTABLE_CUT
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
SEEN_BITS = 1 << 20  # a bitmap of the keys seen once (128 KiB)
_WHOLE = object()  # a plan kept under the whole line's key (engine._State.feed_started)
_NUL_HOLE = re.compile("\0{16,}")
HYPERSCAN_BLOCK = 1 << 20  # a block this big is scanned with Hyperscan, when installed
# Lines matched against the rules before their patterns are compiled into one Hyperscan scan
# (0.2 s, once a process; it saves ~40 us on a line holding a keyword).
INDEX_AFTER = 5000
ECHOES = 4  # echo starts kept (runs.Echo), the most recently used first
CARRY_MAX = 8 << 20  # the longest start carried into the next block to be echoed


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
            # A file may be read ahead by a thread (ahead.py); stdin, which may block, is not.
            return self._analyze_stream(stream, source.name, ahead=source.path is not None)
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

    def _analyze_stream(self, stream: Any, name: str, ahead: bool = False) -> Analysis:
        state = _State(self.rules, self.knowledge, self.visible, self.fast)
        error: str | None = None
        line_base = 0
        first = True
        carried = b""  # from a start's first line (fed) to the block's end: see _scan
        reads = Reads(logread.iter_blocks(stream), self._ahead_scan(state))
        try:
            for read in reads:
                block = read.data
                pieces = read.take()  # what the read-ahead thread scanned of it (ahead.py)
                if first:
                    first = False
                    if logread.looks_binary(block[:8192]):
                        raise InputError(f"{name}: binary file, not a log")
                    # vLLM's level prefix on a line the prefilter skips still makes it vLLM's log.
                    if _LEVEL_PREFIX.search(block, 0, 1 << 16):
                        state.saw_level = True
                if carried:
                    block, carried = carried + block, b""  # the pieces' offsets moved
                    line_base, cut = self._scan(block, line_base, state, resumed=True)
                else:
                    line_base, cut = self._scan_block(block, line_base, state, pieces)
                if cut is not None:
                    carried = block[cut:]
                if ahead:  # a thread reads and scans ahead while the start serves, in big blocks
                    reads.ahead(
                        len(read.data) >= HYPERSCAN_BLOCK
                        and bool(self._scanners)
                        and bool(state.collector.served_requests)
                    )
            if carried:
                line_base, _ = self._scan(carried, line_base, state, resumed=True, last=True)
        except logread.InputStopped as exc:
            error = str(exc)
        except logread.TruncatedInput as exc:
            error = f"input ended early ({exc}); analysed what could be read"
        finally:
            reads.close()  # the thread stops now, not when an error's frames are freed
        if first:
            raise InputError(f"{name}: empty file")
        return state.finish(name, lines_read=line_base, error=error)

    def _ahead_scan(self, state: _State) -> Callable[[], PieceScan | None]:
        """For the read-ahead thread, as it reads a block: the served words' piece scan while the
        start serves (made once, with its own scratch), else None. The engine starts the thread
        only once it built its scanners (_finders)."""
        made: list[PieceScan] = []

        def scan() -> PieceScan | None:
            if not state.collector.served_requests or not self._scanners:
                return None
            if not made:
                made.append(self._scanners[1].piece_scan())
            return made[0]

        return scan

    def _scan_block(
        self, block: bytes, line_base: int, state: _State, pieces: Sequence[Piece] = ()
    ) -> tuple[int, int | None]:
        """Feed a block's interesting lines; returns the line count after them and where the
        scan stopped to be carried into the next block (see _scan), or None. `pieces`: the served
        words' scan of the block begun by the read-ahead thread."""
        if b"\0" not in block:
            return self._scan(block, line_base, state, pieces=pieces)
        # A hole of NUL bytes: a second writer's lines follow (runs.py); each side is scanned.
        for i, part in enumerate(logread.NUL_HOLE.split(block)):
            if i:
                state.hole(line_base + 1)
            line_base, _ = self._scan(part, line_base, state, last=True)
        return line_base, None

    def _finders(
        self, block: bytes, state: _State, pieces: Sequence[Piece] = ()
    ) -> tuple[Any, Any]:
        """The prefilter's finds over a block (all words, the served ones): Hyperscan's for a big
        block when it is installed (compiled on first need: a short log never pays its 20-40 ms),
        else RE2's. The served finds begin with the read-ahead's `pieces`."""
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
            return self._find, only(block, [None], pieces)[0]  # a start after it: RE2's
        find_all, find_served = every(block, [None, keep])
        return find_all, find_served

    def _scan(
        self,
        block: bytes,
        line_base: int,
        state: _State,
        *,
        resumed: bool = False,
        last: bool = False,
        pieces: Sequence[Piece] = (),
    ) -> tuple[int, int | None]:
        """Feed the block's interesting lines (lines line_base + 1 on); returns the line count
        after them and None, or, where a start that an echo start may repeat runs past the
        block's end, the count before its first line and that line's offset: the caller scans
        from there again with the next block joined (`resumed`: its first line is fed already).
        `last`: nothing follows."""
        # One search per interesting line: after a hit, resume at the next line (linear time).
        find_all, find_served = self._finders(block, state, pieces)
        feed = state.feed_raw
        pos = 0
        counted_to = 0
        line_no = line_base
        size = len(block)
        if resumed:
            end = block.find(b"\n")
            served = bool(state.collector.served_requests)
            start, end, line_no = self._echo(block, 0, end, line_no, served, state)
            counted_to, pos = start, end + 1
            if start and not last and self._cut_short(state, served, block, start):
                return line_no, start
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
            line_no += logread.newlines(block, counted_to, start)
            counted_to = start
            raw = block[start:end].decode("utf-8", "replace")
            if len(raw) < SPLIT_THRESHOLD:
                feed(line_no + 1, raw)
                if state.started_at == line_no + 1 and self.fast:
                    served = bool(state.collector.served_requests)
                    start, end, line_no = self._echo(block, start, end, line_no, served, state)
                    counted_to = start
                    if not last and self._cut_short(state, served, block, start):
                        return line_no, start
            else:
                for part in split_long(raw):
                    feed(line_no + 1, part)
            pos = end + 1
        return line_no + logread.newlines(block, counted_to, size), None

    @staticmethod
    def _cut_short(state: _State, served: bool, block: bytes, start: int) -> bool:
        """Whether an echo start or a start judged before might repeat the start from `start`,
        were its bytes all in the block (a restart that straddles two blocks); a bounded carry."""
        left = len(block) - start
        if any(
            was_served == served and left < ref.size <= CARRY_MAX
            and (not ref.visible or state.runs.repeats(ref.sig))
            for was_served, ref in state.echoes
        ):  # fmt: skip
            return True
        first = block[start : block.find(b"\n", start) + 1]
        return left < state.seen.longest(first) <= CARRY_MAX

    def _echo(
        self, block: bytes, start: int, end: int, line_no: int, served: bool, state: _State
    ) -> tuple[int, int, int]:
        """At a start's first line (offsets start, end; line line_no + 1): keep the start that just
        ended as an echo start, then skip the starts from here that repeat one (runs.Echo).
        Returns the offsets and line index of the start's first line that is fed next."""
        mark = state.echo_mark
        # The start that just ended, fed in full, becomes an echo start (kept with the others).
        if mark is not None and mark[0] is block and mark[1] == served:
            window = block[mark[2] : end + 1]
            if runs.Echo.fits(window):
                ref = runs.Echo(window, line_no + 1 - mark[3], state.closed,
                                state.splitter.snapshot(), self._digit_near)  # fmt: skip
                state.echoes.insert(0, (served, ref))
                del state.echoes[ECHOES:]
                state.learn(window, mark, ref)
        moved = False
        while True:
            found = self._echoed(block, start, served, state)
            if found is not None:
                ref, rename = found
                start += ref.last_at
                end = start + (ref.size - ref.last_at) - 1
                line_no += ref.lines
                state.echo_start(line_no + 1, ref, rename)
            else:
                key = state.recall_key(served)
                first = block[start : end + 1]
                known = state.seen.recall(block, start, first, key) if key is not None else None
                if known is None:
                    break
                seen, learned = known
                start += seen.last_at
                end = start + (len(seen.window) - seen.last_at) - 1
                line_no += seen.lines
                state.recall_start(line_no + 1, seen, learned)
            moved = True
        if moved:  # the first line of the start that is not skipped (echo_start drops the others')
            state.feed_started(line_no + 1, block[start:end].decode("utf-8", "replace"))
        state.echo_mark = (block, served, start, line_no + 1, state.recall_key(served))
        return start, end, line_no

    def _echoed(
        self, block: bytes, at: int, served: bool, state: _State
    ) -> tuple[runs.Echo, dict[str, str]] | None:
        """The echo start the bytes from `at` repeat (the most recent first), with its renaming.

        Several are kept: a crash loop whose pids gain a digit (999 -> 1000) prints starts of
        another size, and the start of the old size comes back when the pids wrap around."""
        for i, (was_served, ref) in enumerate(state.echoes):
            if was_served != served or (ref.visible and not state.runs.repeats(ref.sig)):
                continue  # only a start merged with the one before is skipped unjudged
            rename = ref.rename(block, at, self._digit_hits)
            if rename is not None:
                if i:
                    state.echoes.insert(0, state.echoes.pop(i))
                return ref, rename
        return None


def _digit_finders(
    words: Sequence[tuple[str, bool]],
) -> tuple[Callable[[bytes], list[int]], Callable[[bytes], list[int] | None]]:
    """Where the prefilter words with digits match, and where they match with every digit made 0
    in a text whose digits are made 0 (runs.Echo: a digit they hold might change; None:
    anywhere, for a word too long to be looked for near a digit)."""
    digit_words = [wi for wi in words if any(c.isdigit() for c in wi[0])]
    if not digit_words:
        return (lambda data: []), (lambda data: [])
    hits = literal_matcher(digit_words)

    def at(data: bytes) -> list[int]:
        return [m.start() for m in hits.finditer(data)]

    if any(len(w.encode()) > runs.NEAR for w, _ in digit_words):  # Echo looks this far at most
        return at, (lambda data: None)
    zero = str.maketrans("0123456789", "0000000000")
    near = literal_matcher([(w.translate(zero), i) for w, i in digit_words])
    return at, (lambda data: [m.start() for m in near.finditer(data)])


_TABLES: dict[tuple[int, ...], tuple[Sequence[Rule], Any]] = {}


def _rule_tables(rules: Sequence[Rule]) -> Any:
    """What _State derives from the rules, made once per rule set (a batch makes a _State per
    file): the rules with patterns, one finder of all their keywords, each rule's patterns in
    order, and each keyword once with the rules it names, for message rules and line rules."""
    key = tuple(map(id, rules))
    known = _TABLES.get(key)
    if known is not None and all(a is b for a, b in zip(known[0], rules, strict=True)):
        return known[1]
    matching = [r for r in rules if r.patterns]
    words = span_finder(literal_matcher(sorted({(k, False) for r in matching for k in r.keywords})))
    every = [tuple(range(len(r.patterns))) for r in matching]
    owners: dict[str, tuple[tuple[str, tuple[int, ...]], ...]] = {
        where: tuple(
            (k, tuple(i for i, r in enumerate(matching) if r.where == where and k in r.keywords))
            for k in sorted({k for r in matching if r.where == where for k in r.keywords})
        )
        for where in ("message", "line")
    }
    if len(_TABLES) >= 16:
        _TABLES.clear()  # rule sets of engines gone (tests make many)
    tables = (matching, words, every, owners)
    _TABLES[key] = (tuple(rules), tables)
    return tables


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
        self.matching, self._rule_words, self._every, self._owners = _rule_tables(rules)
        self.fast = fast
        self._matched_lines = 0  # lines matched against the rules so far
        self._selectors: tuple[Any, ...] | None = None  # _make_selectors, after INDEX_AFTER lines
        self.plans = repeats.Memo()  # key -> Plan, or None: always fed in full (a pasted report)
        self._seen_keys: bytearray | None = None  # _again's bitmap
        self.matched: list[str] = []  # rule ids matched by the line being fed
        # rule id -> (first line, its characters, give-ups): timed out; tried no more at the cap
        self.gave_up: dict[str, tuple[int, int, int]] = {}
        self.saw_level = False
        self.last_no = 0
        self.splitter = runs.Splitter(visible)
        self.runs = runs.Runs()
        self.started_at = 0  # the line where the Splitter last began a start
        self.closed = (0, False)  # run_sig and run_visible of the start that ended there
        self.echoes: list[tuple[bool, runs.Echo]] = []  # (served, start) Engine._echo skips
        # (block, served, offset, line, recall key) of the last start's first line (served: the
        # prefilter left the served words out when it was fed; recall_key after it)
        self.echo_mark: tuple[bytes, bool, int, int, Any] | None = None
        self.seen = recall.Seen()  # starts judged before (recall.py)
        self.judged: tuple[int, Analysis, bool] | None = None  # the start new_start just judged
        self._start_run(1)

    def _start_run(self, first_line: int) -> None:
        """What belongs to one server start; the caches above serve every start."""
        self.run_first_line = first_line
        self.run_sig = 0  # a fingerprint of the start's lines, pids and times left out
        self.run_visible = False  # whether the start holds a line the streaming path sees
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

    def feed(self, line: Line) -> repeats.Plan | None:
        """Feed a parsed line; returns its plan, or None for a line of a pasted report."""
        report = self.reports.feed(line)
        if report is not None:
            self.matched.clear()
            self.last_no = line.no
            if report == "shell prompt":
                self.collector.feed(line)  # the command line still gives the arguments
            return None  # a pasted report, not an event of this run
        plan = self._classify(line)
        self._apply(line.no, line.text, plan, line.pid)
        return plan

    def _classify(self, line: Line) -> repeats.Plan:
        """What a line that is not a pasted report's says, whatever the state (see repeats.py):
        read from its message and text, never from its pid, time or number."""
        msg, text, level = line.msg, line.text, line.level
        frame = frame_of(msg)
        facts: Ops = ()
        if frame is not None:
            entry, clue = self.knowledge.frame_entry(*frame), None
        else:
            entry, facts, clue = None, extract(msg, text), verdict.read_clue(msg, self.knowledge)
        v2 = msg.startswith("Using V2 Model Runner")
        loading_4dp = None
        if not v2 and msg.startswith("Model loading took "):
            m = _LOADING_NUMBER.match(msg)
            if m:
                loading_4dp = len(m.group(1) or "") == 4
        error = level in ("ERROR", "CRITICAL")
        exc = _EXCEPTION.match(msg)
        fatal = exc is not None or _FATAL_HINT.search(msg) is not None
        matches = self._matches(line)
        return repeats.Plan(
            msg,
            line.proc,
            self.reports.state(line.no),
            level,
            frame,
            entry,
            facts,
            clue,
            v2,
            loading_4dp,
            dated=level is not None and _STAMP.search(text[:80]) is not None,
            interrupt=bool(_INTERRUPT.search(msg) or text.startswith("^C")),
            alarm=error or bool(_CUT_ALARM.match(msg)),
            exception=None if exc is None else msg[exc.end() :].strip(),
            fatal=fatal,
            notable=fatal or (error and not msg.startswith(("File ", "^", "~"))),
            matches=matches,
            wrapped=(
                verdict.wrapped_of(msg, [r for r, _ in matches]) if "Value error, " in msg else None
            ),
        )

    def _apply(self, no: int, text: str, plan: repeats.Plan, pid: int | None) -> None:
        """What a line says (its plan) done to the state so far: line `no`, cleaned text `text`,
        pid `pid` (read only where a fact needs it)."""
        self.matched.clear()  # the rules of this line only: a flood of matching lines stays bounded
        self.last_no = no
        collector = self.collector
        if plan.frame is not None:
            collector.add_frame(no, *plan.frame)
        elif plan.facts:
            collector.apply(plan.facts, no, text, plan.msg, plan.proc, pid)
        if plan.level:
            self.saw_level = True  # vLLM's 'LEVEL mm-dd hh:mm:ss [file:line]' or uvicorn's prefix
        if plan.v2:
            self.v2_banner = True
        elif plan.loading_4dp is not None:
            self.loading_4dp = plan.loading_4dp
        if self.ready_line is None and collector.facts.reached_ready:
            self.ready_line = no
        wrapper = self._clue(no, text, plan)
        if plan.dated:
            if self.first_stamp is None:
                self._stamp(text)
            else:
                self.stamp_text = text  # read only if an interrupt needs it
        clues = self.clues
        if plan.interrupt and clues.interrupt is None:
            clues.interrupt = Evidence(no, scrub_cut(text, 400))
            if self.stamp_text is not None:
                self._stamp(self.stamp_text)
            if self.first_stamp is not None and self.last_stamp is not None:
                self.interrupt_after = (self.last_stamp - self.first_stamp) % 86400
        if (
            (wrapper or plan.alarm)
            and self._armed()
            and not _request_level(plan.level, text, plan.msg)
        ):
            self.alarm_after_up = Evidence(no, scrub_cut(text, 400))
        if plan.exception is not None and not wrapper:
            clues.note_exception(no, text, plan.exception)
        if plan.fatal and self.first_fatal_line is None:
            self.first_fatal_line = no
        if plan.notable:
            ev = Evidence(no, text[: NOTABLE_CUT * 4])
            if len(self.notable_first) < 4:
                self.notable_first.append(ev)
            else:
                self.notable_last.append(ev)
        if plan.wrapped is not None:
            clues.note_wrapped(no, plan.wrapped)
        for rule, groups in plan.matches:
            if wrapper and rule.category is Category.CRASH_OTHER:
                continue  # a wrapper announces a failure; its cause is elsewhere
            hit = self.hits.get(rule.id)
            if hit is None:
                hit = self.hits[rule.id] = _Hit(
                    rule,
                    groups=dict(groups),
                    # By line number, so lines the prefilter drops make no difference.
                    context=tuple(t for n, t in self.recent if n >= no - CONTEXT_LINES),
                )
            else:
                for key, value in groups.items():
                    hit.groups.setdefault(key, value)
            self.matched.append(rule.id)
            hit.count += 1
            if len(hit.evidence) < MAX_EVIDENCE and all(e.line != no for e in hit.evidence):
                hit.evidence.append(Evidence(no, text[: EVIDENCE_CUT * 4]))
        self.recent.append((no, plan.msg))

    def _clue(self, no: int, text: str, plan: repeats.Plan) -> bool:
        """Note a line's clues (verdict.Clues); True for a wrapper or a death (never evidence of a
        cause)."""
        clues = self.clues
        if len(clues.stack) < 3:
            if plan.lent is repeats.UNREAD:
                plan.lent = verdict.lent_of(plan.msg)
            if plan.lent is not None:
                clues.stack.append((Evidence(no, scrub_cut(text, 400)), plan.lent))
        frames = self.collector.frames
        if frames and frames[-1][0] == no:  # a frame (or a part of a split line after one)
            _, fn, path = frames[-1]
            entry = (
                plan.frame_entry if plan.frame is not None else self.knowledge.frame_entry(fn, path)
            )
            if entry is not None:
                clues.frame = ((no, text[: FRAME_CUT * 4]), entry)
            return False
        clue = plan.clue
        if clue.call is not None:
            clues.frame = ((no, text[: FRAME_CUT * 4]), clue.call)
            return False
        if clue.method is not None:
            clues.methods.append((no, clue.method))
        if clue.death:
            if len(clues.deaths) < 3:
                clues.deaths.append(Evidence(no, scrub_cut(text, 400)))
            return True
        if clue.wrapper:
            clues.wrappers.append(Evidence(no, scrub_cut(text, 400)))
            if clue.raises:
                clues.raised += 1
            return True
        return False

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

    def _matches(self, line: Line) -> tuple[tuple[Rule, dict[str, Any]], ...]:
        """The rules whose patterns match this line, with their named groups."""
        return self._selected(line) if self.fast else self._attempted(line)

    def _attempted(self, line: Line) -> tuple[tuple[Rule, dict[str, Any]], ...]:
        """The reference: every rule with a keyword in the line tries its patterns in turn."""
        found: tuple[tuple[Rule, dict[str, Any]], ...] = ()
        if not self._rule_words(line.text.encode(), 0):  # one scan: most lines hold no keyword
            return found
        for rule in self.matching:
            if self._capped(rule):
                continue
            text = line.text if rule.where == "line" else line.msg
            if any(k in text for k in rule.keywords):
                m, gave_up = rule.attempt(text)
                if gave_up:
                    self._gave_up(rule, line.no, len(text))
                if m is not None:
                    found += ((rule, {k: v for k, v in m.groupdict().items() if v}),)
        return found

    def _selected(self, line: Line) -> tuple[tuple[Rule, dict[str, Any]], ...]:
        """What `_attempted` finds, trying fewer patterns: after INDEX_AFTER lines only those
        Hyperscan's scan leaves (patterns.rule_selector), on RE2's bytes (Bounded.groups) unless
        Hyperscan's match is enough."""
        found: tuple[tuple[Rule, dict[str, Any]], ...] = ()
        msg, text = line.msg, line.text
        data: dict[str, bytes] = {}  # each text in UTF-8, encoded once where needed
        if self._selectors is None:
            self._matched_lines += 1
            if self._matched_lines >= INDEX_AFTER:  # many lines: worth compiling
                self._selectors = self._make_selectors()
        if not self._selectors:  # RE2 only: one scan for all keywords, then each keyword
            data["line"] = text.encode()
            if not self._rule_words(data["line"], 0):
                return found
            hit = {i for k, rules in self._owners["message"] if k in msg for i in rules}
            if self._owners["line"]:
                hit.update(i for k, rules in self._owners["line"] if k in text for i in rules)
            chosen: Selected = [(i, self._every[i], ()) for i in sorted(hit)]
        else:
            by_msg, by_line = self._selectors
            chosen = []
            if by_msg is not None:
                data["message"] = msg.encode()
                chosen = by_msg(data["message"])
            if by_line is not None:
                data["line"] = text.encode()
                chosen = sorted([*chosen, *by_line(data["line"])])
        matching = self.matching
        for i, tried, sure in chosen:
            rule = matching[i]
            if self._capped(rule):
                continue
            if tried[0] in sure:  # Hyperscan matched the first to try, and it names no group
                found += ((rule, {}),)
                continue
            full = text if rule.where == "line" else msg
            if len(full) > MAX_TEXT:  # the patterns see its start
                cut, raw = full[:MAX_TEXT], full[:MAX_TEXT].encode()
            else:
                cut = full
                raw = data.get(rule.where) or data.setdefault(rule.where, full.encode())
            for n in tried:
                if n in sure:  # Hyperscan matched it, and it names no group
                    found += ((rule, {}),)
                    break
                groups, gave_up = rule.patterns[n].groups(cut, raw)
                if gave_up:
                    self._gave_up(rule, line.no, len(full))
                if groups is not None:
                    found += ((rule, groups),)
                    break
        return found

    def _capped(self, rule: Rule) -> bool:
        """Whether a rule timed out MAX_GIVE_UPS times in this log: it is tried no more."""
        known = self.gave_up.get(rule.id)
        return known is not None and known[2] >= MAX_GIVE_UPS

    def _gave_up(self, rule: Rule, no: int, chars: int) -> None:
        first, length, times = self.gave_up.get(rule.id) or (no, chars, 0)
        self.gave_up[rule.id] = (first, length, times + 1)

    def _make_selectors(self) -> tuple[Any, ...]:
        """The Hyperscan selectors of the message rules and the line rules (None: there are
        none), or () where Hyperscan is missing."""
        out: list[Callable[[bytes], Selected] | None] = []
        for where in ("message", "line"):
            if not any(r.where == where for r in self.matching):
                out.append(None)
                continue
            select = rule_selector(
                [(r.keywords, r.patterns) if r.where == where else ((), ()) for r in self.matching]
            )
            if select is None:
                return ()
            out.append(select)
        return tuple(out)

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
        key, known, start, end, pid, timed = repeats.split(raw)
        # The same fingerprint on both paths: identical starts are merged alike (runs.Runs.repeat).
        self.run_sig = hash(
            (self.run_sig, key if key is not None else raw, no - self.run_first_line)
        )
        plan = self.plans.get(known, _UNSEEN) if self.replay and known is not None else None
        if plan is _WHOLE:  # its record is not read as one: its plan is the whole line's
            known, start, end = key, 0, 0
            plan = self.plans.get(key, _UNSEEN)
        if isinstance(plan, repeats.Plan) and plan.reports == self.reports.state(no):
            text = raw[plan.start :].rstrip() if plan.tail is None else raw[start:end] + plan.tail
            if plan.pid_in_head and pid is not None:
                self._apply(no, text, plan, int(pid))
            else:
                self._apply(no, text, plan, plan.pid)
            return
        line = parse(no, raw)
        made = self.feed(line)
        if plan is _UNSEEN and not self._again(known):
            return  # a line seen once is not kept: most never come again
        if plan is not None and known is not None:  # a new key, or a plan read in another state
            if known is not key and not _recorded(line):
                self.plans.remember(known, 2 * len(raw), _WHOLE)
                known, start, end = key, 0, 0
            made = _replayable(made, line, raw, start, end, known is key and end > 0, timed)
            self.plans.remember(known, 2 * len(raw), made)

    def _again(self, key: Any) -> bool:
        """Whether a key was seen before (as far as a bitmap of their hashes tells: a collision
        only keeps a plan one line early)."""
        if self._seen_keys is None:
            self._seen_keys = bytearray(SEEN_BITS >> 3)
        h = hash(key) & (SEEN_BITS - 1)
        bit = 1 << (h & 7)
        if self._seen_keys[h >> 3] & bit:
            return True
        self._seen_keys[h >> 3] |= bit
        return False

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
        self.judged = None
        if self.run_visible:
            last = no - 1
            if not self.runs.repeat(self.run_sig, last):
                run = self._finish_run("", last)
                decides = verdict.decides(run, self._ended())
                self.runs.add(self.run_first_line, last, run, decides, self.run_sig)
                self.judged = (self.run_first_line, run, decides)
        self.closed = (self.run_sig, self.run_visible)
        self._start_run(no)

    def recall_key(self, served: bool) -> Any:
        """What a start finds that its analysis depends on beside its bytes (recall.py), after
        its first line; None where the file so far makes starts never recalled."""
        if not self.saw_level or self.gave_up:
            return None
        return served, self.splitter.snapshot()

    def learn(self, window: bytes, mark: tuple[bytes, bool, int, int, Any], ref: runs.Echo) -> None:
        """The start that just ended (its `window` and `mark`, runs.Echo `ref`): remembered, or
        learned from, when it was judged in full (recall.Seen)."""
        judged = self.judged
        if judged is None or judged[0] != mark[3] or mark[4] is None or self.gave_up:
            return
        self.seen.learn(
            recall.Entry(
                window,
                key=mark[4],
                lines=ref.lines,
                last_at=ref.last_at,
                splitter=ref.splitter,
                sig=ref.sig,
                visible=ref.visible,
                base=judged[0],
                analysis=judged[1],
                decides=judged[2],
            )
        )

    def recall_start(self, no: int, seen: recall.Entry, learned: recall.Learned) -> None:
        """The lines up to `no` repeat a start judged before (recall.py): what feeding them would
        leave. Line `no` begins a start (it is fed next)."""
        if seen.visible:
            last = no - 1
            if not self.runs.repeat(seen.sig, last):
                run = recall.Recalled(learned, self.run_first_line - seen.base)
                self.runs.add(self.run_first_line, last, run, seen.decides, seen.sig)
        self.judged = None
        self.closed = (seen.sig, seen.visible)
        self._start_run(no)
        self.splitter.restore(seen.splitter, _SAME)
        self.started_at = no

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


def _request_level(level: str | None, text: str, msg: str) -> bool:
    """An ERROR about one request (a 4xx, a bad prompt) is the server working, not dying."""
    if level != "ERROR":
        return False
    return bool(_REQUEST_FILE.search(text[:200])) and "dead" not in msg


def _recorded(line: Line) -> bool:
    """Whether a line whose record (level and time, no process prefix) repeats.split found was
    read as one: its message then holds no time."""
    return line.level is not None and line.proc is None


def _replayable(
    plan: repeats.Plan | None,
    line: Line,
    raw: str,
    start: int,
    end: int,
    prefix: bool,
    timed: bool,
) -> repeats.Plan | None:
    """The plan of `line` with what a repeat needs to rebuild its text and pid, or None where a
    repeat's plan could differ or its text cannot be rebuilt. `raw`: the raw line, whose
    raw[start:end] its plan's key leaves out (repeats.split): a process `prefix`, with a time or
    not (`timed`), or a record's level and time (read as one: _recorded)."""
    if plan is None:
        return None
    if prefix and (line.proc is None or (timed and line.level is None)):
        return None  # the prefix not read as one: the message holds its pid or time
    if line.text == raw[start:].rstrip():
        plan.start = start
    elif line.text.startswith(raw[start:end]):  # collector prefixes or ANSI codes cleaned away
        plan.tail = line.text[end - start :]
    else:
        return None
    plan.pid_in_head = end > 0 and line.pid is not None
    plan.pid = line.pid
    return plan


class _Same(dict[str, str]):
    """The identity renaming (a recalled start's pids are its first sighting's)."""

    def __missing__(self, pid: str) -> str:
        return pid


_SAME = _Same()
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
