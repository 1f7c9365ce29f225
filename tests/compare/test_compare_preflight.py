"""compare's preflight: check's host budget and fit model for the modes about to run, asked before
any server starts; and the start-up timeout that grows with the offload."""

from __future__ import annotations

import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_compare_e2e import mode, run_compare

from vllm_offload_doctor.compare.config import DEFAULT_TIMEOUT_S, CompareConfig
from vllm_offload_doctor.compare.preflight import run_preflight
from vllm_offload_doctor.compare.render import report_files
from vllm_offload_doctor.compare.run import CompareRun, HostTooSmallError
from vllm_offload_doctor.machine.fit import GIB, model_shape
from vllm_offload_doctor.machine.modelsize import ModelSize
from vllm_offload_doctor.machine.probes import GpuInfo, HostMemory, NvmlInfo, PlatformInfo

FAKE = Path(__file__).resolve().parents[1] / "fake-vllm"
LINUX = PlatformInfo("Linux", "6.8.0", "x86_64", False)
WSL = PlatformInfo("Linux", "5.15.153.1-microsoft-standard-WSL2", "x86_64", True)
# The H200 host of the corpus log H-015 (`free -m` there: 128868 total, 128399 available): 112 GiB
# offloaded was killed by the OOM killer, 100 served at a 122.9 G peak.
H200_HOST = HostMemory(128868 << 20, 128399 << 20, 0, 0)
H200 = GpuInfo(0, "NVIDIA H200", (9, 0), int(139.8 * GIB), int(139 * GIB))


@dataclass
class Machine:
    mem: HostMemory = H200_HOST
    plat: PlatformInfo = LINUX
    gpus: tuple[GpuInfo, ...] = ()
    calls: list[str] = field(default_factory=list)

    def host_memory(self) -> HostMemory:
        self.calls.append("host_memory")
        return self.mem

    def platform(self) -> PlatformInfo:
        return self.plat

    def nvml(self) -> NvmlInfo:
        return NvmlInfo(gpus=self.gpus) if self.gpus else NvmlInfo(error="no NVML")


def cfg(*offload: float, **kw: object) -> CompareConfig:
    return CompareConfig(offload_gb=list(offload), model="/models/big", **kw)  # type: ignore[arg-type]


def test_the_h200_oom_offload_is_refused_and_the_one_that_served_is_flagged() -> None:
    pre = run_preflight(cfg(100, 112), Machine(), model_size=_no_model)
    verdicts = {m.offload_gb: m.verdict for m in pre.modes}
    assert verdicts == {100: "may not fit", 112: "does not fit"}
    assert pre.blocked == [112]
    assert pre.largest_offload_gib == 98  # (125.8 - 3) / 1.25
    text = "\n".join(pre.lines())
    assert "measured on an H200" in text  # the budget says where it comes from
    assert "offload 112 GiB: host needs ~126-143 GiB, does not fit" in text


def test_wsl_doubles_the_high_end() -> None:
    plain = run_preflight(cfg(60), Machine(), model_size=_no_model)
    wsl = run_preflight(cfg(60), Machine(plat=WSL), model_size=_no_model)  # up to 153 GiB
    assert plain.modes[0].verdict == "fits" and wsl.modes[0].verdict == "may not fit"
    assert any("WSL" in ln for ln in wsl.lines())


def test_start_up_time_and_timeout_grow_with_the_offload() -> None:
    pre = run_preflight(cfg(30, 100), Machine(), model_size=_no_model)
    by = {m.offload_gb: m for m in pre.modes}
    assert by[100].extra_load_s == pytest.approx(100 / 0.6)  # 174 s instead of ~25 on the H200
    assert by[100].timeout_s > by[30].timeout_s > DEFAULT_TIMEOUT_S
    assert by[100].timeout_s - DEFAULT_TIMEOUT_S >= 2 * by[100].extra_load_s - 1e-6
    assert cfg(100, timeout_s=60.0).timeout_for(100) == 60.0  # an explicit --timeout wins


