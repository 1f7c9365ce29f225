"""A model that does not fit without offload: verdicts from the real H200 bisection logs.

The logs in fixtures/h200-compare/big-model-bisect/ are vLLM 0.25.1 (V1 runner) loading the
151.8 GiB section-6 model with --max-model-len 2048: offload 25 leaves -0.03 GiB for the KV cache,
26 leaves 0.42 GiB of the 0.7 GiB one request needs, 27 serves.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from vllm_offload_doctor.analyze.model import Category, Facts, OffloadStatus, Severity
from vllm_offload_doctor.compare.decide import (
    FitInputs,
    compare_pair,
    decide,
    needed_offload,
    out_of_memory,
)
from vllm_offload_doctor.compare.logscan import read_mode_log
from vllm_offload_doctor.compare.model import (
    CompareStatus,
    ModeResult,
    ModeStatus,
    Role,
)
from vllm_offload_doctor.compare.records import (
    GpuDevice,
    GpuSnapshot,
    HostRss,
    Latency,
    ModeAnalysis,
    Pcie,
    log_facts_dict,
)

BISECT = Path(__file__).resolve().parents[2] / "fixtures" / "h200-compare" / "big-model-bisect"
FIT = FitInputs(weights_gib=None, util=0.92, max_model_len=2048)


def from_log(path: Path, gb: float, status: ModeStatus) -> ModeResult:
    analysis, facts, last = read_mode_log(path, path.name)
    return ModeResult(
        label=f"{gb:g}",
        offload_gb=gb,
        role=Role.BASELINE if gb == 0 else Role.OFFLOAD,
        command=("vllm", "serve", "/tmp/big"),
        log=path.name,
        status=status,
        analysis=analysis,
        log_facts=facts,
        last_error_line=last,
    )


def weights_oom_baseline() -> ModeResult:
    """Offload 0 of the same model: the weights do not load (the fake's real-format OOM)."""
    return ModeResult(
        label="0",
        offload_gb=0.0,
        role=Role.BASELINE,
        command=("vllm", "serve", "/tmp/big"),
        log="mode-0.log",
        status=ModeStatus.EXITED,
        analysis=ModeAnalysis(
            Category.OOM_WEIGHTS,
            "OOM003",
            "The weights do not fit in GPU memory",
            "CUDA out of memory while loading the weights.",
            Severity.ERROR,
            "",
            (),
            OffloadStatus.NOT_REQUESTED,
            "",
            False,
        ),
        log_facts=Facts(vllm_version="0.25.1", model_runner="v1"),
    )


def test_kv_shortfall_figures_are_facts_of_the_log() -> None:
    _, facts, _ = read_mode_log(BISECT / "bisect-26.log", "bisect-26.log")
    assert (facts.kv_needed_gib, facts.kv_available_gib) == (0.7, 0.42)
    assert facts.oom_tried_gib is None  # no CUDA OOM in a KV shortfall
    assert log_facts_dict(facts)["oom"] == {
        "tried_gib": None,
        "total_gib": None,
        "free_gib": None,
        "in_use_gib": None,
        "kv_needed_gib": 0.7,
        "kv_available_gib": 0.42,
    }
    _, served, _ = read_mode_log(BISECT / "bisect-27.log", "bisect-27.log")
    assert "oom" not in log_facts_dict(served)


RECORDED = sorted(
    (run, m["log"], m["log_facts"].get("oom"))
    for run in (BISECT.parent).glob("*/")
    if (run / "report.json").exists()
    for m in json.loads((run / "report.json").read_text())["modes"]
    if m.get("log_facts") and (run / m["log"]).exists()
)


def test_there_are_recorded_oom_figures() -> None:
    assert sum(1 for *_, oom in RECORDED if oom) >= 3


@pytest.mark.parametrize(("run", "log", "oom"), RECORDED, ids=lambda v: getattr(v, "name", None))
def test_oom_figures_match_what_reports_recorded(run: Path, log: str, oom: object) -> None:
    # These report.json files were written while compare read the figures from the raw log with
    # its own regex; the engine's facts give the same figures.
    _, facts, _ = read_mode_log(run / log, log)
    assert log_facts_dict(facts).get("oom") == oom


@pytest.mark.parametrize("n", [25, 26])
def test_offload_that_loads_but_leaves_no_kv_room_is_a_memory_failure(n: int) -> None:
    off = from_log(BISECT / f"bisect-{n}.log", float(n), ModeStatus.EXITED)
    assert out_of_memory(off)
    assert off.log_facts is not None and off.log_facts.offloaded_gib


def test_26_is_not_enough_and_the_estimate_names_27() -> None:
    off = from_log(BISECT / "bisect-26.log", 26.0, ModeStatus.EXITED)
    c = compare_pair(weights_oom_baseline(), off, FIT)
    assert c.status == CompareStatus.FAILED and c.finding.title == "not enough offload"
    # offloaded 26 + (0.7 needed - 0.42 left); the bisection found 27 is the smallest that serves
    assert c.needed_gib == pytest.approx(26.28)
    assert math.ceil(c.needed_gib or 0) == 27
    assert "Try --offload-gb 27." in c.finding.summary and "27 or more" in c.finding.remedy
    assert "0.28 GiB short" in c.finding.summary
    assert "Without offload the model does not load: the weights do not fit" in c.finding.summary
    assert "26.16 GiB offloaded" in c.finding.summary


def test_25_gives_a_lower_bound_that_the_bisection_respects() -> None:
    off = from_log(BISECT / "bisect-25.log", 25.0, ModeStatus.EXITED)
    need = needed_offload(off, None, 0.92, 2048)
    assert need is not None and need.lower_bound
    assert need.gib == pytest.approx(25.03)
    assert need.gib < 27  # a lower bound below the measured minimum
    assert "More than 25.03 GiB" in need.words()
    assert "max-model-len 2048" in need.words()


def _served(mode: ModeResult, median_s: float, tokens: int, n: int) -> ModeResult:
    from vllm_offload_doctor.compare.records import AnswersMatched, Served

    gpu = GpuSnapshot(
        True,
        None,
        (GpuDevice(0, "NVIDIA H200", 140_000, 143_771, (), None, 0, Pcie(5, 16, 5, 16, 63.0)),),
    )
    return replace(
        mode,
        status=ModeStatus.OK,
        served=Served(
            processes=(),
            gpu=gpu,
            host_rss=HostRss(30_000.0, ()),
            server_version="0.25.1",
            metrics=None,
            info_errors=None,
            warmup_requests=(),
            requests=(),
            latency=Latency(n, n, median_s, median_s, median_s, median_s, None, float(tokens)),
            answers=(),
            answers_matched=AnswersMatched(0, 0),
        ),
    )


def test_27_makes_the_model_fit_with_cost_and_link() -> None:
    off = _served(from_log(BISECT / "bisect-27.log", 27.0, ModeStatus.OK), 4.8, 8, 1)
    c = compare_pair(weights_oom_baseline(), off, FIT)
    assert c.status == CompareStatus.EFFECTIVE
    assert c.finding.title == "offload 27 GiB makes the model fit"
    s = c.finding.summary
    assert "--cpu-offload-gb 27 makes it fit" in s and "27.34 GiB per GPU" in s
    assert "600 ms per output token" in s  # 4.8 s / 8 tokens
    assert "The link allows" in s and "PCIe gen5 x16" in s
    perf = c.performance
    assert perf is not None and perf.consistent is True
    # 27.34 GiB at the raw 63 GB/s is at least 466 ms per token; 600 ms is above that floor
    assert perf.link_floor_ms_per_token == pytest.approx(27.34 * 2**30 / 63e9 * 1e3, rel=0.01)
    assert any("too few" in n for n in c.finding.notes)  # one request per mode
    v = decide([c], served_modes=1, note="nvidia-smi note")
    assert v.status == CompareStatus.EFFECTIVE
    assert "nvidia-smi note" not in v.finding.notes  # memory is not compared with one mode


def test_baseline_with_offload_in_the_wording() -> None:
    base = replace(from_log(BISECT / "bisect-25.log", 25.0, ModeStatus.EXITED), role=Role.BASELINE)
    off = _served(from_log(BISECT / "bisect-27.log", 27.0, ModeStatus.OK), 4.8, 8, 5)
    c = compare_pair(base, off, FIT)
    assert c.status == CompareStatus.EFFECTIVE
    assert c.finding.summary.startswith(
        "With --cpu-offload-gb 25 (the baseline) the model does not load: "
    )
    assert "KV" in c.finding.summary.split(".")[0]


@pytest.mark.parametrize(
    ("category", "ready", "runs_offload"),
    [
        ("oom_weights", False, True),
        ("oom_kv_cache", False, True),
        ("oom_runtime", False, True),  # e.g. an OOM while profiling, before the server is ready
        ("oom_runtime", True, False),
        ("oom_gpu_util", False, False),  # another process holds the memory
        ("bad_args", False, False),
        ("model_download", False, False),
    ],
)
def test_which_baseline_failures_offload_can_change(
    category: str, ready: bool, runs_offload: bool
) -> None:
    base = weights_oom_baseline()
    assert base.analysis is not None and base.log_facts is not None
    base = replace(
        base,
        analysis=replace(base.analysis, category=Category(category)),
        log_facts=replace(base.log_facts, reached_ready=ready),
    )
    assert out_of_memory(base) is runs_offload


REAL_V2 = BISECT.parent / "needs-offload-v2-default"


def test_real_v2_runner_logs_say_ignored_not_failed() -> None:
    """vLLM 0.25.1's default (V2) runner on the H200: offload 0 and offload 32 both die loading the weights."""
    base = from_log(REAL_V2 / "mode-0.log", 0.0, ModeStatus.EXITED)
    off = from_log(REAL_V2 / "mode-32.log", 32.0, ModeStatus.EXITED)
    assert base.analysis is not None and base.analysis.category is Category.OOM_WEIGHTS
    assert out_of_memory(base)
    c = compare_pair(base, off, FIT)
    assert c.status == CompareStatus.IGNORED
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in c.finding.remedy


def test_compare_estimates_the_need_with_checks_fit_model() -> None:
    """One fit model: compare's estimate for a model that did not load is check's plan."""
    import json

    from vllm_offload_doctor.machine.fit import GIB, model_shape, plan

    cfg = json.loads((BISECT / "big-config.json").read_text())
    shape = model_shape(cfg, cfg.get("torch_dtype"))
    weights = 151.78
    base = weights_oom_baseline()
    off = replace(base, log_facts=replace(base.log_facts or Facts(), gpu_total_gib=139.8))
    for length in (2048, 32768):  # the KV cache of one request grows with --max-model-len
        need = needed_offload(off, weights, 0.92, length, shape, 1)
        p = plan(
            weights * GIB, shape, tp=1, gpu_total=139.8 * GIB, utilization=0.92,
            max_model_len=length,
        )  # fmt: skip
        assert need is not None and not need.lower_bound
        assert need.gib == pytest.approx((p.to_offload or 0) / GIB, abs=0.05)
        assert need.flag == p.min_offload_gib
        assert "KV cache for one request of max-model-len" in need.why
    assert needed_offload(off, weights, 0.92, 2048, shape, 1).flag in (27, 28)  # type: ignore[union-attr]
