"""`offload-doctor check` end to end: exit codes, JSON schema, text and Markdown output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import pytest
from fake_probe import H100, NVML, PY, WSL2, FakeProbe

from vllm_offload_doctor import redact
from vllm_offload_doctor.checks import Options, Status, run_checks
from vllm_offload_doctor.checks.context import GIB
from vllm_offload_doctor.checks.render import RENDERERS, render
from vllm_offload_doctor.cli import main
from vllm_offload_doctor.machine import early, probes
from vllm_offload_doctor.machine.ports import PortState
from vllm_offload_doctor.machine.probes import GpuProcess
from vllm_offload_doctor.output.formats import OutputFormat

ROOT = Path(__file__).resolve().parents[2]
STATUSES = {s.value for s in Status}


def use_probe(monkeypatch: pytest.MonkeyPatch, probe: FakeProbe) -> None:
    monkeypatch.setattr(probes, "RealProbe", lambda: probe)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["check", *args])
    out, err = capsys.readouterr()
    code = exc.value.code
    assert isinstance(code, int)
    return code, out, err


def assert_schema(data: dict[str, Any]) -> None:
    assert data["schema_version"] == 1
    assert isinstance(data["tool_version"], str)
    ids = [c["id"] for c in data["checks"]]
    assert len(ids) == len(set(ids))
    for c in data["checks"]:
        assert set(c) - {"data"} == {
            "id",
            "title",
            "status",
            "message",
            "details",
            "remedy",
            "links",
        }
        assert isinstance(c.get("data", {}), dict)
        assert c["status"] in STATUSES
        assert isinstance(c["details"], list) and isinstance(c["links"], list)
        assert all(link.startswith("https://") for link in c["links"])
    assert set(data["summary"]) == STATUSES
    assert sum(data["summary"].values()) == len(data["checks"])
    assert isinstance(data["facts"], dict)


# --- exit codes ------------------------------------------------------------------------


def test_healthy_exits_0_with_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_probe(monkeypatch, FakeProbe())
    code, out, _ = cli(capsys, "--format", "json", "--offload-gb", "4")
    assert code == 0
    data = json.loads(out)
    assert_schema(data)
    assert data["summary"]["fail"] == 0
    assert data["facts"]["interpreter"]["vllm_version"] == "0.33.0"


def test_failure_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    busy = PortState("127.0.0.1", 8000, False, pid=31337, process="python3")
    use_probe(monkeypatch, FakeProbe(port_state=busy))
    code, out, _ = cli(capsys)
    assert code == 1
    assert "[✗] Port: 127.0.0.1:8000 is in use by pid 31337 (python3)" in out


def test_warning_exits_0_unless_strict(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_probe(monkeypatch, FakeProbe(plat=WSL2))
    assert cli(capsys)[0] == 0
    assert cli(capsys, "--strict")[0] == 1


def test_nothing_checked_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    crash = {"platform", "interpreter", "nvml", "host_memory", "port", "environ"}
    use_probe(monkeypatch, FakeProbe(crash=crash))
    code, out, _ = cli(capsys, "--format", "json")
    assert code == 2
    assert json.loads(out)["summary"]["skip"] > 0


@pytest.mark.parametrize(
    "args",
    [
        ["--format", "xml"],
        ["--gpu-memory-utilization", "1.5"],
        ["--offload-gb", "-1"],
        ["--tensor-parallel-size", "0"],
        ["--port", "70000"],
        ["--python", "/no/such/python"],
    ],
)
def test_usage_errors_exit_2(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_probe(monkeypatch, FakeProbe())
    code, out, err = cli(capsys, *args)
    assert code == 2
    assert out == ""
    assert err


def test_options_reach_the_checks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    probe = FakeProbe(nvml_info=replace(NVML, gpus=(H100, replace(H100, index=1))))
    use_probe(monkeypatch, probe)
    (tmp_path / "config.json").write_text("{}")
    m = str(tmp_path)
    code, out, _ = cli(
        capsys, "--format", "json", "--cpu-offload-gb", "10", "-tp", "2", "--model", m,
        "--gpu-memory-utilization", "0.8", "--port", "9000", "--host", "0.0.0.0",
        "--max-model-len", "4096", "--gpu-memory-gib", "80", "--kv-cache-dtype", "fp8",
        "--link-gbs", "40",
    )  # fmt: skip
    data = json.loads(out)
    assert data["facts"]["options"] == {
        "offload_gb": 10.0,
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.8,
        "model": m,
        "max_model_len": 4096,
        "gpu_memory_gib": 80.0,
        "link_gbs": 40.0,
        "kv_cache_dtype": "fp8",
        "python": None,
        "host": "0.0.0.0",
        "port": 9000,
    }
    host = next(c for c in data["checks"] if c["id"] == "host_memory")
    assert "~28-31 GiB ((1.1-1.25 × 10 GiB + 3 GiB) × 2 GPUs) needed" in host["message"]
    fit = next(c for c in data["checks"] if c["id"] == "fit")
    assert fit["status"] == "warn"  # 8 GiB per GPU fits without offload: offload only costs speed
    assert "8.0 GiB of weights per GPU" in fit["message"]
    assert code == 0


# --- rendering -----------------------------------------------------------------------


def test_every_format_choice_has_a_renderer_and_renders() -> None:
    from vllm_offload_doctor.checks.cli import check

    option = next(p for p in check.params if p.name == "fmt")
    assert isinstance(option.type, click.Choice)
    assert [OutputFormat(c) for c in option.type.choices] == list(RENDERERS)
    report = run_checks(FakeProbe(), Options())
    for fmt in RENDERERS:
        assert render(report, fmt).strip()


@pytest.mark.parametrize(
    "model", ["/no/such/model/dir", "org/not-cached", "{empty}"], ids=["path", "repo", "no-config"]
)
def test_unreadable_model_fails_the_fit_check_and_the_others_run(
    model: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from vllm_offload_doctor.machine.modelsize import inspect_model

    probe = FakeProbe()
    probe.model_size = lambda m: inspect_model(m, os.environ, Path.home())  # type: ignore[method-assign]
    use_probe(monkeypatch, probe)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HOME", str(tmp_path))
    if model == "{empty}":
        model = str(tmp_path)
    code, out, err = cli(capsys, "--model", model, "--format", "json")
    assert code == 1
    assert err == ""
    checks = {c["id"]: c for c in json.loads(out)["checks"]}
    assert checks["fit"]["status"] == "fail"
    assert model in checks["fit"]["message"]
    assert checks["host_memory"]["status"] == "ok"


def test_list_shows_every_check_with_its_documentation(capsys: pytest.CaptureFixture[str]) -> None:
    from vllm_offload_doctor.checks import all_checks

    code, out, _ = cli(capsys, "--list", "-v")
    assert code == 0
    for c in all_checks():
        assert f"{c.id}  " in out or f"{c.id} " in out
        assert c.doc and c.doc.splitlines()[0] in out
    assert "--gpu-memory-gib" in out  # the fit check's documentation, in full with -v


def test_text_is_flutter_style_and_plain_when_not_a_tty(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    t4 = replace(H100, name="Tesla T4", compute_capability=(7, 5))
    use_probe(monkeypatch, FakeProbe(nvml_info=replace(NVML, gpus=(t4,))))
    code, out, _ = cli(capsys)
    lines = out.splitlines()
    assert lines[0].startswith("Doctor summary")
    assert "[✓] Operating system: Linux" in out
    assert "[!] GPU 0: Tesla T4: compute capability 7.5" in out
    assert "    → Serve with --dtype half." in out
    assert "[-] Model fit: no --model given" in out
    assert lines[-1] == "! Doctor found issues in 1 check: 0 failed, 1 warning (8 ok, 1 skipped)."
    assert "\x1b[" not in out
    assert "• https://" not in out  # links only with -v
    assert code == 0


def test_verbose_shows_details_and_links(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_probe(monkeypatch, FakeProbe(interp=replace(PY, vllm_version="0.27.1")))
    code, out, _ = cli(capsys, "-v")
    assert code == 1
    assert "    • interpreter: /opt/venv/bin/python" in out
    assert "    • https://github.com/vllm-project/vllm/issues/51396" in out
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in out


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_verbose_hides_a_url_password_holding_a_slash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    # Issue 20: `check -v` showed `https://user:Pa55/w0rd...@host` whole (the old URL pattern
    # stopped the password at `/`, then found no `@` and masked nothing).
    env = {
        "VLLM_MIRROR_URL": "https://mirror-user:Pa55/w0rdZq9@hf-mirror.acme.corp/x",
        "VLLM_PLUGIN_INDEX": "https://u:ab@cd/Kp7Wd2Lx@pypi.acme.corp/simple",
    }
    use_probe(monkeypatch, FakeProbe(env=env))
    _, out, err = cli(capsys, "-v", "--format", fmt)
    for piece in ("Pa55", "w0rdZq9", "Kp7Wd2Lx", "cd/"):
        assert piece not in out + err, (piece, out)
    assert out.count(":***@") >= 2 and "VLLM_PLUGIN_INDEX=https://" in out  # the rest stays


def test_color_only_when_asked() -> None:
    report = run_checks(FakeProbe(), Options())
    assert "\x1b[32m[✓]\x1b[0m" in render(report, OutputFormat.TEXT, color=True)
    assert "\x1b[" not in render(report, OutputFormat.TEXT, color=False)


def test_all_ok_summary_line() -> None:
    report = run_checks(FakeProbe(), Options())
    assert (
        render(report, OutputFormat.TEXT).splitlines()[-1] == "• No issues found! (9 ok, 1 skipped)"
    )


def test_markdown_hides_secrets_user_and_host_names(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(redact, "_host_names", lambda: ["gpu-node-17"])
    busy_gpu = replace(H100, memory_free=GIB, processes=(GpuProcess(1, "vllm|serve", None),))
    probe = FakeProbe(
        interp=replace(PY, executable="/home/alice/venvs/vllm/bin/python"),
        port_state=PortState("gpu-node-17", 8000, False, pid=5, process="python"),
        env={"VLLM_API_KEY": "s3cr3t-value-1234", "PYTORCH_CUDA_ALLOC_CONF": "token=abcd1234efgh"},
        nvml_info=replace(NVML, gpus=(busy_gpu,)),
    )
    use_probe(monkeypatch, probe)
    code, out, _ = cli(capsys, "--format", "markdown")
    assert code == 1
    assert "alice" not in out and "gpu-node-17" not in out
    assert "s3cr3t" not in out and "abcd1234efgh" not in out
    assert "/home/<user-1>/venvs" in out
    assert "| ❌ fail | Port | <host-1>:8000 is in use by pid 5 (python) |" in out
    assert "vllm\\|serve" in out  # a pipe cannot break the table
    assert out.count("<details>") == 1


# --- the real machine ----------------------------------------------------------------


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    return run_python("-m", "vllm_offload_doctor", *args)


def run_python(*args: str) -> subprocess.CompletedProcess[str]:
    """This interpreter on `args`, the checkout first on its path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_real_machine_smoke() -> None:
    proc = run_module("check", "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(proc.stdout)
    assert_schema(data)
    nvml = next(c for c in data["checks"] if c["id"] == "nvml")
    if nvml["status"] == "fail":  # no GPU here: a clear message, not a traceback
        assert proc.returncode == 1
        assert nvml["message"].startswith("no usable NVIDIA driver")
        assert "Traceback" not in proc.stderr


def test_check_never_imports_torch_vllm_or_httpx() -> None:
    code = (
        "import sys, atexit\n"
        "atexit.register(lambda: print('HEAVY', sorted(m for m in ('torch', 'vllm', 'httpx')"
        " if m in sys.modules), file=sys.stderr))\n"
        "from vllm_offload_doctor.cli import main\n"
        "main(['check', '--format', 'json'])\n"
    )
    proc = run_python("-c", code)
    assert "HEAVY []" in proc.stderr


def test_cli_import_stays_light() -> None:
    code = (
        "import sys, vllm_offload_doctor.cli\n"
        "print(sorted(m for m in ('pynvml', 'psutil', 'packaging') if m in sys.modules))\n"
    )
    proc = run_python("-c", code)
    assert proc.stdout.strip() == "[]", proc.stderr


def test_the_process_leaves_its_objects_to_the_exit() -> None:
    # The collector's passes at shutdown cost a sixth of check's time; frozen objects skip them.
    code = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0))\n"
        "sys.argv = ['offload-doctor', 'check', '--list']\n"
        "from vllm_offload_doctor.__main__ import main\n"
        "main()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "frozen at exit: True"


@pytest.mark.parametrize(
    ("argv", "begins"),
    [
        (["check"], True),
        (["check", "--format", "json", "--offload-gb", "4"], True),
        (["check", "--list"], False),
        (["check", "--help"], False),
        (["analyze", "x.log"], False),
    ],
)
def test_the_console_script_begins_nvml_before_the_cli_for_check(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], begins: bool
) -> None:
    from vllm_offload_doctor import __main__ as entry
    from vllm_offload_doctor import cli as cli_module

    order: list[str] = []
    monkeypatch.setattr(early, "start_nvml", lambda: order.append("nvml"))
    monkeypatch.setattr(cli_module, "main", lambda: order.append("cli"))
    monkeypatch.setattr(sys, "argv", ["offload-doctor", *argv])
    entry.main()
    assert order == (["nvml", "cli"] if begins else ["cli"])
