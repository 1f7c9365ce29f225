"""`--redact` a support engineer can paste in public (issue 18 item 5): IP addresses, host names
and FQDNs, e-mail addresses and user names in paths, each replaced by one placeholder per value
across the whole report; loopback, public services and vLLM's own words stay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import re2
from click.testing import CliRunner

from vllm_offload_doctor import redact
from vllm_offload_doctor.cli import cli
from vllm_offload_doctor.redact import Places

LOG = "\n".join(
    [
        "alice@gpu-node-07:~$ vllm serve /home/alice/models/llama --host 0.0.0.0",
        "INFO 11-29 15:14:20 [api_server.py:1] vLLM API server version 0.11.0",
        "(RayWorkerWrapper pid=9, ip=10.20.30.41) INFO 11-29 15:14:21 [worker.py:1] on gpu-node-07",
        "INFO 11-29 15:14:22 [parallel_state.py:1] world_size=2 rank=0 local_rank=0 "
        "distributed_init_method=tcp://10.20.30.40:29500 backend=nccl",
        "ERROR 11-29 15:14:25 [core.py:1] torch.OutOfMemoryError: CUDA out of memory on "
        "gpu-node-07.cluster.acme.internal (10.20.30.40, fe80::1ff:fe23:4567:890a); "
        "mail ops-team@acme.com; File /home/alice/venv/lib/python3.11/site-packages/x.py "
        "from https://mirror.acme.corp/models c10::Error huggingface.co 127.0.0.1",
        "",
    ]
)
PRIVATE = [
    "alice",
    "gpu-node-07",
    "10.20.30.41",
    "10.20.30.40",
    "fe80::1ff:fe23:4567:890a",
    "ops-team@acme.com",
    "acme.internal",
    "mirror.acme.corp",
]


def _run(*args: str) -> str:
    res = CliRunner().invoke(cli, ["analyze", *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), "".join(
        __import__("traceback").format_exception(res.exception)
    )
    return res.output


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "server.log"
    path.write_text(LOG)
    return path


@pytest.mark.parametrize("fmt", ["text", "json", "jsonl", "markdown", "html"])
def test_redact_replaces_every_place_and_person(log: Path, fmt: str) -> None:
    plain = _run("--format", fmt, str(log))
    assert "10.20.30.40" in plain  # shown unless asked
    out = _run("--format", fmt, "--redact", str(log))
    assert "OutOfMemoryError" in out  # the evidence line is shown
    for value in PRIVATE:
        assert value not in out, (fmt, value)
    # What a reader needs stays: loopback, bind-all, public hosts, C++ scopes.
    for kept in ("127.0.0.1", "huggingface.co", "c10::Error"):
        assert kept in out, (fmt, kept)


def test_the_same_value_gets_the_same_placeholder_across_the_report(log: Path) -> None:
    results = json.loads(_run("--format", "json", "--redact", str(log), str(log)))["results"]
    # Two copies of the log, one report: each value has one placeholder in both results.
    first, second = ({k: v for k, v in r.items() if k != "file"} for r in results)
    assert first == second
    text = json.dumps(first)
    assert {"<ip-1>", "<ip-2>", "<host-1>", "<email-1>", "<user-1>"} <= set(
        re2.findall(r"<[a-z]+-\d+>", text)
    )


def test_nccl_and_launcher_places_name_hosts() -> None:
    places = Places()
    out = redact.redact(
        "dgx-a07:4242:4242 [0] NCCL INFO Bootstrap; then host=dgx-b11 joined dgx-a07",
        hosts=True, places=places,
    )  # fmt: skip
    assert "dgx-a07" not in out and "dgx-b11" not in out
    first = out.split(":", 1)[0]
    assert first.startswith("<host-") and out.endswith(f"joined {first}")


def test_places_are_consistent_and_numbered() -> None:
    places = Places()
    a = redact.redact("from 10.0.0.5 to gpu07.acme.internal", hosts=True, places=places)
    b = redact.redact("gpu07 answered 10.0.0.5; 10.0.0.6 did not", hosts=True, places=places)
    assert a == "from <ip-1> to <host-1>"
    assert b == "<host-1> answered <ip-1>; <ip-2> did not"  # a short name is its FQDN's host


@pytest.mark.parametrize(
    "line",
    [
        "vllm.entrypoints.openai.api_server config.json model.safetensors torch 2.5.1",
        "driver 550.54.15 CUDA 12.4 NCCL 2.21.5 at 15:14:24.123",
        "std::runtime_error at::native::foo c10::cuda::CUDAError",
        "listening on http://0.0.0.0:8000 and http://localhost:8000/v1",
        "git@github.com:vllm-project/vllm.git https://huggingface.co/meta-llama",
    ],
)
def test_words_versions_and_public_places_stay(line: str) -> None:
    assert redact.redact(line, hosts=True, home=True, places=Places()) == line


def test_redact_keeps_the_verdict(log: Path) -> None:
    plain = json.loads(_run("--format", "json", str(log)))["results"][0]
    hidden = json.loads(_run("--format", "json", "--redact", str(log)))["results"][0]
    assert plain["verdict"]["category"] == hidden["verdict"]["category"]
    assert plain["offload"]["status"] == hidden["offload"]["status"]


def test_redact_hides_places_in_the_error_lines_too(tmp_path: Path) -> None:
    missing = "/home/alice/logs/gpu07.acme.internal.log"
    res = CliRunner().invoke(cli, ["analyze", "--redact", missing])
    assert "offload-doctor: error:" in res.output
    assert "alice" not in res.output and "acme.internal" not in res.output
    assert "no such file" in res.output
