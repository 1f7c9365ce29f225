"""The platform check(s), through the fake probe."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fake_probe import LINUX, PY, WSL2, FakeProbe, one

from vllm_offload_doctor.checks import Status
from vllm_offload_doctor.checks.platform import kernel_tuple

# --- os and WSL ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("system", "status", "words"),
    [
        ("Linux", Status.OK, "Linux"),
        ("Windows", Status.FAIL, "native Windows"),
        ("Darwin", Status.FAIL, "macOS"),
        ("FreeBSD", Status.FAIL, "needs Linux"),
    ],
)
def test_os(system: str, status: Status, words: str) -> None:
    result = one("os", FakeProbe(plat=replace(LINUX, system=system)))
    assert result.status is status
    assert words in result.message
    if system == "Windows":
        assert "WSL2" in result.remedy


def test_wsl_native_linux_is_ok() -> None:
    assert one("wsl").status is Status.OK


def test_wsl_skipped_off_linux() -> None:
    assert one("wsl", FakeProbe(plat=replace(LINUX, system="Darwin"))).status is Status.SKIP


def test_wsl_markers_without_microsoft_kernel_warn() -> None:
    probe = FakeProbe(plat=replace(LINUX, wsl_markers=("WSL_INTEROP",)))
    assert one("wsl", probe).status is Status.WARN


def test_wsl2_without_pin_memory_variable_warns() -> None:
    result = one("wsl", FakeProbe(plat=WSL2))
    assert result.status is Status.WARN
    assert "VLLM_WSL2_ENABLE_PIN_MEMORY" in result.message
    assert result.remedy == "export VLLM_WSL2_ENABLE_PIN_MEMORY=1"


def test_wsl2_with_pin_memory_variable_ok() -> None:
    probe = FakeProbe(plat=WSL2, env={"VLLM_WSL2_ENABLE_PIN_MEMORY": "1"})
    result = one("wsl", probe)
    assert result.status is Status.OK
    assert any("half of physical RAM" in d for d in result.details)


def test_wsl2_offload_above_windows_pinned_cap_warns() -> None:
    probe = FakeProbe(plat=WSL2, env={"VLLM_WSL2_ENABLE_PIN_MEMORY": "1"})
    result = one("wsl", probe, offload_gb=70, tensor_parallel_size=2)  # 140 > 256 / 2
    assert result.status is Status.WARN
    assert "cap" in result.message
    assert one("wsl", probe, offload_gb=60, tensor_parallel_size=2).status is Status.OK


def test_wsl2_old_kernel_warns() -> None:
    plat = replace(WSL2, release="4.19.104-microsoft-standard")
    probe = FakeProbe(plat=plat, env={"VLLM_WSL2_ENABLE_PIN_MEMORY": "1"})
    result = one("wsl", probe)
    assert result.status is Status.WARN
    assert "4.19.121" in result.message
    assert "wsl --update" in result.remedy


def test_wsl1_fails() -> None:
    plat = replace(WSL2, release="4.4.0-19041-Microsoft")
    assert one("wsl", FakeProbe(plat=plat)).status is Status.FAIL


@pytest.mark.parametrize(
    ("version", "status"),
    [("0.16.0", Status.FAIL), ("0.20.2", Status.WARN), ("0.23.0", Status.WARN)],
)
def test_wsl2_with_older_vllm(version: str, status: Status) -> None:
    probe = FakeProbe(plat=WSL2, interp=replace(PY, vllm_version=version))
    assert one("wsl", probe).status is status


def test_kernel_tuple() -> None:
    assert kernel_tuple("5.15.153.1-microsoft-standard-WSL2") == (5, 15, 153, 1)
    assert kernel_tuple("4.19.121-microsoft-standard") >= (4, 19, 121)
    assert kernel_tuple("6.8.0+") == (6, 8)
