"""compare without processes: commands, config rules, verdict logic, rendering, atomic writes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from vllm_offload_doctor.compare import (
    DEFAULT_MODEL,
    DEFAULT_REVISION,
    MRV2_LINKS,
    CompareConfig,
    atomic_write,
    commands_text,
    compare_pair,
    relevant_env,
)
from vllm_offload_doctor.compare import cli as compare_cli
from vllm_offload_doctor.compare.model import CompareReport, ModeResult
from vllm_offload_doctor.compare.render import render_markdown, render_text
from vllm_offload_doctor.errors import DoctorError


def judge(base: dict[str, Any], off: dict[str, Any] | None) -> dict[str, Any]:
    """compare_pair on the typed modes, as the report.json dict."""
    b = ModeResult.from_dict(base)
    o = ModeResult.from_dict(off) if off is not None else None
    return compare_pair(b, o).to_dict()


def test_default_command_is_the_reference_procedure() -> None:
    cfg = CompareConfig()
    assert cfg.modes() == [0.0, 0.5]
    assert cfg.argv(0.0) == [
        "vllm",
        "serve",
        "Qwen/Qwen3-0.6B",
        "--revision",
        DEFAULT_REVISION,
        "--cpu-offload-gb",
        "0",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--max-model-len",
        "2048",
    ]
    assert cfg.request_body() == {
        "model": "Qwen/Qwen3-0.6B",
        "messages": [{"role": "user", "content": "Назови одним словом столицу Франции. /no_think"}],
        "max_tokens": 32,
        "stream": False,
    }
    assert cfg.expected_answers == ["Париж", "Paris"]
    assert compare_cli.DEFAULT_MODEL == DEFAULT_MODEL


def test_local_model_gets_no_revision_and_served_name_is_used() -> None:
    cfg = CompareConfig(
        model="/tmp/qwen3-0.6b-random",
        served_model_name="Qwen/Qwen3-0.6B",
        extra_args=["--attention-backend", "TRITON_ATTN"],
    )
    argv = cfg.argv(0.5)
    assert "--revision" not in argv
    assert argv[-4:] == [
        "--served-model-name",
        "Qwen/Qwen3-0.6B",
        "--attention-backend",
        "TRITON_ATTN",
    ]
    assert cfg.request_body()["model"] == "Qwen/Qwen3-0.6B"
    # explicit revision for another model, and `none` to drop the default
    assert "--revision" in CompareConfig(model="x/y", revision="abc").argv(0)
    assert "--revision" not in CompareConfig(revision="none").argv(0)


def test_custom_prompt_has_no_answer_check_unless_expect() -> None:
    assert CompareConfig(prompt="hi").expected_answers == []
    assert CompareConfig(prompt="hi", expect=["yo"]).expected_answers == ["yo"]


@pytest.mark.parametrize(
    ("args", "tp"),
    [
        ([], 1),
        (["--tensor-parallel-size", "2"], 2),
        (["--tensor-parallel-size=4"], 4),
        (["-tp", "2"], 2),
    ],
)
def test_tensor_parallel_size_from_extra_args(args: list[str], tp: int) -> None:
    assert CompareConfig(extra_args=args).tensor_parallel_size() == tp


@pytest.mark.parametrize(
    "cfg",
    [
        CompareConfig(extra_args=["--cpu-offload-gb", "3"]),
        CompareConfig(extra_args=["--port=9000"]),
        CompareConfig(offload_gb=[0.0]),
        CompareConfig(offload_gb=[-1.0]),
        CompareConfig(repeats=0),
    ],
)
def test_invalid_configs(cfg: CompareConfig) -> None:
    with pytest.raises(DoctorError):
        cfg.validate()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "99999"], "--port 99999: must be 1-65535"),
        (["--port", "0"], "--port 0: must be 1-65535"),
        (["--timeout", "-5"], "--timeout -5: must be more than 0"),
        (["--timeout", "0"], "--timeout 0: must be more than 0"),
        (["--timeout", "nan"], "--timeout nan: must be more than 0"),
        (["--request-timeout", "0"], "--request-timeout 0: must be more than 0"),
        (["--max-tokens", "0"], "--max-tokens 0: must be more than 0"),
        (["--grace", "-1"], "--grace -1: must be 0 or more"),
        (["--model", "./no/such/model"], "--model ./no/such/model: no such file or directory"),
        (["--model", "/no/such/model"], "--model /no/such/model: no such file or directory"),
    ],
)
def test_impossible_numbers_are_refused_with_exit_2(
    args: list[str], message: str, tmp_path: Path
) -> None:
    import subprocess
    import sys

    # Not --dry-run: the missing model is only checked before a real run.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_offload_doctor",
            "compare",
            "--out",
            str(tmp_path / "o"),
            "--vllm-cmd",
            "/bin/false",
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()  # refused before anything ran


def test_a_hub_id_and_an_existing_path_are_accepted(tmp_path: Path) -> None:
    CompareConfig(model="org/name").check_model()
    CompareConfig(model="https://mirror.example.com/a/b").check_model()
    CompareConfig(model=str(tmp_path)).check_model()
    CompareConfig(grace_s=0.0).validate()


def test_commands_text_redacts_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz123456")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    cfg = CompareConfig(extra_args=["--api-key", "sk-supersecretsupersecret"])
    text = commands_text(cfg)
    assert "supersecret" not in text and "hf_abcdef" not in text
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in text
    assert relevant_env()["HF_TOKEN"] == "***"


def test_atomic_write_replaces(tmp_path: Path) -> None:
    p = tmp_path / "report.json"
    atomic_write(p, "1")
    atomic_write(p, "2")
    assert p.read_text() == "2" and [x.name for x in tmp_path.iterdir()] == ["report.json"]


# ---------------------------------------------------------------------------- verdicts


def _mode(label: str, gb: float, **facts: Any) -> dict[str, Any]:
    f: dict[str, Any] = {
        "vllm_version": "0.25.1",
        "model_runner": "v1",
        "offloader": None,
        "offloaded_gib": None,
        "model_loading_gib": 1.12,
        "kv_cache_gib": 124.75,
        "kv_cache_tokens": 1_167_936,
        "ranks": {},
    }
    f.update(facts)
    return {
        "label": label,
        "offload_gb": gb,
        "status": "ok",
        "role": "baseline" if gb == 0 else "offload",
        "startup_s": 100.0,
        "command": ["vllm", "serve", "m"],
        "log": f"mode-{label}.log",
        "log_facts": f,
        "analysis": {
            "category": "healthy",
            "offload_status": "not_requested",
            "links": [],
            "remedy": "",
            "summary": "ok",
            "title": "healthy",
        },
        "latency": {
            "n": 5,
            "ok": 5,
            "median_s": 0.070,
            "p95_s": 0.08,
            "min_s": 0.069,
            "tokens_per_s": 457.0,
            "completion_tokens_median": 32,
        },
        "gpu": {
            "available": True,
            "devices": [
                {
                    "index": 0,
                    "used_mib": 132_329,
                    "total_mib": 143_771,
                    "tree_used_mib": 131_000,
                    "tree_processes": [{"pid": 2, "name": "VLLM::EngineCor", "used_mib": 131_000}],
                    "pcie": {
                        "max_gen": 5,
                        "max_width": 16,
                        "current_gen": 5,
                        "current_width": 16,
                        "bandwidth_gbs": 63.0,
                    },
                }
            ],
        },
        "host_rss": {"total_mib": 2500.0},
        "answers": [{"answer": "xyz", "count": 5}],
        "answers_matched": {"matched": 0, "checked": 5},
    }


BASE = _mode("0", 0.0)
EFFECTIVE = _mode(
    "0.5",
    0.5,
    offloader="UVAOffloader",
    offloaded_gib=0.51,
    model_loading_gib=0.62,
    kv_cache_gib=125.26,
)
EFFECTIVE["analysis"]["offload_status"] = "effective"
EFFECTIVE["latency"] = dict(EFFECTIVE["latency"], median_s=0.395)


def test_verdict_effective_with_link_bound() -> None:
    c = judge(BASE, EFFECTIVE)
    assert c["status"] == "effective"
    assert c["weights_delta_gib"] == pytest.approx(0.5)
    perf = c["performance"]
    assert perf["slowdown"] == pytest.approx(5.64, abs=0.01)
    assert perf["extra_ms_per_token"] == pytest.approx(10.16, abs=0.01)
    # 0.51 GiB over 63 GB/s x 0.85 -> ~10.2 ms per token; measured about the same
    assert perf["link_bound_ms_per_token"] == pytest.approx(10.23, abs=0.05)
    assert perf["implied_gbs"] == pytest.approx(53.9, abs=0.5)
    assert "PCIe gen5 x16" in c["summary"]


def test_verdict_ignored_v2_has_links_and_remedy() -> None:
    off = _mode("0.5", 0.5, model_runner="v2")
    off["analysis"].update(category="offload_ignored", offload_status="ignored")
    c = judge(BASE, off)
    assert c["status"] == "ignored"
    assert set(MRV2_LINKS) <= set(c["links"])
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in c["remedy"] and "0.28.0" in c["remedy"]


def test_verdict_ignored_from_measurement_alone() -> None:
    off = _mode("0.5", 0.5)  # V1, no offload lines, same weights: nothing moved
    off["analysis"]["offload_status"] = "unknown"
    c = judge(BASE, off)
    assert c["status"] == "ignored" and "make_layers" in c["summary"]


def test_verdict_failed_carries_root_cause() -> None:
    off = copy.deepcopy(EFFECTIVE)
    off.update(status="exited", reason="the server exited with status 1 before it was ready")
    off["analysis"].update(
        category="oom_weights",
        title="CUDA OOM while loading weights",
        summary="Out of memory loading weights.",
        remedy="Offload more.",
        links=["https://docs.vllm.ai/x"],
    )
    c = judge(BASE, off)
    assert c["status"] == "failed" and c["failed_mode"] == "0.5"
    assert "oom_weights" in c["summary"] and c["remedy"] == "Offload more."


def test_verdict_failed_baseline() -> None:
    base = copy.deepcopy(BASE)
    base.update(status="timeout", reason="not ready after 600 s (--timeout)", phase="CUDA graphs")
    c = judge(base, None)
    assert c["status"] == "failed" and "baseline" in c["summary"] and "CUDA graphs" in c["summary"]


def test_verdict_inconclusive_when_loading_missing() -> None:
    base = _mode("0", 0.0, model_loading_gib=None)
    off = _mode("0.5", 0.5, model_loading_gib=None)
    off["analysis"]["offload_status"] = "unknown"
    c = judge(base, off)
    assert c["status"] == "inconclusive" and "missing" in c["summary"]


def test_verdict_tp_ranks_disagree() -> None:
    ranks_b = {f"Worker_TP{i}": {"offloaded_gib": None, "model_loading_gib": 0.58} for i in (0, 1)}
    ranks_o = {
        "Worker_TP0": {"offloaded_gib": 0.51, "model_loading_gib": 0.08},
        "Worker_TP1": {"offloaded_gib": None, "model_loading_gib": 0.58},
    }
    base = _mode("0", 0.0, ranks=ranks_b, model_loading_gib=0.58)
    off = _mode("0.5", 0.5, ranks=ranks_o, offloaded_gib=0.51, model_loading_gib=0.08)
    c = judge(base, off)
    assert c["status"] == "inconclusive" and "Worker_TP1" in c["summary"]
    assert c["ranks"]["Worker_TP0"]["status"] == "effective"
    assert c["ranks"]["Worker_TP1"]["status"] == "ignored"


def test_render_text_and_markdown() -> None:
    report = {
        "modes": [BASE, EFFECTIVE],
        "complete": True,
        "interrupted": False,
        "config": {"model": "m", "served_model_name": "m", "warmup": 1, "repeats": 5},
        "verdict": {
            "status": "effective",
            "title": "offload took effect",
            "summary": "S",
            "remedy": "",
            "links": [],
            "notes": ["N"],
        },
        "environment": {"VLLM_USE_V2_MODEL_RUNNER": "0"},
    }
    typed = CompareReport.from_dict(report)
    text = render_text(typed, "/out")
    assert "Verdict: OK offload took effect" in text and "0.51 GiB" in text
    assert "Model loading took" in text and "395 ms" in text
    md = render_markdown(typed)
    assert "**Verdict: `effective`**" in md and "| Model loading took |" in md
    json.dumps(report)  # the report is plain JSON


def test_link_is_charged_to_the_extra_offload_and_an_impossible_rate_is_no_bandwidth() -> None:
    """The H200 run: --baseline-gb 30 vs --offload-gb 40, 24.3 -> 29.3 s per 32 tokens.

    The old verdict divided the extra time into all 40.42 GiB ("about 278 GB/s"). Against the
    9.81 GiB that moved in addition, +156 ms per token would need 67 GB/s: more than the raw
    63 GB/s of PCIe gen5 x16, so it is reported as inconsistent, never as a bandwidth.
    """
    base = _mode(
        "30", 30.0, offloader="UVAOffloader", offloaded_gib=30.61, model_loading_gib=121.17
    )
    off = _mode("40", 40.0, offloader="UVAOffloader", offloaded_gib=40.42, model_loading_gib=111.36)
    for m, median in ((base, 24.3), (off, 29.3)):
        m["analysis"]["offload_status"] = "effective"
        m["latency"] = dict(m["latency"], n=1, ok=1, median_s=median)
    c = judge(base, off)
    assert c["status"] == "effective"
    perf = c["performance"]
    assert perf["offloaded_delta_gib"] == pytest.approx(9.81)
    assert perf["extra_ms_per_token"] == pytest.approx(156.25)
    assert perf["consistent"] is False and "implied_gbs" not in perf
    assert "not a bandwidth" in c["summary"] and "278" not in c["summary"]
    assert "the extra offloaded weights (9.81 GiB per GPU)" in c["summary"]
    assert any("1 measured request(s) per mode is too few" in n for n in c["notes"])


def test_a_possible_rate_on_the_difference_is_reported() -> None:
    base = _mode(
        "30", 30.0, offloader="UVAOffloader", offloaded_gib=30.61, model_loading_gib=121.17
    )
    off = _mode("40", 40.0, offloader="UVAOffloader", offloaded_gib=40.42, model_loading_gib=111.36)
    for m, median in ((base, 24.3), (off, 30.3)):
        m["analysis"]["offload_status"] = "effective"
        m["latency"] = dict(m["latency"], median_s=median)
    perf = judge(base, off)["performance"]
    # 9.81 GiB in 187.5 ms per token: 56 GB/s, below the raw 63 GB/s
    assert perf["consistent"] is True
    assert perf["implied_gbs"] == pytest.approx(9.81 * 2**30 / 0.1875 / 1e9, rel=0.01)


@pytest.mark.parametrize(
    ("extra", "own", "rest", "values"),
    [
        (
            ["--load-format", "dummy", "--max-model-len", "2048", "--enforce-eager"],
            {"max_model_len": None, "served_model_name": None},
            ["--load-format", "dummy", "--enforce-eager"],
            {"max_model_len": 2048, "served_model_name": None},
        ),
        (
            ["--served-model-name=big", "--max-model-len=4096"],
            {"max_model_len": 4096, "served_model_name": None},
            [],
            {"max_model_len": 4096, "served_model_name": "big"},
        ),
    ],
)
def test_same_for_every_mode_flags_after_dashdash_are_taken_as_compares(
    extra: list[str], own: dict[str, Any], rest: list[str], values: dict[str, Any]
) -> None:
    from vllm_offload_doctor.compare.config import absorb_passthrough

    assert absorb_passthrough(extra, own) == (rest, values)


@pytest.mark.parametrize(
    ("extra", "own", "message"),
    [
        (["--max-model-len", "2048"], {"max_model_len": 4096}, "contradicts"),
        (["--max-model-len", "lots"], {"max_model_len": None}, "not a whole number"),
        (["--served-model-name"], {"served_model_name": None}, "needs a value"),
    ],
)
def test_contradicting_or_broken_flags_after_dashdash(
    extra: list[str], own: dict[str, Any], message: str
) -> None:
    from vllm_offload_doctor.compare.config import absorb_passthrough

    with pytest.raises(DoctorError, match=message):
        absorb_passthrough(extra, own)


@pytest.mark.parametrize("v1_already", [False, True])
def test_the_h200_command_lines_are_valid(
    v1_already: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from vllm_offload_doctor.compare.cli import compare

    if v1_already:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    else:
        monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    args = (
        "--model /tmp/big --served-model-name big --offload-gb 32 --verify-fix --max-tokens 8 "
        f"--repeats 1 --warmup 0 --out {tmp_path / 'DIR'} --dry-run -- --load-format dummy "
        "--enforce-eager --max-model-len 2048 --attention-backend TRITON_ATTN"
    ).split()
    result = CliRunner().invoke(compare, args, standalone_mode=False)
    assert result.exception is None, result.output
    serve = [ln for ln in result.output.splitlines() if "vllm serve" in ln]
    assert len(serve) == (2 if v1_already else 3)
    for line in serve:
        assert line.count("--max-model-len 2048") == 1 and "--served-model-name big" in line
        assert line.endswith("--load-format dummy --enforce-eager --attention-backend TRITON_ATTN")
    assert serve[-1].startswith("VLLM_USE_V2_MODEL_RUNNER=0 vllm serve") is not v1_already
    assert not (tmp_path / "DIR").exists()
