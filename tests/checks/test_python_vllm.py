"""The python vllm check(s), through the fake probe."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fake_probe import PY, FakeProbe, one, run

from vllm_offload_doctor.checks import Status
from vllm_offload_doctor.machine.probes import (
    InterpreterInfo,
)

# --- Python and vLLM -------------------------------------------------------------------


def test_python_in_requires_python_ok() -> None:
    result = one("python")
    assert result.status is Status.OK
    assert "3.12.3" in result.message
    assert "interpreter: /opt/venv/bin/python" in result.details


def test_python_outside_requires_python_fails() -> None:
    result = one("python", FakeProbe(interp=replace(PY, python_version="3.10.12")))
    assert result.status is Status.FAIL
    assert ">=3.11" in result.message


def test_python_without_vllm_judged_against_current_vllm() -> None:
    interp = replace(PY, python_version="3.10.12", vllm_version=None, vllm_requires_python=None)
    result = one("python", FakeProbe(interp=interp))
    assert result.status is Status.WARN
    assert "current vLLM" in result.message


def test_python_interpreter_that_cannot_run_fails() -> None:
    interp = InterpreterInfo("/gone/python", "--python", error="cannot run it: No such file")
    results = run(FakeProbe(interp=interp))
    assert results["python"].status is Status.FAIL
    assert results["vllm"].status is Status.SKIP


def test_vllm_missing_fails() -> None:
    result = one("vllm", FakeProbe(interp=replace(PY, vllm_version=None)))
    assert result.status is Status.FAIL
    assert "not installed" in result.message


@pytest.mark.parametrize(
    ("version", "env", "status"),
    [
        ("0.33.0", None, Status.OK),
        ("0.28.0", "1", Status.OK),
        ("0.27.1", None, Status.FAIL),
        ("0.25.0", "1", Status.FAIL),
        ("0.27.1", "0", Status.OK),
        ("0.23.0", None, Status.WARN),
        ("0.23.0", "0", Status.OK),
        ("0.19.0", None, Status.OK),
        ("0.19.0", "1", Status.FAIL),
        ("0.14.0", None, Status.WARN),
        ("0.8.5", None, Status.WARN),
        ("0.27.1.dev3+gabc", None, Status.FAIL),
    ],
)
def test_vllm_version_advice(version: str, env: str | None, status: Status) -> None:
    probe = FakeProbe(
        interp=replace(PY, vllm_version=version),
        env={"VLLM_USE_V2_MODEL_RUNNER": env} if env is not None else {},
    )
    result = one("vllm", probe)
    assert result.status is status, result.message
    if status is Status.FAIL:
        assert "https://github.com/vllm-project/vllm/issues/51396" in result.links
        assert "https://github.com/vllm-project/vllm/pull/51413" in result.links
        assert "0.28.0" in result.remedy


def test_vllm_unparseable_version_warns() -> None:
    assert one("vllm", FakeProbe(interp=replace(PY, vllm_version="banana"))).status is Status.WARN


def test_vllm_reports_torch() -> None:
    assert "torch 2.14.0" in one("vllm").details


# --- whose Python: vLLM's, found for the doctor in its own environment ----------------------

OWN = InterpreterInfo(
    "/home/u/.local/share/pipx/venvs/vllm-offload-doctor/bin/python",
    "this interpreter (no vllm on PATH)",
    python_version="3.12.3",
    own=True,
)


def test_the_doctors_own_python_is_never_taken_for_vllms() -> None:
    results = run(FakeProbe(interp=OWN))
    python, vllm = results["python"], results["vllm"]
    assert python.status is Status.SKIP and "no `vllm` on PATH" in python.message
    assert vllm.status is Status.FAIL and "vLLM not found" in vllm.message
    # No advice to install vLLM into the doctor's private environment.
    assert "pip install" not in vllm.remedy and "--python" in vllm.remedy
    assert OWN.executable not in vllm.remedy


def test_the_doctors_own_python_with_vllm_is_vllms() -> None:
    """Installed beside vLLM (same venv, not activated): that interpreter is vLLM's."""
    own = replace(OWN, vllm_version="0.33.0", vllm_requires_python=">=3.11,<3.15")
    python = one("python", FakeProbe(interp=own))
    assert python.status is Status.OK
    assert python.message.startswith("Python 3.12.3 (offload-doctor's own) meets vLLM 0.33.0")


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("shebang of /opt/venv/bin/vllm", "behind `vllm` on PATH"),
        ("--python", "--python"),
    ],
)
def test_the_python_line_says_how_the_interpreter_was_found(source: str, said: str) -> None:
    python = one("python", FakeProbe(interp=replace(PY, source=source)))
    assert python.status is Status.OK and f"Python 3.12.3 ({said}) meets" in python.message


def test_a_chosen_python_without_vllm_is_told_how_to_install_into_it() -> None:
    vllm = one("vllm", FakeProbe(interp=replace(PY, vllm_version=None, source="--python")))
    assert vllm.remedy.startswith(f"{PY.executable} -m pip install vllm")
