"""Options every command shares, so that they read and behave the same: --format and --color."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click
import click.shell_completion

from vllm_offload_doctor.color import use_color
from vllm_offload_doctor.formats import OutputFormat, ordered

F = TypeVar("F", bound=Callable[..., Any])


def format_option(formats: Iterable[OutputFormat], help_text: str = "") -> Callable[[F], F]:
    """`--format`, its choices the keys of the command's renderer registry; passes an OutputFormat."""
    choices = [f.value for f in ordered(formats)]
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(choices),
        default=OutputFormat.TEXT.value,
        show_default=True,
        callback=lambda _ctx, _param, value: OutputFormat(value),
        help=help_text or "Output format.",
    )


def color_option() -> Callable[[F], F]:
    """`--color/--no-color`: passes True, False, or None (decide from the environment)."""
    return click.option(
        "--color/--no-color",
        "color",
        default=None,
        help="Colour the text output (default: on a terminal, unless NO_COLOR or TERM=dumb; "
        "FORCE_COLOR forces it).",
    )


def complete_path(
    _ctx: click.Context, _param: click.Parameter, incomplete: str
) -> list[click.shell_completion.CompletionItem]:
    """Let the shell complete file and directory names (click asks it to, by type "file")."""
    return [click.shell_completion.CompletionItem(incomplete, type="file")]


def resolve_color(flag: bool | None) -> bool:
    """The colour decision for this run's stdout."""
    return use_color(flag, os.environ, sys.stdout)
