"""`offload-doctor analyze` and `offload-doctor rules`."""

from __future__ import annotations

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
    "analyze", "markdown is a reply to paste into an issue; several inputs end with a triage table."
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
    "rules",
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
    from vllm_offload_doctor.analyze.rules_render import RENDERERS

    loaded = load_rules(rule_dirs)
    chosen = rule_view.select(loaded, rule_ids) if rule_ids else None
    out = Output(fmt, output, quiet=quiet)
    out.report(lambda f, _color: RENDERERS[f](loaded, chosen, verbose=verbose), nl=False)
    out.close()
    return exitcodes.OK
