"""Render `analyze` results: text, json, jsonl, markdown and html, one registry entry per format.

`RENDERERS` maps each format of `output.formats.FORMATS["analyze"]` to a `Format`: what to print
for each log as it is analysed (an `ItemRenderer`), and what to print once at the end (an
`EndRenderer`). tests/cli/test_formats.py keeps the registry and the declared formats equal.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from vllm_offload_doctor.analyze.model import Analysis, Category, Evidence, RankOffload
from vllm_offload_doctor.analyze.normalize import parse
from vllm_offload_doctor.output.color import paint
from vllm_offload_doctor.output.formats import ELLIPSIS, SCHEMA_VERSION, OutputFormat, shorten
from vllm_offload_doctor.redact import Places, redact, scrub_data, scrub_text

EVIDENCE_WIDTH = 300  # characters of a log line shown as evidence
SUMMARY_WIDTH = 100  # characters of a summary in the triage table
WIDTH = 80  # text output wraps here, at word boundaries, with a hanging indent
FILE_WIDTH = 32  # the triage table's file column; a longer name loses its middle, not its start
# The generic "engine died" rule: beside a root cause that matched, its title contradicts it.
GENERIC_CRASH = "CRASH001"


def _scrub(value: Any, *, places: Places | None) -> Any:
    """Mask secrets everywhere in a record (see redact.scrub_data); then, with --redact, the
    hosts, addresses and user names, with one placeholder per value across the report."""
    value = scrub_data(value)
    if places is None:
        return value
    for text in _strings(value):
        places.learn(text)  # a host named late in the record is hidden in its early fields too
    return _hide_places(value, places)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def _hide_places(value: Any, places: Places) -> Any:
    if isinstance(value, Enum):
        return value  # a fixed vocabulary (categories, statuses)
    if isinstance(value, str):
        return places.hide(value)
    if isinstance(value, dict):
        return {k: _hide_places(v, places) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_hide_places(v, places) for v in value]
    return value


class Renderer:
    def __init__(
        self,
        *,
        color: bool = False,
        redact_secrets: bool = True,
        hosts: bool = False,
        home: bool = False,
    ):
        self.color = color
        self.secrets = redact_secrets
        self.hosts = hosts
        self.home = home
        # One set of placeholders per report: the same host is `<host-1>` in every section.
        self.places = Places() if hosts or home else None
        self._learned: set[int] = set()
        # Records a batch worker already scrubbed (analyze/batch.py), by analysis.
        self._records: dict[int, tuple[Analysis, dict[str, Any]]] = {}

    def remember(self, analysis: Analysis, record: dict[str, Any]) -> None:
        self._records[id(analysis)] = (analysis, record)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_records"} | {"_records": {}}

    def _r(self, text: str) -> str:
        if not self.secrets:
            return text
        return redact(text, hosts=self.hosts, home=self.home, places=self.places)

    def learn(self, analyses: Iterable[Analysis]) -> None:
        """Note every host and user an analysis names before any of it is printed."""
        if self.places is None or not self.secrets:
            return
        for a in analyses:
            if id(a) not in self._learned:
                self._learned.add(id(a))
                for text in _strings(scrub_data(a.to_dict())):
                    self.places.learn(text)

    def record(self, analysis: Analysis) -> dict[str, Any]:
        done = self._records.get(id(analysis))
        if done is not None and done[0] is analysis:
            return done[1]
        data = analysis.to_dict()
        if not self.secrets:
            return data
        self.learn([analysis])
        scrubbed: dict[str, Any] = _scrub(data, places=self.places)
        return scrubbed

    # -- json ---------------------------------------------------------------------------------
    def json(self, analyses: Sequence[Analysis], errors: Sequence[str]) -> str:
        payload = {
            "schema_version": SCHEMA_VERSION,
            "results": [self.record(a) for a in analyses],
            "errors": [self._r(e) for e in errors],
            "counts": dict(Counter(a.verdict.category.value for a in analyses)),
        }
        return json.dumps(payload, ensure_ascii=False, indent=2)

    def json_stream(self) -> JsonStream:
        return JsonStream(self)

    def jsonl_line(self, analysis: Analysis) -> str:
        return json.dumps(self.record(analysis), ensure_ascii=False)

    # -- text -----------------------------------------------------------------------------------
    def _style(self, text: str, *styles: str) -> str:
        return paint(text, *styles, color=self.color)

    def text(self, a: Analysis) -> str:
        self.learn([a])
        v = a.verdict
        colour = (
            "green"
            if v.category is Category.HEALTHY
            else "yellow"
            if v.category is Category.UNKNOWN
            else "red"
        )
        head = f"{v.category.value} — {v.title}" + (f" [{v.rule_id}]" if v.rule_id else "")
        verdict = _wrap("  verdict:  ", head)
        styled = self._style(v.category.value, colour, "bold")
        verdict[0] = verdict[0].replace(v.category.value, styled, 1)
        out = [self._style(self._r(a.file), "bold"), *verdict]
        out += _wrap("  ", self._r(v.summary))
        o = a.offload
        req = (
            f"{o.requested_gib:g} GiB requested"
            if o.requested_gib is not None
            else "no request seen"
        )
        got = f", {o.offloaded_gib:.2f} GiB offloaded" if o.offloaded_gib else ""
        out += _wrap("  offload:  ", f"{o.status.value} ({req}{got}) — {self._r(o.explanation)}")
        f = a.facts
        bits = [
            f"vLLM {f.vllm_version or 'version not in the log'}",
            f"runner {f.model_runner}",
            f"model loading {f.model_loading_gib:g} GiB"
            if f.model_loading_gib is not None
            else None,
            f"KV cache {f.kv_cache_gib:g} GiB" if f.kv_cache_gib is not None else None,
            f"{f.kv_cache_tokens:,} KV tokens" if f.kv_cache_tokens else None,
            "reached ready" if f.reached_ready else "never ready",
        ]
        out += _wrap("  facts:    ", ", ".join(b for b in bits if b))
        starts = run_lines(a)
        if starts:
            out += _wrap(
                "  starts:   ", f"{sum(r.starts for r in a.runs)} server starts in this log"
            )
            for line in starts:
                out += _wrap("    ", self._r(line), "      ")
        if len(f.ranks) > 1:
            for rank in f.ranks.values():
                out += _wrap("    ", _rank_line(rank).strip(), "      ")
        if a.findings:
            top = a.findings[0]
            out.append("  evidence:")
            out += self._evidence_lines(top.evidence)
            if v.remedy:
                out += _wrap("  remedy:   ", self._r(v.remedy))
            out.extend(f"  link:     {link}" for link in v.links)
            for other in a.findings[1:]:
                if other.rule_id == GENERIC_CRASH and top.rule_id != GENERIC_CRASH:
                    continue
                also = f"[{other.rule_id}] {other.title} ({other.category.value})"
                out += _wrap("  also:     ", also)
        elif a.notable:
            out.append("  most relevant lines:")
            out += self._evidence_lines(a.notable)
            out += _wrap("  next step: ", v.remedy)
        if a.error:
            out += _wrap("  note:     ", self._r(a.error))
        for n in a.notes:
            out += _wrap("  note:     ", self._r(n))
        return self._final(out)

    def _evidence_lines(self, evidence: Sequence[Evidence]) -> list[str]:
        """Each evidence line once (the same message from two processes is one line), wrapped."""
        out: list[str] = []
        seen: set[str] = set()
        for e in evidence:
            # Evidence text is capped with its prefix, so two copies may end apart: compare starts.
            key = parse(e.line, e.text).msg[:200]
            if key in seen:
                continue
            seen.add(key)
            out += _wrap(f"    {e.line:>6}: ", self._evidence(e.text))
        return out

    def _final(self, lines: list[str]) -> str:
        # Evidence lines are consecutive: a PEM block may begin in one and end lines later.
        text = "\n".join(lines)
        return scrub_text(text) if self.secrets else text

    def _evidence(self, text: str) -> str:
        return shorten(self._r(text), EVIDENCE_WIDTH)

    # -- markdown ------------------------------------------------------------------------------
    def markdown(self, a: Analysis) -> str:
        self.learn([a])
        v, o = a.verdict, a.offload
        out = [
            f"### `{self._r(a.file)}`: **{v.category.value}** — {v.title}",
            "",
            self._r(v.summary),
            "",
            f"**Offload:** `{o.status.value}`"
            + (f", requested {o.requested_gib:g} GiB" if o.requested_gib is not None else "")
            + (f", offloaded {o.offloaded_gib:.2f} GiB" if o.offloaded_gib else "")
            + f". {self._r(o.explanation)}",
            "",
        ]
        evidence = a.findings[0].evidence if a.findings else a.notable
        if evidence:
            out += ["Evidence:", "", "```text"]
            out += [f"{e.line}: {self._r(e.text)}" for e in evidence]
            out += ["```", ""]
        if v.remedy:
            out += [f"**What to do:** {self._r(v.remedy)}", ""]
        if v.links:
            out += ["Links: " + ", ".join(f"<{link}>" for link in v.links), ""]
        f = a.facts
        out.append(
            f"<sub>vLLM {f.vllm_version or 'unknown'} · runner {f.model_runner} · "
            f"rule {v.rule_id or 'none'} · offload-doctor</sub>"
        )
        starts = run_lines(a)
        if starts:
            out += [f"**{sum(r.starts for r in a.runs)} server starts in this log:**", ""]
            out += [f"- {self._r(line)}" for line in starts]
            out.append("")
        if a.error:
            out.append(f"\n> Note: {self._r(a.error)}")
        out.extend(f"\n> Note: {self._r(n)}" for n in a.notes)
        return self._final(out)

    # -- batch summary -------------------------------------------------------------------------
    def triage_table(
        self, analyses: Sequence[Analysis], errors: Sequence[str], *, markdown: bool
    ) -> str:
        self.learn(analyses)
        rows = [
            (
                self._r(a.file),
                a.verdict.category.value,
                a.offload.status.value,
                shorten(self._r(a.verdict.summary), SUMMARY_WIDTH),
            )
            for a in analyses
        ]
        counts = Counter(a.verdict.category.value for a in analyses)
        if markdown:
            out = ["| file | category | offload | summary |", "|---|---|---|---|"]
            out += [f"| `{r[0]}` | {r[1]} | {r[2]} | {r[3].replace('|', '/')} |" for r in rows]
            out += ["", "| category | logs |", "|---|---|"]
            out += [f"| {c} | {n} |" for c, n in counts.most_common()]
            out += [f"\n{len(errors)} input(s) could not be read." if errors else ""]
            return "\n".join(out).rstrip()
        names = [_middle(r[0], FILE_WIDTH) for r in rows]
        width = max(4, *(len(n) for n in names)) if names else 4
        cat_w = max(8, *(len(r[1]) for r in rows)) if rows else 8
        off_w = max(7, *(len(r[2]) for r in rows)) if rows else 7
        room = max(WIDTH - width - cat_w - off_w - 6, 40)
        out = [f"{'file':<{width}}  {'category':<{cat_w}}  {'offload':<{off_w}}  summary"]
        out += [
            f"{n:<{width}}  {r[1]:<{cat_w}}  {r[2]:<{off_w}}  {shorten(r[3], room)}"
            for n, r in zip(names, rows, strict=True)
        ]
        out.append("")
        out.append("counts: " + ", ".join(f"{c} {n}" for c, n in counts.most_common()))
        if errors:
            out.append(f"{len(errors)} input(s) could not be read")
        return "\n".join(out)


def run_lines(a: Analysis) -> list[str]:
    """Earlier failed starts a line each, then the last; a crash loop's identical starts are one.

    Empty for a log of one start (nothing to add to its verdict).
    """
    if len(a.runs) < 2 and not (a.runs and a.runs[0].starts > 1):
        return []
    out = []
    for r in a.runs:
        v, last = r.verdict, r is a.runs[-1]
        if v.category is Category.HEALTHY and not last:
            continue  # a start that came up and was stopped: nothing to triage
        same = f"; the same failure, {r.starts} times" if r.starts > 1 else ""
        out.append(
            f"{'last' if last else 'earlier'}: lines {r.first_line}-{r.last_line}: "
            f"{v.category.value} — {v.title}" + (f" [{v.rule_id}]" if v.rule_id else "") + same
        )
    return out


def _wrap(prefix: str, text: str, indent: str | None = None) -> list[str]:
    """`prefix` then `text`, wrapped at WIDTH on word boundaries, later lines under the text."""
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=prefix,
        subsequent_indent=" " * len(prefix) if indent is None else indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [prefix.rstrip()]


def _middle(name: str, width: int) -> str:
    """A name cut to `width` in the middle: its start and its file name stay readable."""
    if len(name) <= width:
        return name
    tail = (width - len(ELLIPSIS)) // 2
    return name[: width - len(ELLIPSIS) - tail] + ELLIPSIS + name[-tail:]


def _rank_line(rank: RankOffload) -> str:
    def show(value: float | None) -> str:
        return "-" if value is None else f"{value:g}"

    return (
        f"    rank {rank.process}: offloader {rank.offloader or '-'}, offloaded "
        f"{show(rank.offloaded_gib)} GiB, model loading {show(rank.model_loading_gib)} GiB"
    )


class JsonStream:
    """`Renderer.json`'s document, byte for byte, written a result at a time: a batch of
    thousands of logs is never held in memory to be printed at the end."""

    def __init__(self, renderer: Renderer) -> None:
        self.r = renderer
        self.n = 0
        self.counts: dict[str, int] = {}

    def head(self) -> str:
        return '{\n  "schema_version": ' + json.dumps(SCHEMA_VERSION) + ',\n  "results": ['

    def item(self, analysis: Analysis, record: dict[str, Any] | None = None) -> str:
        category = analysis.verdict.category.value
        self.counts[category] = self.counts.get(category, 0) + 1
        body = json.dumps(
            self.r.record(analysis) if record is None else record, ensure_ascii=False, indent=2
        )
        self.n += 1
        return ("\n" if self.n == 1 else ",\n") + "    " + body.replace("\n", "\n    ")

    def tail(self, errors: Sequence[str]) -> str:
        def nested(value: Any) -> str:
            return json.dumps(value, ensure_ascii=False, indent=2).replace("\n", "\n  ")

        close = "\n  ]" if self.n else "]"
        return (
            f'{close},\n  "errors": {nested([self.r._r(e) for e in errors])},\n'
            f'  "counts": {nested(self.counts)}\n}}'
        )


class ItemRenderer(Protocol):
    """What a format prints for one log as soon as it is analysed (`several`: one of many)."""

    def __call__(self, r: Renderer, analysis: Analysis, several: bool, /) -> str: ...


class EndRenderer(Protocol):
    """What a format prints once every log is analysed, with the inputs that could not be read."""

    def __call__(
        self, r: Renderer, analyses: Sequence[Analysis], errors: Sequence[str], several: bool, /
    ) -> str: ...


@dataclass(frozen=True, slots=True)
class Format:
    """One output format: text per log as it is analysed, and text once at the end."""

    item: ItemRenderer | None = None
    end: EndRenderer | None = None


def _text_item(r: Renderer, a: Analysis, several: bool) -> str:
    return r.text(a) + ("\n" if several else "")


def _markdown_item(r: Renderer, a: Analysis, several: bool) -> str:
    return r.markdown(a) + "\n"


def _table(markdown: bool) -> EndRenderer:
    def end(r: Renderer, analyses: Sequence[Analysis], errors: Sequence[str], several: bool) -> str:
        return r.triage_table(analyses, errors, markdown=markdown) if several else ""

    return end


RENDERERS: dict[OutputFormat, Format] = {
    OutputFormat.TEXT: Format(item=_text_item, end=_table(markdown=False)),
    OutputFormat.JSON: Format(end=lambda r, analyses, errors, _several: r.json(analyses, errors)),
    OutputFormat.JSONL: Format(item=lambda r, a, _several: r.jsonl_line(a)),
    OutputFormat.MARKDOWN: Format(item=_markdown_item, end=_table(markdown=True)),
    OutputFormat.HTML: Format(end=lambda r, analyses, errors, _several: _html(r, analyses, errors)),
}


def _html(r: Renderer, analyses: Sequence[Analysis], errors: Sequence[str]) -> str:
    from vllm_offload_doctor.analyze.html import render_triage_html

    r.learn(analyses)
    return render_triage_html(analyses, errors, r)
