"""The conventions every command keeps: help on each option, examples, workflow order, completion."""

from __future__ import annotations

import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from vllm_offload_doctor.cli import cli

WORKFLOW = ["check", "compare", "analyze", "rules"]


def _commands() -> list[tuple[str, click.Command]]:
    assert isinstance(cli, click.Group)
    ctx = click.Context(cli)
    found = [(name, cli.get_command(ctx, name)) for name in cli.list_commands(ctx)]
    return [(name, command) for name, command in found if command is not None]


@pytest.mark.parametrize("name", [n for n, _ in _commands()])
def test_every_option_has_help_and_the_command_has_examples(name: str) -> None:
    command = dict(_commands())[name]
    bare = [p.name for p in command.params if isinstance(p, click.Option) and not p.help]
    assert not bare, f"{name}: options without help text: {bare}"
    out = CliRunner().invoke(cli, [name, "--help"]).output
    assert "Examples:" in out
    examples = out.split("Examples:")[1].splitlines()[1:]
    assert any(
        line.strip().startswith("offload-doctor ") or "offload-doctor" in line for line in examples
    )


def test_commands_are_listed_in_workflow_order_with_whole_summaries() -> None:
    out = CliRunner().invoke(cli, ["--help"]).output
    listed = [line.split()[0] for line in out.split("Commands:")[1].splitlines() if line.strip()]
    assert listed[: len(WORKFLOW)] == WORKFLOW
    assert "..." not in out.split("Commands:")[1]  # no summary cut by click


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_the_shell_script(shell: str) -> None:
    result = CliRunner().invoke(cli, ["completion", shell], standalone_mode=False)
    assert result.exception is None and result.return_value == 0
    assert "_OFFLOAD_DOCTOR_COMPLETE" in result.output


def _complete(words: str) -> list[str]:
    env = {**os.environ, "_OFFLOAD_DOCTOR_COMPLETE": "bash_complete"}
    env |= {"COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - (not words.endswith(" ")))}
    done = subprocess.run(
        [sys.executable, "-c", "from vllm_offload_doctor.cli import main; main()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout.splitlines()


def test_completion_completes_commands_and_paths() -> None:
    assert "plain,analyze" in _complete("offload-doctor ana")
    # A path argument is left to the shell's file completion.
    assert _complete("offload-doctor analyze fix") == ["file,fix"]
    assert _complete("offload-doctor check --model /mo") == ["file,/mo"]
    assert _complete("offload-doctor compare --model /mo") == ["file,/mo"]


@pytest.mark.parametrize("fmt", ["json", "markdown", "text"])
def test_compare_dry_run_honours_format(fmt: str) -> None:
    args = ["compare", "--dry-run", "--format", fmt, "--vllm-cmd", sys.executable]
    args += ["--offload-gb", "0.5", "--offload-gb", "1"]
    result = CliRunner().invoke(cli, args, standalone_mode=False)
    assert result.exception is None and result.return_value == 0, result.output
    if fmt == "json":
        import json

        doc = json.loads(result.output)
        assert doc["dry_run"] is True
        assert [m["offload_gb"] for m in doc["modes"]] == [0.0, 0.5, 1.0]
        assert all(m["argv"][0] == sys.executable for m in doc["modes"])
    elif fmt == "markdown":
        assert result.output.startswith("```bash\n") and result.output.rstrip().endswith("```")
    else:
        assert result.output.startswith("# offload-doctor compare")
