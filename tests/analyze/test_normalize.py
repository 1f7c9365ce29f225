"""Unit tests of `normalize`: one raw line from any vLLM era / collector -> (proc, level, msg)."""

from __future__ import annotations

import pytest

from vllm_offload_doctor.analyze.normalize import SPLIT_THRESHOLD, clean, parse, split_long


# -- logger formats of each era ---------------------------------------------------------------
def test_old_format_without_brackets() -> None:  # vLLM <= 0.6
    line = parse(3, "INFO 11-24 14:37:21 api_server.py:528] vLLM API server version 0.6.3")
    assert (line.no, line.proc, line.pid, line.level) == (3, None, None, "INFO")
    assert line.msg == "vLLM API server version 0.6.3"


def test_bracketed_format() -> None:  # 0.8 .. 0.30
    line = parse(1, "WARNING 03-01 10:00:00 [config.py:1] Casting torch.bfloat16 to torch.float16.")
    assert line.level == "WARNING"
    assert line.msg == "Casting torch.bfloat16 to torch.float16."


def test_bracketed_path_format() -> None:
    line = parse(1, "ERROR 11-19 12:16:36 [v1/engine/core.py:842] EngineCore failed to start.")
    assert line.level == "ERROR" and line.msg == "EngineCore failed to start."


def test_fractional_seconds_and_warn_alias() -> None:
    line = parse(1, "WARN 11-19 12:16:36.123 [core.py:1] something odd")
    assert line.level == "WARNING" and line.msg == "something odd"


@pytest.mark.parametrize(
    ("raw", "proc", "pid"),
    [
        ("(APIServer pid=1) INFO 11-29 15:14:24 [api_utils.py:273] hello", "APIServer", 1),
        ("(EngineCore_DP0 pid=2) INFO 11-29 15:14:24 [core.py:1] hello", "EngineCore_DP0", 2),
        ("(Worker_TP1 pid=3) INFO 11-29 15:14:24 [worker.py:1] hello", "Worker_TP1", 3),
        (
            "(RayWorkerWrapper pid=4, ip=10.0.0.1) INFO 11-29 15:14:24 [worker.py:1] hello",
            "RayWorkerWrapper",
            4,
        ),
        (
            "(VllmWorker rank=0 pid=5) INFO 11-29 15:14:24 [worker.py:1] hello",
            "VllmWorker rank=0",
            5,
        ),
        ("(VLLM::Worker pid=6) INFO 11-29 15:14:24 [worker.py:1] hello", "VLLM::Worker", 6),
    ],
)
def test_process_prefix(raw: str, proc: str, pid: int) -> None:
    line = parse(1, raw)
    assert (line.proc, line.pid, line.level, line.msg) == (proc, pid, "INFO", "hello")
    assert line.text == raw  # the vLLM prefix is kept in the cleaned text


def test_process_prefix_on_raw_output() -> None:
    line = parse(1, "(EngineCore_DP0 pid=270) Traceback (most recent call last):")
    assert line.proc == "EngineCore_DP0" and line.level is None
    assert line.msg == "Traceback (most recent call last):"


