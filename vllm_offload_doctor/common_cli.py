"""Options every command shares, so that they read and behave the same.

--format, --color, -q/--quiet, -v/--verbose and -o/--output are defined here once; `Output` sends
a command's report where they say: the chosen format to stdout, or with -o to FILE (written
atomically) while stdout keeps the text view for a person (nothing with -q).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import click.shell_completion

from vllm_offload_doctor.errors import OutputError
from vllm_offload_doctor.output.color import use_color
from vllm_offload_doctor.output.formats import FORMATS, OutputFormat

F = TypeVar("F", bound=Callable[..., Any])


def format_option(command: str, help_text: str = "") -> Callable[[F], F]:
    """`--format`, its choices the formats `command` offers (`FORMATS`); passes an OutputFormat."""
    choices = [f.value for f in FORMATS[command]]
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


def quiet_option() -> Callable[[F], F]:
    """`-q/--quiet`: nothing on stdout; the exit status (and -o FILE) carry the result."""
    return click.option(
        "-q",
        "--quiet",
        is_flag=True,
        help="Print nothing on stdout (errors still go to stderr); the exit status and -o FILE "
        "carry the result.",
    )


def verbose_option(help_text: str) -> Callable[[F], F]:
    """`-v/--verbose`, with what it adds for this command."""
    return click.option("-v", "--verbose", is_flag=True, help=help_text)


def output_option() -> Callable[[F], F]:
    """`-o/--output FILE`: passes a Path whose folder is writable (checked before any work)."""
    return click.option(
        "-o",
        "--output",
        "output",
        metavar="FILE",
        type=click.Path(dir_okay=False, path_type=Path),
        callback=_writable,
        shell_complete=complete_path,
        help="Write the report in --format to FILE (replaced atomically); stdout keeps the "
        "text view (nothing with -q).",
    )


def _writable(_ctx: click.Context, _param: click.Parameter, value: Path | None) -> Path | None:
    # Checked up front: a long compare must not end on a path it cannot write.
    if value is not None:
        refuse_unwritable(value)
    return value


def refuse_unwritable(path: Path) -> None:
    """Raise OutputError unless `path` can be replaced by a regular file we write."""
    if path.is_symlink():
        raise OutputError(f"refusing to write {path}: it is a symbolic link")
    if path.exists() and not path.is_file():
        raise OutputError(f"cannot write {path}: not a regular file")
    folder = path.parent
    if not folder.is_dir():
        raise OutputError(f"cannot write {path}: no such folder {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {path}: permission denied")


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text`: a reader sees the old file or the whole new one, never half.

    The temporary file is created exclusively beside it and renamed over it, so a symbolic link
    planted at `path` is replaced, never written through.
    """
    refuse_unwritable(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), _file_mode(path))
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


def _file_mode(path: Path) -> int:
    """The mode the file has, else what a new file gets under the umask (mkstemp's is 0600)."""
    with contextlib.suppress(OSError):
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


class Output:
    """Where one run's report goes: stdout in the chosen format, or FILE and a text view."""

    def __init__(
        self, fmt: OutputFormat, output: Path | None, *, quiet: bool, color: bool | None = None
    ) -> None:
        self.fmt = fmt
        self.path = output
        self.quiet = quiet
        self.color = resolve_color(color)
        self._parts: list[str] = []

    @property
    def screen_format(self) -> OutputFormat | None:
        """The format stdout shows: None with -q, text beside -o, else the chosen one."""
        if self.quiet:
            return None
        return OutputFormat.TEXT if self.path is not None else self.fmt

    def show(self, text: str, *, nl: bool = True) -> None:
        """Print on stdout (for the screen format); nothing with -q."""
        if self.quiet:
            return
        # click.echo strips styles off a non-tty unless told: --color must work in a pipe.
        click.echo(text, nl=nl, color=self.color)

    def save(self, text: str, *, nl: bool = True) -> None:
        """Add to the report in the chosen format: FILE with -o, else stdout."""
        if self.path is None:
            self.show(text, nl=nl)
        else:
            self._parts.append(text + ("\n" if nl else ""))

    def report(self, render: Callable[[OutputFormat, bool], str], *, nl: bool = True) -> None:
        """The whole report at once: `render(fmt, color)` for the file (never coloured), then
        for the screen."""
        if self.path is not None:
            self.save(render(self.fmt, False), nl=nl)
        screen = self.screen_format
        if screen is not None:
            self.show(render(screen, self.color), nl=nl)

    def close(self) -> None:
        """Write FILE, once, when the command has its whole report."""
        if self.path is not None:
            write_atomically(self.path, "".join(self._parts))


def complete_path(
    _ctx: click.Context, _param: click.Parameter, incomplete: str
) -> list[click.shell_completion.CompletionItem]:
    """Let the shell complete file and directory names (click asks it to, by type "file")."""
    return [click.shell_completion.CompletionItem(incomplete, type="file")]


def resolve_color(flag: bool | None) -> bool:
    """The colour decision for this run's stdout."""
    return use_color(flag, os.environ, sys.stdout)
