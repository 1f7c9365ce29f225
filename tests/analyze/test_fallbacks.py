"""Events decide the fallback verdict when no rule fires: a silent engine death, Ctrl+C during
start-up, a fatal event after readiness, text that is not a vLLM log (fixtures/logs/fallback/)."""

from __future__ import annotations

from pathlib import Path

from vllm_offload_doctor.analyze.engine import analyze_file, analyze_lines
from vllm_offload_doctor.analyze.model import Category

FALLBACK = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "fallback"


def test_silent_death_under_large_offload_is_host_oom() -> None:
    a = analyze_file(FALLBACK / "silent-death-offload-0.25.1.log")
    assert a.verdict.category is Category.OOM_HOST
    assert "OOM killer" in a.verdict.summary and "96 GiB per GPU" in a.verdict.summary
    assert "dmesg" in a.verdict.remedy and "journalctl -k" in a.verdict.remedy
    assert a.failed


def test_silent_death_without_offload_says_killed() -> None:
    a = analyze_file(FALLBACK / "silent-death-no-offload-0.25.1.log")
    assert a.verdict.category is Category.UNKNOWN
    assert "killed" in a.verdict.summary
    assert "No known cause" not in a.verdict.title


def test_small_offload_is_not_enough_for_host_oom() -> None:
    text = (FALLBACK / "silent-death-offload-0.25.1.log").read_text()
    a = analyze_lines(text.replace("'cpu_offload_gb': 96", "'cpu_offload_gb': 2").splitlines())
    assert a.verdict.category is Category.UNKNOWN


def test_a_real_exception_is_not_a_silent_death() -> None:
    lines = (FALLBACK / "silent-death-offload-0.25.1.log").read_text().splitlines()
    lines.insert(5, "(EngineCore pid=800) ERROR 11-30 09:00:22 [core.py:1231] KeyError: 'w'")
    a = analyze_lines(lines)
    assert a.verdict.category is not Category.OOM_HOST


def test_interrupt_while_loading() -> None:
    a = analyze_file(FALLBACK / "interrupt-loading-0.25.1.log")
    assert a.verdict.category is Category.UNKNOWN
    assert "stopped by Ctrl+C / SIGINT while loading the weights after 185 s" in a.verdict.summary


def test_ctrl_c_after_readiness_stays_healthy() -> None:
    a = analyze_file(FALLBACK / "ready-then-ctrl-c-0.25.1.log")
    assert a.verdict.category is Category.HEALTHY


def test_engine_death_after_readiness_is_not_healthy() -> None:
    a = analyze_file(FALLBACK / "ready-then-engine-dead-0.25.1.log")
    assert a.verdict.category is Category.UNKNOWN
    assert "came up" in a.verdict.summary and "line 140" in a.verdict.summary


def test_request_error_after_readiness_stays_healthy() -> None:
    a = analyze_file(FALLBACK / "ready-then-bad-request-0.25.1.log")
    assert a.verdict.category is Category.HEALTHY


def test_text_with_no_vllm_line() -> None:
    a = analyze_file(FALLBACK / "not-a-vllm-log.txt")
    assert a.verdict.category is Category.UNKNOWN
    assert "this does not look like a vLLM server log" in a.verdict.summary


def test_a_vllm_log_without_failure_is_not_called_foreign() -> None:
    a = analyze_file(FALLBACK / "silent-death-no-offload-0.25.1.log")
    assert "does not look like a vLLM" not in a.verdict.summary


ARG001 = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "ARG001"


def test_pydantic_wrapping_a_json_decode_error_is_not_bad_args() -> None:
    a = analyze_file(ARG001 / "pydantic-wraps-json-decode.log")
    assert a.verdict.category is Category.UNKNOWN
    assert "Expecting value" in a.verdict.summary


def test_pydantic_is_judged_by_its_inner_message() -> None:
    a = analyze_file(ARG001 / "pydantic-wraps-download-error.log")
    assert a.verdict.category is Category.MODEL_DOWNLOAD


def test_pydantic_with_a_config_message_stays_bad_args() -> None:
    a = analyze_file(ARG001 / "pydantic-value-error.log")
    assert a.verdict.category is Category.BAD_ARGS


def test_folder_walk_skips_the_doctors_own_artifacts(tmp_path: Path) -> None:
    from vllm_offload_doctor.analyze.logread import resolve_inputs

    run = tmp_path / "compare-out"
    run.mkdir()
    log = (FALLBACK.parent / "healthy-0.25.1.log").read_text()
    (run / "mode-0.log").write_text(log)
    (run / "commands.txt").write_text(
        "# offload-doctor compare: the exact commands (secrets redacted)\n\n# offload 0 GiB\n"
        "vllm serve m --cpu-offload-gb 0\n"
    )
    (tmp_path / "check.txt").write_text(
        "Doctor summary (to see all details, run offload-doctor check -v):\n"
        "[✓] Operating system: Linux 6.8 (x86_64)\n"
        "[✗] vLLM: vLLM is not installed for /venv/bin/python3\n"
        "[!] Host RAM: 64 GiB for --cpu-offload-gb 40 x 1 GPU\n"
    )
    (tmp_path / "analyze.txt").write_text(
        "server.log\n  verdict:  healthy — Server healthy\n  the server started\n"
        "  offload:  not_requested\n  facts:    vLLM 0.25.1\n"
    )
    # A vLLM log that quotes a few lines of check output is still a log.
    (tmp_path / "issue.log").write_text(
        "[✓] Operating system: Linux 6.8 (x86_64)\n[✗] vLLM: not installed\n" + log
    )
    sources, errors = resolve_inputs([str(tmp_path)])
    assert sorted(Path(s.name).name for s in sources) == ["issue.log", "mode-0.log"]
    assert not errors
    # Named on the command line, a file is read whatever it holds.
    sources, _ = resolve_inputs([str(tmp_path / "check.txt")])
    assert len(sources) == 1


def test_a_wrapper_quoting_its_exception_is_no_silent_death() -> None:
    a = analyze_file(FALLBACK.parent.parent / "rules" / "PY001" / "pasted-forms.log")
    assert a.verdict.category is Category.PYTHON_ENV
    assert "killed" not in a.verdict.summary


def test_a_platform_line_is_vllm() -> None:
    a = analyze_lines(
        ["INFO 12-01 10:00:00 [__init__.py:239] Automatically detected platform cuda."]
    )
    assert "does not look like a vLLM" not in a.verdict.summary


def test_old_prefix_and_tool_parser_request_errors_stay_healthy() -> None:
    up = (FALLBACK / "ready-then-bad-request-0.25.1.log").read_text().splitlines()[:-2]
    for line in (
        "ERROR 02-25 11:11:34 serving_chat.py:101] Error in preprocessing prompt inputs",
        "(APIServer pid=1) ERROR 11-30 10:02:11 [hermes_tool_parser.py:120] Error in extracting tool call",
    ):
        assert analyze_lines([*up, line]).verdict.category is Category.HEALTHY
    dead = (
        "(APIServer pid=1) ERROR 11-30 10:02:11 [async_llm.py:480] AsyncLLM output_handler failed."
    )
    assert analyze_lines([*up, dead]).verdict.category is Category.UNKNOWN
