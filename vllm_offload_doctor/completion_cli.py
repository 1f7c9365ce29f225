"""`offload-doctor completion SHELL`: the shell completion script (click's), to source."""

from __future__ import annotations

import click

from vllm_offload_doctor import exitcodes


@click.command("completion", short_help="Print the shell completion script.")
@click.argument("shell", type=click.Choice(("bash", "zsh", "fish")))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> int:
    """Print the completion script for SHELL; commands, options, and paths for analyze and --model.

    \b
    Examples:
      eval "$(offload-doctor completion bash)"     # in ~/.bashrc
      eval "$(offload-doctor completion zsh)"      # in ~/.zshrc
      offload-doctor completion fish > ~/.config/fish/completions/offload-doctor.fish
    """
    from click.shell_completion import get_completion_class

    root = ctx.find_root().command
    cls = get_completion_class(shell)
    assert cls is not None  # click ships all three
    script = cls(root, {}, "offload-doctor", "_OFFLOAD_DOCTOR_COMPLETE").source()
    click.echo(script)
    return exitcodes.OK
