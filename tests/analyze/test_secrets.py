"""Secrets never leave the doctor: planted in logs, arguments and environments, found nowhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import re2
from planted_secrets import SECRET_ARGV, SECRET_ENV, SECRETS, assert_no_leak, leaks, secret_log

from vllm_offload_doctor import cli, redact
from vllm_offload_doctor.analyze.engine import Engine
from vllm_offload_doctor.analyze.render import Renderer

FORMATS = ("text", "json", "jsonl", "markdown")


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "planted.log"
    path.write_text(secret_log())
    return path


def _render(renderer: Renderer, path: Path, fmt: str) -> str:
    a = Engine().analyze_file(path)
    if fmt == "json":
        return renderer.json([a], [])
    if fmt == "jsonl":
        return renderer.jsonl_line(a)
    return renderer.text(a) if fmt == "text" else renderer.markdown(a)


@pytest.mark.parametrize("fmt", FORMATS)
def test_planted_secrets_reach_the_output_unless_masked(log: Path, fmt: str) -> None:
    # Guards the leak test below: the planted lines are evidence, shown in every format. They
    # are masked where evidence is taken (before the cut), so even a bare renderer shows masks.
    out = _render(Renderer(redact_secrets=False), log, fmt)
    assert out.count(redact.MASK) >= 14, out


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("flag", [(), ("--redact",)])
def test_zero_leaks_in_every_format(
    log: Path, capsys: pytest.CaptureFixture[str], fmt: str, flag: tuple[str, ...]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["analyze", "--format", fmt, *flag, str(log)])
    out, err = capsys.readouterr()
    assert exc.value.code == 1
    assert "model_download" in out
    assert_no_leak(out + err, f"analyze --format {fmt} {' '.join(flag)}")


def test_zero_leaks_over_a_batch_with_triage_table(log: Path, tmp_path: Path) -> None:
    other = tmp_path / "copy.log"
    other.write_text(secret_log())
    for fmt in FORMATS:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "vllm_offload_doctor",
                "analyze",
                "--format",
                fmt,
                str(log),
                str(other),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 1, proc.stderr
        assert_no_leak(proc.stdout + proc.stderr, f"batch --format {fmt}")


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_each_kind_is_masked_in_its_place(kind: str) -> None:
    lines = [line for line in secret_log().splitlines() if SECRETS[kind] in line]
    assert lines
    for line in lines:
        assert kind not in leaks(redact.scrub_text(line)), line


def test_scrub_argv_and_env() -> None:
    argv = redact.scrub_argv(["vllm", "serve", *SECRET_ARGV, "--port", "8000"])
    assert_no_leak(" ".join(argv), "argv")
    assert argv[:4] == ["vllm", "serve", "--api-key", "***"]
    assert argv[-2:] == ["--port", "8000"]
    env = redact.scrub_env({**SECRET_ENV, "PATH": "/usr/bin"})
    assert_no_leak(repr(env), "env")
    assert env["PATH"] == "/usr/bin"
    assert env["HF_ENDPOINT"] == "https://mirror-user:***@hf-mirror.example.com"


def test_scrub_file_masks_multiline_pem_and_keeps_the_rest(tmp_path: Path) -> None:
    src, dst = tmp_path / "in.log", tmp_path / "out.log"
    body = secret_log().replace("\n", "\r\n", 3)
    src.write_text(body, newline="")
    redact.scrub_file(src, dst)
    out = dst.read_bytes().decode()
    assert_no_leak(out, "scrub_file")
    assert out.count("\n") == body.count("\n") and out.count("\r\n") == 3
    assert "-----BEGIN RSA PRIVATE KEY-----\n***\n-----END RSA PRIVATE KEY-----" in out
    assert "hf_raise_for_status" in out


def test_pem_block_across_lines_is_masked_until_its_end() -> None:
    text = "\n".join(
        [
            "    12: -----BEGIN OPENSSH PRIVATE KEY-----",
            "    13: b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
            "    14: QyNTUxOQAAACDq7Qy9vXw=",
            "    15: -----END OPENSSH PRIVATE KEY-----",
            "    16: INFO Application startup complete.",
        ]
    )
    out = redact.scrub_text(text).splitlines()
    assert out[1] == "    13: ***" and out[2] == "    14: ***"
    assert out[4] == "    16: INFO Application startup complete."
    # A block cut short ends at the first line that is not key material.
    cut = redact.scrub_text(
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAAS\nINFO Ready"
    )
    assert cut.splitlines()[1:] == ["***", "INFO Ready"]


@pytest.mark.parametrize(
    "line",
    [
        "non-default args: {'model': 'Qwen/Qwen3-0.6B', 'hf_token': True, 'api_key': None, "
        "'tokenizer': 'Qwen/Qwen3-0.6B', 'max_num_batched_tokens': 8192}",
        "/root/.cache/huggingface/hub/models--Qwen--Qwen3-0.6B/snapshots/"
        "c1899de289a04d12100db370d81485cdf75e47ca/config.json",
        "Maximum concurrency for 4,096 tokens per request: 49.31x",
        "Symbol not found: __ZN3c104impl3cow23materialize_cow_storageERNS_11StorageImplE",
        "HTTP 401: Bearer authentication failed",
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    ],
)
def test_ordinary_log_text_is_left_alone(line: str) -> None:
    assert redact.scrub_text(line) == line


def test_secret_names() -> None:
    for name in ("HF_TOKEN", "--api-key", "aws_secret_access_key", "DB_PASSWORD", "authorization"):
        assert redact.is_secret_name(name), name
    for name in ("max_num_batched_tokens", "tokenizer", "tokenizer_mode", "HF_HOME", "key_cache"):
        assert not redact.is_secret_name(name), name


def test_every_redaction_pattern_is_re2() -> None:
    # RE2 runs in time linear in the input: no crafted line can make masking quadratic.
    patterns = [v for v in vars(redact).values() if hasattr(v, "pattern") and hasattr(v, "sub")]
    assert len(patterns) >= 6
    assert all(isinstance(p, type(re2.compile("x"))) for p in patterns)
    assert "re" not in vars(redact)


CRAFTED = [
    "version" + " " * 256_000,
    "TOKEN" * 52_000,
    "non-default args: {'api_key': 'TOKEN" + "A" * 256_000,
    "eyJ" * 86_000,
    "aB3/" * 64_000,
    "token= " * 37_000,
    "https://" + "a:" * 128_000,
    "-----BEGIN PRIVATE KEY-----" * 9_500,
    "Authorization: " * 17_000,
    "'password': ['" * 18_000,
    "token: [" * 32_000,
    "'token': '" * 25_000,
    "https://a:" * 25_000 + "@",
    "secret: x " * 25_600,
    "Bearer " * 37_000,
]


def test_crafted_256kb_lines_finish_quietly() -> None:
    # A hang guard, not a timing: at quadratic cost these lines would take hours. RE2 also
    # must not fall back from its DFA (it says so on stderr, in the middle of a report).
    code = (
        "import sys, json; from vllm_offload_doctor import redact\n"
        "for line in json.load(sys.stdin):\n"
        "    redact.scrub_text(line + '\\n' + line)\n"
        "    redact.scrub_text('-----BEGIN PRIVATE KEY-----\\n' + line)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(CRAFTED),
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr == ""


def test_scrub_argv_hides_every_value_of_a_multi_valued_api_key() -> None:
    argv = [
        "vllm",
        "serve",
        "m",
        "--api-key",
        "k1-Zq8",
        "k2-Wv3",
        "--port",
        "8000",
        "--hf-token",
        "hf-plain-value",
        "extra",
        "--token=abc123",
        "-e",
        f"HF_ENDPOINT=https://u:{SECRETS['url_password']}@m.example",
    ]
    out = redact.scrub_argv(argv)
    assert out == [
        "vllm",
        "serve",
        "m",
        "--api-key",
        "***",
        "***",
        "--port",
        "8000",
        "--hf-token",
        "***",
        "extra",
        "--token=***",
        "-e",
        "HF_ENDPOINT=https://u:***@m.example",
    ]


def test_scrub_file_in_place_keeps_mode_and_masks(tmp_path: Path) -> None:
    path = tmp_path / "mode-0.log"
    path.write_text(secret_log())
    path.chmod(0o640)
    redact.scrub_file(path)
    assert_no_leak(path.read_text(), "scrub_file in place")
    assert "hf_raise_for_status" in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["mode-0.log"]  # no temporary left


def test_scrub_file_streams_a_huge_line_in_bounded_memory(tmp_path: Path) -> None:
    import tracemalloc

    # 24 MB on one line, secrets spread over it (some across the 256 KiB piece boundaries).
    unit = "x " * 5000 + " ".join(f"--api-key {v} token={v}" for v in SECRETS.values()) + " "
    src, dst = tmp_path / "long.log", tmp_path / "out.log"
    with src.open("w") as f:
        for _ in range(24_000_000 // len(unit)):
            f.write(unit)
        f.write("\nINFO done\n")
    tracemalloc.start()
    redact.scrub_file(src, dst)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20, peak
    found: set[str] = set()
    tail = ""
    with dst.open() as f:
        while chunk := f.read(1 << 20):
            found.update(leaks(tail + chunk))  # with the previous tail: no leak hides in a cut
            tail = chunk[-200:]
    assert not found
    assert dst.read_text().endswith("\nINFO done\n")


def test_a_line_crowded_with_secret_places_is_cut_and_says_so() -> None:
    line = " ".join(f"token={i}-{SECRETS['bearer']}" for i in range(1000)) + " hf_tail"
    out = redact.scrub_text(line)
    assert out.endswith(redact.CROWDED)
    assert out.count("token=***") == redact.MAX_PLACES
    assert_no_leak(out)
    assert "hf_tail" not in out
    # Below the cap every place is masked and the line is kept whole.
    few = " ".join(f"token={i}-{SECRETS['bearer']}" for i in range(10)) + " tail"
    assert redact.scrub_text(few) == " ".join(["token=***"] * 10) + " tail"


@pytest.mark.parametrize("fmt", FORMATS)
def test_input_names_with_secrets_are_masked_in_errors(tmp_path: Path, fmt: str) -> None:
    missing = tmp_path / f"run_token={SECRETS['api_key_arg']}.log"
    url = f"https://u:{SECRETS['url_password']}@logs.example.com/{SECRETS['hf_token']}.log"
    bad = tmp_path / f"{SECRETS['github_classic']}.log"
    bad.write_bytes(b"")  # empty: an error naming the file
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_offload_doctor",
            "analyze",
            "--format",
            fmt,
            str(missing),
            url,
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("offload-doctor: error: ") == 3
    assert_no_leak(proc.stdout + proc.stderr, f"errors, --format {fmt}")


def test_scrub_env_masks_terse_secret_names_and_keeps_the_rest() -> None:
    env = {
        "AZURE_OPENAI_KEY": "a1",
        "SMTP_PASS": "p2",
        "GITLAB_PAT": "g3",
        "NGC_API_KEY": "n4",
        "AWS_SESSION_TOKEN": "t5",
        "PWD": "/srv/app",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "VLLM_USE_V1": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    out = redact.scrub_env(env)
    assert [k for k in env if out[k] == "***"] == list(env)[:5]
    assert all(out[k] == env[k] for k in list(env)[5:])
