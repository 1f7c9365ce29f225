"""Command-line entry point: parses options, calls the core, renders, maps to exit codes.

Heavy imports (httpx, pynvml, psutil, regex) happen inside the commands so that
`offload-doctor --version` stays fast.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Sequence

import click

from vllm_offload_doctor import __version__, exitcodes
from vllm_offload_doctor.errors import DoctorError

# Workflow order; each command's module is imported only when that command runs, so
# `--version` and `check` never pay for compare or analyze.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("vllm_offload_doctor.checks.cli", "check"),
    "compare": ("vllm_offload_doctor.compare.cli", "compare"),
    "analyze": ("vllm_offload_doctor.analyze.cli", "analyze"),
    "rules": ("vllm_offload_doctor.analyze.cli", "rules"),
    "inspect": ("vllm_offload_doctor.inspect.cli", "inspect"),
    "completion": ("vllm_offload_doctor.completion_cli", "completion"),
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

    Commands return their exit status as an int.
    """
    debug = bool(os.environ.get("OFFLOAD_DOCTOR_DEBUG"))
    try:
        rv = cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="offload-doctor",
            standalone_mode=False,
        )
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exitcodes.USAGE if exc.exit_code in (1, 2) else exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        _stderr("offload-doctor: interrupted")
        sys.exit(exitcodes.INTERRUPTED)
    except DoctorError as exc:
        _stderr(f"offload-doctor: error: {exc}")
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        # Reader went away (e.g. `| head`): not worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(exitcodes.OK)
    except Exception as exc:
        if debug:
            raise
        _stderr(
            f"offload-doctor: internal error: {type(exc).__name__}: {exc} "
            "(set OFFLOAD_DOCTOR_DEBUG=1 for the traceback)"
        )
        sys.exit(exitcodes.INTERNAL)
    sys.exit(rv if isinstance(rv, int) else exitcodes.OK)


def _stderr(message: str) -> None:
    with contextlib.suppress(OSError):
        click.echo(message, err=True)
