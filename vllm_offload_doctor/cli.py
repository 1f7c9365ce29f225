"""Command-line entry point: parses options, calls the core, renders, maps to exit codes.

Heavy imports (httpx, pynvml, psutil, regex) happen inside the commands so that
`offload-doctor --version` stays fast.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, NoReturn

import click

from vllm_offload_doctor import __version__, errors, exitcodes, links
from vllm_offload_doctor.common_cli import Output, output_option
from vllm_offload_doctor.errors import DoctorError
from vllm_offload_doctor.output.formats import OutputFormat, error_document

# Workflow order; each command's module is imported only when that command runs, so
# `--version` and `check` never pay for compare or analyze.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("vllm_offload_doctor.checks.cli", "check"),
    "compare": ("vllm_offload_doctor.compare.cli", "compare"),
    "analyze": ("vllm_offload_doctor.analyze.cli", "analyze"),
    "rules": ("vllm_offload_doctor.analyze.cli", "rules"),
    "inspect": ("vllm_offload_doctor.inspect.cli", "inspect"),
    "completion": ("vllm_offload_doctor.cli", "completion"),
}


class LazyGroup(click.Group):
    """A group whose commands are imported on first use (click's documented lazy-loading pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module_name, attr = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="offload-doctor")
def cli() -> None:
    """The truth about vLLM's --cpu-offload-gb.

    Run `offload-doctor COMMAND --help` for a command's options.
    """


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI; every outcome leaves through one of the exit codes in `exitcodes`.

    Commands return their exit status as an int. Every failure is reported here, once: one line
    on stderr, and in a JSON format (--format json or jsonl) a JSON object with the exit code on
    stdout (unless -q) and in -o FILE, so a script gets JSON whatever happened.
    """
    args = list(argv) if argv is not None else sys.argv[1:]
    want = asked(args)
    debug = bool(os.environ.get("OFFLOAD_DOCTOR_DEBUG"))
    try:
        rv = cli.main(args=args, prog_name="offload-doctor", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        code = exitcodes.USAGE if exc.exit_code in (1, 2) else exc.exit_code
        _fail(want, "usage", exc.format_message(), code, show=False)
    except (click.Abort, KeyboardInterrupt):
        _fail(want, "interrupted", "interrupted", exitcodes.INTERRUPTED, prefix="")
    except errors.Interrupted as exc:
        _fail(want, exc.kind, str(exc), exc.exit_code, prefix="")
    except DoctorError as exc:
        _fail(want, exc.kind, str(exc), exc.exit_code)
    except BrokenPipeError:
        # Reader went away (e.g. `| head`): not worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(exitcodes.OK)
    except OSError as exc:
        if exc.errno not in _DISK_FULL or debug:
            _internal(want, exc, debug)
        # A full disk (TMPDIR, --out, -o FILE) is the machine's state, not a failure of the server
        # or a bug: what was written before stays, and a rerun with room works.
        where = f" writing {exc.filename}" if exc.filename else ""
        _fail(
            want,
            "disk_full",
            f"no space left on the device{where} ({exc.strerror}); what was written before is kept",
            exitcodes.USAGE,
        )
    except Exception as exc:
        _internal(want, exc, debug)
    sys.exit(rv if isinstance(rv, int) else exitcodes.OK)


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _internal(want: Asked, exc: BaseException, debug: bool) -> NoReturn:
    if debug:
        raise exc
    message = (
        f"{type(exc).__name__}: {exc}: a bug of offload-doctor; please report it at "
        f"{links.DOCTOR_ISSUES} (OFFLOAD_DOCTOR_DEBUG=1 prints the traceback)"
    )
    _fail(want, "internal", message, exitcodes.INTERNAL, prefix="internal error: ")


class Asked(NamedTuple):
    """What the command line asks of the output, read before click parses it: a usage error
    must still answer in JSON, in FILE, and not on stdout with -q."""

    json: OutputFormat | None  # --format json or jsonl
    output: str | None  # -o/--output FILE
    quiet: bool  # -q/--quiet, alone or among short flags (-qv)


def asked(args: Sequence[str]) -> Asked:
    """Read as click would: the last value wins, and `--` ends the options."""
    fmt: str | None = None
    output: str | None = None
    quiet = False
    for i, arg in enumerate(args):
        if arg == "--":
            break
        value = args[i + 1] if i + 1 < len(args) else None
        if arg == "--format":
            fmt = value
        elif arg.startswith("--format="):
            fmt = arg.partition("=")[2]
        elif arg in ("-o", "--output"):
            output = value
        elif arg.startswith("--output="):
            output = arg.partition("=")[2]
        elif arg.startswith("-o") and not arg.startswith("--"):
            output = arg[2:]
        elif arg == "--quiet" or (arg[:1] == "-" and "q" in arg and set(arg[1:]) <= {"q", "v"}):
            quiet = True
    machine = OutputFormat(fmt) if fmt in (OutputFormat.JSON, OutputFormat.JSONL) else None
    return Asked(machine, output or None, quiet)


def _fail(
    want: Asked,
    kind: str,
    message: str,
    code: int,
    *,
    prefix: str = "error: ",
    show: bool = True,
) -> NoReturn:
    if show:
        _stderr(f"offload-doctor: {prefix}{message}")
    if want.json is not None:
        doc = error_document(kind, message, code)
        indent = 2 if want.json is OutputFormat.JSON else None
        text = json.dumps(doc, ensure_ascii=False, indent=indent)
        if not want.quiet:
            with contextlib.suppress(OSError):
                click.echo(text)
        # FILE gets it too: a script reading FILE never finds an earlier run's report there.
        if want.output is not None and kind != errors.OutputError.kind:
            from vllm_offload_doctor.common_cli import write_atomically

            with contextlib.suppress(DoctorError, OSError):  # FILE unwritable: stdout has it
                write_atomically(Path(want.output), text + "\n")
    sys.exit(code)


def _stderr(message: str) -> None:
    with contextlib.suppress(OSError):
        click.echo(message, err=True)


# `offload-doctor completion SHELL`: the shell completion script (click's), to source.
@click.command("completion", short_help="Print the shell completion script.")
@click.argument("shell", type=click.Choice(("bash", "zsh", "fish")))
@output_option()
@click.pass_context
def completion(ctx: click.Context, shell: str, output: Path | None) -> int:
    """Print the completion script for SHELL; commands, options, and paths for analyze and --model.

    \b
    Examples:
      eval "$(offload-doctor completion bash)"     # in ~/.bashrc
      eval "$(offload-doctor completion zsh)"      # in ~/.zshrc
      offload-doctor completion fish -o ~/.config/fish/completions/offload-doctor.fish
    """
    from click.shell_completion import get_completion_class

    root = ctx.find_root().command
    cls = get_completion_class(shell)
    assert cls is not None  # click ships all three
    script = cls(root, {}, "offload-doctor", "_OFFLOAD_DOCTOR_COMPLETE").source()
    # The script is the report: with -o it goes to FILE only (a second copy on screen helps no one).
    out = Output(OutputFormat.TEXT, output, quiet=output is not None)
    out.save(script)
    out.close()
    return exitcodes.OK
