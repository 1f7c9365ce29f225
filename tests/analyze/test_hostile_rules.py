"""Hostile user rule files: a compile bomb, a format-width bomb, deep TOML nesting."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.analyze.test_rule_loading import _cli, _rule_text, _write
from vllm_offload_doctor.analyze.rules import load_rule, render_message
from vllm_offload_doctor.errors import RuleFileError

HEALTHY = Path(__file__).parents[2] / "fixtures"


def test_compile_bomb_refused_fast(tmp_path: Path) -> None:
    # `regex.compile` of this 35-byte pattern reached 23.9 GB before being killed.
    path = _write(tmp_path, _rule_text(patterns=["(?:(?:a{1000}){1000}){1000}"]))
    start = time.monotonic()
    with pytest.raises(RuleFileError) as exc:
        load_rule(path)
    assert time.monotonic() - start < 1.0
    assert "patterns[0]" in str(exc.value) and "too costly" in str(exc.value)


def test_compile_bomb_cli_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, _rule_text(patterns=["(?:(?:a{1000}){1000}){1000}"]))
    log = tmp_path / "x.log"
    log.write_text("boom\n")
    code, out, err = _cli(capsys, "analyze", "--rules", str(tmp_path), str(log))
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err


def test_lookbehind_still_allowed(tmp_path: Path) -> None:
    # RE2 lacks look-arounds; such patterns still go to `regex`.
    rule = load_rule(_write(tmp_path, _rule_text(patterns=[r"(?<=boom )happened \d+"])))
    assert rule.search("boom happened 42")


def test_format_width_bomb_capped() -> None:
    out = render_message("phase {phase:>100000000} done", {}, {"phase": "load"})
    assert len(out) < 100 and "load" in out


def test_small_width_kept() -> None:
    assert render_message("[{phase:>6}]", {}, {"phase": "load"}) == "[  load]"


def test_deep_toml_nesting_is_a_rule_error(tmp_path: Path) -> None:
    path = _write(tmp_path, _rule_text() + "x = " + "[" * 100000 + "]" * 100000 + "\n")
    with pytest.raises(RuleFileError) as exc:
        load_rule(path)
    assert "\n" not in str(exc.value)
