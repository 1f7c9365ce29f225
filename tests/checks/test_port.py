"""The port check(s), through the fake probe."""

from __future__ import annotations

from fake_probe import FakeProbe, one

from vllm_offload_doctor.checks import Status
from vllm_offload_doctor.machine.ports import PortState

# --- port ------------------------------------------------------------------------------


def test_port_free_ok() -> None:
    assert one("port").status is Status.OK


def test_busy_port_fails_and_names_holder() -> None:
    busy = PortState("127.0.0.1", 8000, False, pid=777, process="vllm")
    result = one("port", FakeProbe(port_state=busy))
    assert result.status is Status.FAIL
    assert "pid 777 (vllm)" in result.message
    assert "already be running" in result.message


def test_port_that_cannot_be_tested_skips() -> None:
    err = OSError(99, "Cannot assign requested address")
    result = one("port", FakeProbe(port_state=err), host="10.9.9.9")
    assert result.status is Status.SKIP
    assert "Cannot assign requested address" in result.message
