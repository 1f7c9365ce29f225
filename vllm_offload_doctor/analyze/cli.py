"""`offload-doctor analyze` and `offload-doctor rules`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from vllm_offload_doctor import exitcodes
from vllm_offload_doctor.common_cli import (
    F,
    Output,
    color_option,
    complete_path,
    format_option,
    output_option,
    quiet_option,
    verbose_option,
)
from vllm_offload_doctor.output.formats import OutputFormat

if TYPE_CHECKING:
    from collections.abc import Callable

    from vllm_offload_doctor.analyze import rule_view
    from vllm_offload_doctor.analyze.rules import Rule

# analyze's --format choices: the keys of render.RENDERERS (a test keeps the two equal), listed
# here so that `offload-doctor --help` does not import the renderer.
FORMATS = (
    OutputFormat.TEXT,
    OutputFormat.JSON,
    OutputFormat.JSONL,
    OutputFormat.MARKDOWN,
    OutputFormat.HTML,
)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _byte_size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """A size such as 500M, 2G, 2GiB or 1048576 (powers of 1024); 0 means no limit."""
    if value is None:
        return None
    text = value.strip().upper().removesuffix("B").removesuffix("I")
    number = text.rstrip("KMGT")
    try:
        size = float(number) * _UNITS[text[len(number) :]]
    except (ValueError, KeyError):
        raise click.BadParameter(f"{value!r} is not a size like 500M, 2G or 1048576") from None
    if not size >= 0:
        raise click.BadParameter(f"{value!r}: a size cannot be negative")
    return int(size)


def rule_dirs_option(help_text: str) -> Callable[[F], F]:
    """`--rules DIR`, repeatable: analyze and rules read the same extra rule folders."""
    return click.option(
        "--rules",
        "rule_dirs",
        multiple=True,
        type=click.Path(file_okay=False, path_type=Path),
        help=help_text,
    )


@click.command("analyze", short_help="Name the root cause in vLLM server logs.")
@click.argument("paths", nargs=-1, required=True, shell_complete=complete_path)
@format_option(
    FORMATS, "markdown is a reply to paste into an issue; several inputs end with a triage table."
)
@rule_dirs_option("Directory of extra rule files (TOML); may be repeated.")
@click.option(
    "--redact",
    is_flag=True,
    help="Also replace IP addresses, host names, e-mail addresses and the user names in home "
    "paths by placeholders, one per value across the report (secrets are always hidden).",
)
@color_option()
@click.option(
    "--max-bytes",
    metavar="SIZE",
    callback=_byte_size,
    help="Read at most SIZE of stdin and decompress at most SIZE of each compressed log "
    "(default 1G, and stop early on a ratio over 200:1, the mark of a decompression bomb); "
    "0: no limit.",
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    metavar="N",
    help="Analyse N logs at a time, one process each (default: one per core; 1: in this process). "
    "Results keep the order of the inputs.",
)
@output_option()
@quiet_option()
@verbose_option("Name each log on stderr as it is read (which files a folder gave).")
def analyze(
    paths: tuple[str, ...],
    fmt: OutputFormat,
    rule_dirs: tuple[Path, ...],
    redact: bool,
    color: bool | None,
    max_bytes: int | None,
    jobs: int | None,
    output: Path | None,
    quiet: bool,
    verbose: bool,
) -> int:
    """Name the root cause in vLLM server logs.

    PATHS are log files (plain, or compressed with gzip, bzip2 or xz; zstd on Python 3.14+),
    directories (every *.log, *.txt, *.out, *.err, *.gz, *.bz2 and *.xz under them; *.zst too on
    Python 3.14+) or - for stdin.

    Exit status: 0 nothing wrong found, 1 a failure diagnosed, 2 an input could not be read
    (the others are still analysed), 3 a bug of offload-doctor, 130 interrupted.

    \b
    Examples:
      offload-doctor analyze server.log                  # name the root cause
      vllm serve M 2>&1 | offload-doctor analyze -       # read a log as it is written
      offload-doctor analyze logs/ --format markdown     # triage a folder, paste the table
      offload-doctor analyze server.log.gz --redact      # hide host and user names too
    """
    from vllm_offload_doctor.analyze import batch, logread
    from vllm_offload_doctor.analyze.engine import Engine
    from vllm_offload_doctor.analyze.render import RENDERERS, Renderer
    from vllm_offload_doctor.redact import scrub_text

    if "-" in paths and sys.stdin.isatty() and not quiet:
        # Without this a terminal user sees nothing and may think the doctor hangs.
        click.echo(
            "offload-doctor: reading a log from the terminal: paste it, then Ctrl+D "
            "(or pipe one in: `vllm serve ... 2>&1 | offload-doctor analyze -`)",
            err=True,
        )
    engine = Engine(extra_rule_dirs=rule_dirs, max_bytes=max_bytes)
    sources, errors = logread.resolve_inputs(list(paths))
    out = Output(fmt, output, quiet=quiet, color=color)
    # Each target renders its own format: the chosen one (FILE, or stdout without -o), and the
    # text view on stdout beside -o. Only stdout is ever coloured.
    targets = [
        (
            RENDERERS[fmt],
            Renderer(color=out.color and not out.path, hosts=redact, home=redact),
            out.save,
        )
    ]
    screen = out.screen_format
    if out.path is not None and screen is not None:
        targets.append(
            (RENDERERS[screen], Renderer(color=out.color, hosts=redact, home=redact), out.show)
        )
    # An error names the input as given: a path or URL may carry a token (or, with --redact,
    # a host or a user's home).
    hide = targets[0][1]._r if redact else scrub_text
    errors = [hide(msg) for msg in errors]
    analyses = []
    for msg in errors:
        click.echo(f"offload-doctor: error: {msg}", err=True)
    several = len(sources) > 1
    # The chosen format is rendered where the log is analysed (a batch worker); the text view
    # beside -o here. --redact numbers hosts and users across the whole report: one process.
    (_, first, save), *others = targets
    job = batch.Job(tuple(rule_dirs), max_bytes, fmt, first, several)
    workers = 1 if redact else batch.workers_for(jobs, sources)
    # JSON alone is written a result at a time and nothing is kept; --redact learns every place
    # first and a text view beside -o ends with a table, so those keep the analyses.
    stream = first.json_stream() if fmt is OutputFormat.JSON and not redact and not others else None
    if stream is not None:
        save(stream.head(), nl=False)
    failed = False
    for done in batch.analyze_all(engine, job, sources, workers):
        if verbose and not quiet:
            click.echo(f"offload-doctor: reading {hide(done.source.name)}", err=True)
        if done.analysis is None:
            errors.append(hide(done.error or "unreadable"))
            click.echo(f"offload-doctor: error: {errors[-1]}", err=True)
            continue
        failed = failed or done.analysis.failed
        if stream is not None:
            save(stream.item(done.analysis, done.record), nl=False)
            continue
        analyses.append(done.analysis)
        if done.record is not None:
            first.remember(done.analysis, done.record)
        if done.item is not None:
            save(done.item)
        for form, renderer, emit in others:
            if form.item is not None:
                emit(form.item(renderer, done.analysis, several))
    if stream is not None:
        save(stream.tail(errors))
    else:
        for form, renderer, emit in targets:
            tail = form.end(renderer, analyses, errors, several) if form.end is not None else ""
            if tail:
                emit(tail)
    out.close()
    if errors:
        return exitcodes.USAGE
    return exitcodes.FOUND if failed else exitcodes.OK


@click.command("rules", short_help="List the log rules, or explain some.")
@click.argument("rule_ids", metavar="[ID]...", nargs=-1)
@rule_dirs_option(
    "Directory of extra rule files (TOML) to list with the built-in ones; may be repeated."
)
@format_option(
    (OutputFormat.TEXT, OutputFormat.JSON, OutputFormat.MARKDOWN),
    "markdown: the rule table as the README shows it, or each rule explained.",
)
@output_option()
@quiet_option()
@verbose_option(
    "The rule author's view: patterns, conditions, template and every catalogued message."
)
def rules(
    rule_ids: tuple[str, ...],
    rule_dirs: tuple[Path, ...],
    fmt: OutputFormat,
    output: Path | None,
    quiet: bool,
    verbose: bool,
) -> int:
    """List the rules, or explain the ones named by id, name or id prefix (OOM: every OOM rule).

    \b
    Examples:
      offload-doctor rules                    # one line per rule
      offload-doctor rules OFF001             # what it means, what to do
      offload-doctor rules OOM                # every OOM rule
      offload-doctor rules OFF001 OOM003 -v   # the rule author's view
      offload-doctor rules --format markdown  # the README's rule table
    """
    from vllm_offload_doctor.analyze import rule_view
    from vllm_offload_doctor.analyze.rules import load_rules

    loaded = load_rules(rule_dirs)
    chosen = rule_view.select(loaded, rule_ids) if rule_ids else None
    out = Output(fmt, output, quiet=quiet)
    out.report(lambda f, _color: _rules_doc(loaded, chosen, f, verbose), nl=False)
    out.close()
    return exitcodes.OK


def _rules_doc(
    loaded: list[Rule], chosen: list[Rule] | None, fmt: OutputFormat, verbose: bool
) -> str:
    """The rule list (`chosen` None) or the chosen rules explained, in `fmt`, ending in a newline."""
    from vllm_offload_doctor.analyze import rule_view

    if chosen is None:
        if fmt is OutputFormat.JSON:
            cat = _catalogue()
            listed = [_rule_dict(r) | _sources(r, None, cat) for r in loaded]
            return json.dumps(listed, indent=2, ensure_ascii=False) + "\n"
        if fmt is OutputFormat.MARKDOWN:
            return rule_view.markdown_table(loaded)
        return _rule_table(loaded) + "\n"
    cat = _catalogue()
    if fmt is OutputFormat.JSON:
        docs = [_rule_dict(r) | _sources(r, None, cat) for r in chosen]
        return json.dumps(docs[0] if len(docs) == 1 else docs, indent=2, ensure_ascii=False) + "\n"
    parts = []
    for r in chosen:
        if fmt is OutputFormat.MARKDOWN:
            parts.append(rule_view.markdown_rule(r, _user_sources(r, cat)))
        elif verbose:
            parts.append(_author_view(r, cat))
        else:
            parts.append(rule_view.user_text(r, _user_sources(r, cat)))
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"


def _author_view(r: Rule, cat: object) -> str:
    lines = [
        f"{r.id} ({r.name}): {r.title}",
        f"  category:   {r.category.value}    severity: {r.severity.value}    precedence: {r.precedence}",
        f"  message:    {r.message}",
        f"  remedy:     {r.remedy}",
    ]
    lines += [f"  pattern:    {p.pattern}" for p in r.patterns]
    for kind, conds in (("all", r.all), ("any", r.any), ("absent", r.absent)):
        if conds:
            lines.append(f"  when {kind}: " + "; ".join(c.text for c in conds))
    lines += [f"  link:       {link}" for link in r.links]
    lines.append(f"  file:       {r.source}")
    _sources(r, lines, cat)
    return "\n".join(lines)


def _user_sources(r: Rule, cat: object, limit: int = 6) -> list[rule_view.Source]:
    """The vLLM messages behind a rule: those it cites, else those its patterns match."""
    from vllm_offload_doctor.analyze import catalogue, rule_view

    if not isinstance(cat, catalogue.Catalogue):
        return []
    found = [m for c in catalogue.cited(r, cat) for m, _ in c.found]
    if not found:
        found = [m for m, _ in catalogue.cite(r, cat).messages]
    return [
        rule_view.Source(m.kind, m.type, m.template, m.where(), m.span()) for m in found[:limit]
    ]


def _catalogue() -> object:
    """The catalogue, or the error that names why it cannot be read."""
    from vllm_offload_doctor.analyze import catalogue

    try:
        return catalogue.load()
    except catalogue.CatalogueError as exc:
        return exc


def _sources(r: object, lines: list[str] | None, cat: object = None) -> dict[str, object]:
    """The catalogued vLLM messages a rule matches: appended to `lines`, or as a JSON entry."""
    from vllm_offload_doctor.analyze import catalogue
    from vllm_offload_doctor.analyze.rules import Rule

    assert isinstance(r, Rule)
    cat = _catalogue() if cat is None else cat
    if not isinstance(cat, catalogue.Catalogue):
        if lines is not None:
            lines.append(f"  vLLM source: unavailable ({cat})")
        return {"vllm_source": None}
    cited = catalogue.cite(r, cat)
    if lines is not None:
        lines += catalogue.text_lines(r, cited, cat)
    return {"vllm_source": catalogue.as_dict(r, cited, cat)}


def _rule_table(loaded: list[Rule]) -> str:
    """One line per rule, highest precedence first, every column as wide as its longest cell."""
    rows = [
        (r.id, r.category.value, r.severity.value, r.title)
        for r in sorted(loaded, key=lambda r: (-r.precedence, r.id))
    ]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)) + "  " + row[3]
        for row in rows
    )


def _rule_dict(r: object) -> dict[str, object]:
    from vllm_offload_doctor.analyze.rules import Rule

    assert isinstance(r, Rule)
    return {
        "id": r.id,
        "name": r.name,
        "title": r.title,
        "category": r.category.value,
        "severity": r.severity.value,
        "precedence": r.precedence,
        "patterns": [p.pattern for p in r.patterns],
        "when": {k: [c.text for c in getattr(r, k)] for k in ("all", "any", "absent")},
        "message": r.message,
        "remedy": r.remedy,
        "links": list(r.links),
    }
