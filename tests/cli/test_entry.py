"""The console script's `--version` fast path says what click's version option says, and
imports nothing of the CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from vllm_offload_doctor import __main__ as entry
from vllm_offload_doctor.cli import cli


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_fast_version_is_clicks_line(flag, monkeypatch, capsys):
    from_click = CliRunner().invoke(cli, [flag]).output
    monkeypatch.setattr(sys, "argv", ["offload-doctor", flag])
    entry.main()
    assert capsys.readouterr().out == from_click == entry.VERSION_LINE + "\n"


def test_fast_version_loads_neither_click_nor_a_command():
    code = (
        "import sys; sys.argv = ['offload-doctor', '--version']\n"
        "from vllm_offload_doctor.__main__ import main; main()\n"
        "loaded = [m for m in ('click', 'vllm_offload_doctor.cli', 'regex', 're2') if m in sys.modules]\n"
        "print(loaded)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines()[-1] == "[]"


def test_anything_else_goes_to_the_cli(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["offload-doctor", "--help"])
    with pytest.raises(SystemExit) as exc:
        entry.main()
    assert exc.value.code == 0
    assert "Commands:" in capsys.readouterr().out
