"""Host memory in compare: sampled through an injectable probe, and a silent death by it named."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest
from server_procs import free_port

from vllm_offload_doctor.compare.config import CompareConfig
from vllm_offload_doctor.compare.hostmem import (
    GIB,
    HostMemory,
    HostSample,
    HostSampler,
    RealHostProbe,
    largest_fitting,
    summarize,
)
from vllm_offload_doctor.compare.render import render_markdown, render_text, report_files
from vllm_offload_doctor.compare.run import CompareRun

FAKE = Path(__file__).resolve().parents[1] / "fake-vllm"


class FallingProbe:
    """A 16 GiB host whose available memory falls 5 GiB a sample while a server pid is seen."""

    def __init__(self) -> None:
        self.seen = 0

    def sample(self, pid: int | None) -> HostSample:
        if pid is None:
            return HostSample(14 * GIB, 16 * GIB, None, None)
        self.seen += 1
        rss = min(self.seen * 5, 15) * GIB
        return HostSample(max(16 * GIB - rss - GIB, 0), 16 * GIB, rss, rss - GIB)


class RoomyProbe:
    def sample(self, pid: int | None) -> HostSample:
        return HostSample(200 * GIB, 256 * GIB, 2 * GIB if pid else None, GIB if pid else None)


def run(
    tmp_path: Path, scenario: str, probe: object, monkeypatch: pytest.MonkeyPatch
) -> CompareRun:
    monkeypatch.setenv("FAKE_VLLM_SCENARIO", scenario)
    monkeypatch.setenv("FAKE_VLLM_HOST_GROW_MB", "16")
    cfg = CompareConfig(
        vllm_cmd=[sys.executable, str(FAKE)],
        model="/tmp/model",
        offload_gb=[8.0],
        port=free_port(),
        repeats=1,
        warmup=0,
        out_dir=tmp_path / "run",
        timeout_s=60,
        grace_s=2,
    )
    r = CompareRun(cfg, progress=io.StringIO(), host_probe=probe, files=report_files)  # type: ignore[arg-type]
    r.execute()
    return r


def test_host_oom_is_named_with_the_measured_rate_and_how_to_confirm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = run(tmp_path, "host-oom", FallingProbe(), monkeypatch)
    off = r.report.modes[1]
    assert off.analysis is not None and off.analysis.category == "oom_host"
    hm = off.host_memory
    assert hm is not None and hm.min_available_gib <= 0.8 and hm.total_gib == 16
    assert hm.rss_per_offloaded_gib == round(hm.peak_rss_gib / 8, 2)  # type: ignore[operator]
    text = render_text(r.report, str(r.cfg.out_dir), color=False)
    assert "OOM killer" in text and "dmesg" in text and "journalctl -k" in text
    assert f"--cpu-offload-gb {largest_fitting(16, hm.rss_per_offloaded_gib or 1):g}" in text
    saved = json.loads((tmp_path / "run" / "report.json").read_text())
    assert saved["modes"][1]["analysis"]["category"] == "oom_host"
    assert saved["modes"][1]["host_memory"]["min_available_gib"] == hm.min_available_gib
    row = next(ln for ln in text.splitlines() if ln.lstrip().startswith("host RSS peak"))
    assert f"{hm.peak_rss_gib:.2f} GiB" in row
    assert "host RSS / offloaded GiB" in text and f"{hm.min_available_gib:.2f}/16 GiB" in text
    md = render_markdown(r.report)
    assert "| host RSS peak |" in md
    assert "host memory" in md.lower() and f"{hm.peak_rss_gib:g}" in md


def test_the_same_death_with_memory_to_spare_is_not_called_host_oom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = run(tmp_path, "host-oom", RoomyProbe(), monkeypatch)
    off = r.report.modes[1]
    assert off.analysis is not None and off.analysis.category != "oom_host"
    assert off.host_memory is not None and off.host_memory.min_available_gib == 200
    assert "host memory did not run out (at least 200 of 256 GiB stayed available" in (
        off.analysis.summary
    )
    text = render_text(r.report, str(r.cfg.out_dir), color=False)
    assert "host memory did not run out" in text and "journalctl -k" in text


def test_sampler_records_every_sample_and_the_real_probe_sees_this_process() -> None:
    probe = RealHostProbe()
    s = probe.sample(os.getpid())
    assert s is not None and s.total > s.available > 0 and s.tree_rss and s.tree_rss > 0
    sampler = HostSampler(FallingProbe(), lambda: 1, every_s=0.01).start()
    import time

    time.sleep(0.2)
    hm = sampler.stop(4.0)
    assert hm is not None and hm.samples >= 5 and hm.peak_rss_gib == 15
    assert hm.rss_per_offloaded_gib == 3.75  # 15 GiB over 4


def test_exhausted_means_near_zero_available_or_near_the_limit() -> None:
    low = summarize([HostSample(GIB // 4, 64 * GIB, 10 * GIB, 0)], 8)
    near_limit = summarize([HostSample(40 * GIB, 64 * GIB, 19 * GIB, 0, 20 * GIB)], 8)
    fine = summarize([HostSample(40 * GIB, 64 * GIB, 10 * GIB, 0)], 8)
    assert low and low.exhausted and near_limit and near_limit.exhausted
    assert fine and not fine.exhausted
    assert HostMemory.from_dict(fine.to_dict()) == fine
