"""Command-line entry point: parses options, calls the core, renders, maps to exit codes.

Heavy imports (httpx, pynvml, psutil, regex) happen inside the commands so that
`offload-doctor --version` stays fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from vllm_offload_doctor import __version__, exitcodes
from vllm_offload_doctor.errors import DoctorError

F = TypeVar("F", bound=Callable[..., Any])


def guarded(func: F) -> F:
    """Turn our errors, Ctrl+C and bugs into one-line messages and distinct exit codes."""
    import functools

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = bool(os.environ.get("OFFLOAD_DOCTOR_DEBUG"))
        try:
            return func(*args, **kwargs)
        except DoctorError as exc:
            click.echo(f"offload-doctor: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("offload-doctor: interrupted", err=True)
            sys.exit(exitcodes.INTERRUPTED)
        except BrokenPipeError:
            # stdout closed early (e.g. `| head`): not an error worth a traceback.
            sys.stderr.close()
            sys.exit(exitcodes.OK)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except Exception as exc:
            if debug:
                raise
            click.echo(
                f"offload-doctor: internal error: {type(exc).__name__}: {exc} "
                "(set OFFLOAD_DOCTOR_DEBUG=1 for the traceback)",
                err=True,
            )
            sys.exit(exitcodes.INTERNAL)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="offload-doctor")
def cli() -> None:
    """The truth about vLLM's --cpu-offload-gb.

    \b
      check     can this machine and this vLLM offload at all?
      compare   run offload 0 vs X and say whether it took effect
      analyze   name the root cause in vLLM server logs
      rules     list or explain the log rules
    """


def _register() -> None:
    from vllm_offload_doctor.analyze_cli import analyze, rules
    from vllm_offload_doctor.check_cli import check
    from vllm_offload_doctor.compare_cli import compare

    for command in (check, compare, analyze, rules):
        cli.add_command(command)


_register()


def main() -> None:
    try:
        cli.main(prog_name="offload-doctor")
    except KeyboardInterrupt:
        click.echo("offload-doctor: interrupted", err=True)
        sys.exit(exitcodes.INTERRUPTED)