def test_preflight_tells_the_least_offload_from_checks_fit_model() -> None:
    shape = model_shape(
        {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
         "num_key_value_heads": 8, "intermediate_size": 28672},
        "bfloat16",
    )  # fmt: skip
    size = ModelSize("/models/big", 152 * GIB, "index", False, (), "bfloat16", shape)
    pre = run_preflight(cfg(10, 40), Machine(gpus=(H200,)), model_size=lambda m: size)
    # 152 + KV(2048) + activation + 1 GiB against 0.92 x 139.8: about 27 GiB to offload
    assert pre.min_offload_gib is not None and 25 <= pre.min_offload_gib <= 30
    assert f"offload at least {pre.min_offload_gib} GiB per GPU; offload 10 GiB is too little" in (
        pre.fit_note
    )


def _no_model(model: str) -> ModelSize:
    from vllm_offload_doctor.errors import ProbeError

    raise ProbeError(f"{model} is not here")


def test_strict_stops_before_any_server_starts(tmp_path: Path) -> None:
    machine = Machine()
    c = CompareConfig(
        vllm_cmd=[sys.executable, str(FAKE)],
        model="/tmp/model",
        offload_gb=[112.0],
        out_dir=tmp_path / "run",
        strict=True,
    )
    r = CompareRun(c, progress=io.StringIO(), machine=machine, files=report_files)
    with pytest.raises(HostTooSmallError, match="cannot hold --cpu-offload-gb 112"):
        r.execute()
    assert r.report.modes == ()  # nothing was started
    saved = json.loads((tmp_path / "run" / "report.json").read_text())
    assert saved["preflight"]["modes"][0]["host"] == "does not fit"
    assert saved["preflight"]["host"]["largest_offload_gib"] == 98
    assert "cannot hold" in saved["verdict"]["summary"]


def test_strict_cli_exits_2_with_one_line_and_no_server(tmp_path: Path) -> None:
    # No host holds 100000 GiB of offload: the preflight refuses it on any machine.
    proc, report = run_compare(tmp_path, "effective", "--offload-gb", "100000", "--strict")
    assert proc.returncode == 2, proc.stderr
    assert report["modes"] == []
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("offload-doctor: error: the host cannot hold")
    )
    assert "preflight: offload 100000 GiB: host needs" in proc.stderr


def test_without_strict_the_run_goes_on_after_saying_so(tmp_path: Path) -> None:
    proc, report = run_compare(tmp_path, "effective", "--offload-gb", "100000")
    assert "running anyway (--strict stops here)" in proc.stderr
    assert mode(report, "100000")["status"] == "ok"  # the fake does not pin anything
    assert any(
        n.startswith("host memory, offload 100000 GiB: budget") for n in report["verdict"]["notes"]
    )
    assert "Preflight: host:" in proc.stdout


def test_every_report_format_shows_the_preflight() -> None:
    from vllm_offload_doctor.compare.html import render_compare_html
    from vllm_offload_doctor.compare.model import CompareReport
    from vllm_offload_doctor.compare.render import render_markdown, render_text
    from vllm_offload_doctor.compare.run import report_config

    c = cfg(112)
    pre = run_preflight(c, Machine(), model_size=_no_model)
    report = CompareReport("t", "now", report_config(c), {}, preflight=pre.to_dict())
    again = CompareReport.from_dict(json.loads(json.dumps(report.to_dict())))
    line = "offload 112 GiB: host needs ~126-143 GiB, does not fit"
    assert f"Preflight: {line}" in render_text(again)
    assert f"- {line}" in render_markdown(again)
    assert line in render_compare_html(again)


def test_each_mode_waits_the_timeout_of_its_own_offload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The offload mode that never gets ready is given up on at default + its offload's share."""
    import socket

    from vllm_offload_doctor.compare import config

    monkeypatch.setattr(config, "DEFAULT_TIMEOUT_S", 4.0)
    monkeypatch.setattr(config, "TIMEOUT_PER_OFFLOADED_S", 3.0)
    monkeypatch.setenv("FAKE_VLLM_SCENARIO", "hang")  # the offload mode never gets ready
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    c = CompareConfig(
        vllm_cmd=[sys.executable, str(FAKE)],
        model="/tmp/model",
        offload_gb=[0.5],
        port=port,
        repeats=1,
        warmup=0,
        grace_s=2,
        out_dir=tmp_path / "run",
    )
    r = CompareRun(c, progress=io.StringIO(), machine=Machine(), files=report_files)
    r.execute()
    off = r.report.modes[1]
    assert off.status == "timeout"
    assert off.reason == "not ready after 5.5 s (--timeout)"  # 4 + 3 x 0.5
