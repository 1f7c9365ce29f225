"""`offload-doctor completion SHELL`: the shell completion script (click's), to source."""

from __future__ import annotations

from pathlib import Path

import click

from vllm_offload_doctor import exitcodes
from vllm_offload_doctor.common_cli import Output, output_option
from vllm_offload_doctor.formats import OutputFormat


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