@pytest.mark.parametrize(
    ("raw", "level", "msg"),
    [
        ("INFO:     Application startup complete.", "INFO", "Application startup complete."),
        (
            "(APIServer pid=9) INFO:     Started server process [9]",
            "INFO",
            "Started server process [9]",
        ),
        (
            'INFO:     127.0.0.1:39398 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
            "INFO",
            '127.0.0.1:39398 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        ),
        (
            "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8080): "
            "address already in use",
            "ERROR",
            "[Errno 98] error while attempting to bind on address ('0.0.0.0', 8080): address already in use",
        ),
    ],
)
def test_uvicorn(raw: str, level: str, msg: str) -> None:
    line = parse(1, raw)
    assert (line.level, line.msg) == (level, msg)


@pytest.mark.parametrize(
    ("raw", "msg"),
    [
        ("Traceback (most recent call last):", "Traceback (most recent call last):"),
        (
            '  File "/x/vllm/worker/model_runner.py", line 1058, in load_model',
            'File "/x/vllm/worker/model_runner.py", line 1058, in load_model',
        ),
        (
            "    self.model = get_model(vllm_config=self.vllm_config)",
            "self.model = get_model(vllm_config=self.vllm_config)",
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory.",
            "torch.OutOfMemoryError: CUDA out of memory.",
        ),
        (
            'ERROR 11-19 12:16:36 [core.py:842]   File "/x/core.py", line 1, in run',
            'File "/x/core.py", line 1, in run',
        ),
    ],
)
def test_traceback_lines(raw: str, msg: str) -> None:
    line = parse(1, raw)
    assert line.msg == msg


# -- clean(): colour, CR, HTML, boxes ------------------------------------------------------------
def test_clean_real_ansi() -> None:
    assert clean("\x1b[1;31mERROR\x1b[0m 11-24 14:37:21 x.py:1] boom\x1b[K") == (
        "ERROR 11-24 14:37:21 x.py:1] boom"
    )


def test_clean_caret_ansi() -> None:
    assert (
        clean("^[[31mERROR^[[0m 11-24 14:37:21 x.py:1] boom") == "ERROR 11-24 14:37:21 x.py:1] boom"
    )


@pytest.mark.parametrize("raw", ["INFO:     ready\r", "INFO:     ready^M", "INFO:\r     ready"])
def test_clean_carriage_returns(raw: str) -> None:
    assert clean(raw) == "INFO:     ready"


def test_clean_html_wrapped() -> None:
    raw = '<font color="red"><b>ERROR 11-24 14:37:21 x.py:1] a &lt;b&gt; &amp; c</b></font>'
    assert clean(raw) == "ERROR 11-24 14:37:21 x.py:1] a <b> & c"
    assert parse(1, raw).msg == "a <b> & c"


@pytest.mark.parametrize(
    "raw",
    [
        "│ ERROR 11-24 14:37:21 x.py:1] boxed │",
        "┃ ERROR 11-24 14:37:21 x.py:1] boxed ┃",
    ],
)
def test_clean_box_drawing(raw: str) -> None:
    line = parse(1, raw)
    assert line.level == "ERROR" and line.msg == "boxed"


def test_clean_strips_trailing_space_only() -> None:
    assert clean("  indented   ") == "  indented"


# -- collector prefixes ------------------------------------------------------------------------
RECORD = "(EngineCore_DP0 pid=2) ERROR 11-29 15:14:24 [core.py:1] EngineCore failed to start."


@pytest.mark.parametrize(
    "prefix",
    [
        "vllm-server-1  | ",
        "vllm_1 | ",
        "2024-11-24T14:37:21.123456789Z ",
        "2024-11-24T14:37:21+01:00 ",
        "[2024-11-24 14:37:21,123] ",
        "2024-11-24T14:37:21.123456789Z stdout F ",
        "[pod/vllm-0/vllm] ",
        "[pod/vllm-0/vllm] 2024-11-24T14:37:21.1Z ",
        "Nov 24 14:37:21 gpu-host vllm[1234]: ",
        "Nov  4 14:37:21 gpu-host docker/abc123[77]: ",
        "INFO 2025-11-19T20:16:36.096625454Z [resource.labels.containerName: vllm] ",
        "> ",
        "12.345 ",
    ],
)
def test_outer_prefixes(prefix: str) -> None:
    line = parse(1, prefix + RECORD)
    assert (line.proc, line.pid, line.level) == ("EngineCore_DP0", 2, "ERROR")
    assert line.msg == "EngineCore failed to start."
    assert line.text == RECORD


def test_ray_repeat_suffix() -> None:
    line = parse(
        1,
        "(RayWorkerWrapper pid=4, ip=10.0.0.1) ERROR 11-29 15:14:24 [w.py:1] NCCL error "
        "[repeated 30x across cluster]",
    )
    assert line.msg == "NCCL error"


def test_plain_text_has_no_level() -> None:
    line = parse(7, "Loading safetensors checkpoint shards: 100% Completed | 4/4")
    assert line.level is None and line.proc is None
    assert line.msg.startswith("Loading safetensors checkpoint shards: 100% Completed")


def test_empty_and_whitespace() -> None:
    for raw in ("", "   ", "\r", "^M", "\x1b[0m"):
        line = parse(1, raw)
        assert line.msg == "" and line.level is None


# -- split_long ---------------------------------------------------------------------------------
def test_split_long_short_line_untouched() -> None:
    raw = "INFO 11-24 14:37:21 a.py:1] one INFO 11-24 14:37:22 a.py:2] two"
    assert split_long(raw) == [raw]


RECORDS = [
    "INFO 11-24 14:37:21 api_server.py:528] vLLM API server version 0.6.3",
    "WARNING 11-24 14:37:22 config.py:1] " + "padding " * 299 + "padding",
    "Traceback (most recent call last):",
    "(EngineCore_DP0 pid=2) torch.OutOfMemoryError: CUDA out of memory.",
]


def test_split_long_lost_line_breaks() -> None:
    raw = " ".join(RECORDS)
    assert len(raw) >= SPLIT_THRESHOLD
    parts = [p.strip() for p in split_long(raw)]
    assert parts == RECORDS
    assert [parse(i, p).level for i, p in enumerate(parts)] == ["INFO", "WARNING", None, None]
    assert parse(4, parts[3]).proc == "EngineCore_DP0"


def test_split_long_keeps_process_prefix_with_its_record() -> None:
    record = "(APIServer pid=1) INFO 11-29 15:14:24 [api_utils.py:273] non-default args: {'x': 1}"
    raw = " ".join([RECORDS[0], record, RECORDS[1]])
    parts = [p.strip() for p in split_long(raw)]
    assert parts == [RECORDS[0], record, RECORDS[1]]


def test_split_long_without_records_is_one_piece() -> None:
    raw = "a" * (SPLIT_THRESHOLD * 3)
    assert split_long(raw) == [raw]


def test_split_short_paste_with_lost_breaks_into_records_frames_and_exception() -> None:
    """A paste under SPLIT_THRESHOLD whose breaks were lost still splits at records and frames."""
    lines = [
        "INFO 02-26 09:54:05 executor_base.py:111] # cuda blocks: 0, # CPU blocks: 4681",
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/x/vllm/worker/worker.py", line 500, in raise_if_cache_size_invalid',
        "[rank0]: ValueError: No available memory for the cache blocks.",
    ]
    raw = " ".join(lines)
    assert len(raw) < SPLIT_THRESHOLD
    parts = [p.strip() for p in split_long(raw)]
    assert parts[0] == lines[0]
    assert any(p.startswith('File "/x/vllm/worker/worker.py"') for p in parts)
    assert parts[-1] == "ValueError: No available memory for the cache blocks."


def test_short_line_with_one_record_is_not_split() -> None:
    line = "INFO 02-26 09:54:05 worker.py:267] " + "model weights take 5.20GiB; " * 15
    assert split_long(line) == [line]


@pytest.mark.parametrize(
    ("raw", "proc", "level", "msg"),
    [
        (
            "| INFO 07-01 10:00:00 [api_server.py:1000] vLLM API server version 0.10.1 |",
            None,
            "INFO",
            "vLLM API server version 0.10.1",
        ),
        (
            "| (EngineCore_DP0 pid=7) ERROR 07-01 10:00:03 [core.py:700] ValueError: bad |",
            "EngineCore_DP0",
            "ERROR",
            "ValueError: bad",
        ),
        (
            "| ValueError: the weight budget is out of range |",
            None,
            None,
            "ValueError: the weight budget is out of range",
        ),
        (
            '|   File "/x/vllm/config/model.py", line 3, in f |',
            None,
            None,
            'File "/x/vllm/config/model.py", line 3, in f',
        ),
        (
            "| 2026-01-01T00:00:00Z (APIServer pid=3) INFO 05-01 10:00:00 [a.py:1] hi",
            "APIServer",
            "INFO",
            "hi",
        ),
    ],
)
def test_github_table_row_holding_a_log_line(
    raw: str, proc: str | None, level: str | None, msg: str
) -> None:
    line = parse(1, raw)
    assert (line.proc, line.level, line.msg) == (proc, level, msg)


@pytest.mark.parametrize(
    "raw",
    [
        "| ✅ ok | Operating system | Linux 6.8.0 (x86_64) |",
        "|---|---|",
        "| Status | Check | Result |",
        "| " + " " * 5000 + "|",
    ],
)
def test_github_table_rows_of_other_content_stay(raw: str) -> None:
    assert parse(1, raw).msg == raw.strip()


def test_log_pasted_in_a_github_table_is_read() -> None:
    from pathlib import Path

    from vllm_offload_doctor.analyze.engine import analyze_file

    a = analyze_file(Path(__file__).parents[1] / "pasted" / "github-table-config-error.log")
    assert a.facts.vllm_version == "0.10.1"
    assert a.verdict.category.value == "bad_args"
