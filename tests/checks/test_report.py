"""The report check(s), through the fake probe."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from fake_probe import FakeProbe, run

from vllm_offload_doctor import exitcodes
from vllm_offload_doctor.checks import CheckResult, Options, Report, Status, run_checks
from vllm_offload_doctor.checks.render import render
from vllm_offload_doctor.links import DOCTOR_ISSUES
from vllm_offload_doctor.output.formats import OutputFormat

# --- whole report ------------------------------------------------------------------


def test_healthy_machine_is_all_ok_except_fit_skip() -> None:
    results = run()
    assert list(results) == [
        "os", "wsl", "python", "vllm", "nvml", "gpu[0]", "host_memory", "fit", "port", "env",
    ]  # fmt: skip
    assert {c.status for k, c in results.items() if k != "fit"} == {Status.OK}
    assert results["fit"].status is Status.SKIP


def test_each_probe_is_read_once() -> None:
    probe = FakeProbe()
    run(probe, model="x", offload_gb=4)
    assert all(n == 1 for n in probe.calls.values()), probe.calls


def test_a_probe_that_cannot_run_becomes_skip_with_reason_and_others_still_run() -> None:
    results = run(FakeProbe(crash={"nvml"}))
    assert results["nvml"].status is Status.SKIP
    assert "nvml probe could not run" in results["nvml"].message
    assert results["gpu"].status is Status.SKIP
    assert results["os"].status is Status.OK


def test_a_crashing_check_is_a_bug_with_the_report_link_not_a_skip() -> None:
    report = run_checks(FakeProbe(bugs={"nvml"}), Options())
    results = {c.id: c for c in report.checks}
    bug = results["nvml"]
    assert bug.status is Status.BUG
    assert (
        "RuntimeError: nvml probe exploded" in bug.message
        and "bug of offload-doctor" in bug.message
    )
    assert bug.links == (DOCTOR_ISSUES,) and DOCTOR_ISSUES in bug.remedy
    assert bug.details and bug.details[0].startswith("raised at fake_probe.py:")
    assert results["os"].status is Status.OK
    assert report.exit_code() == exitcodes.INTERNAL
    text = render(report, OutputFormat.TEXT)
    assert "[☠] NVIDIA driver (NVML): this check crashed" in text and "→ Please report it" in text
    assert text.splitlines()[-1].startswith("☠ No issues found, but a check crashed")
    assert "☠️ bug" in render(report, OutputFormat.MARKDOWN)


def test_exit_codes() -> None:
    ok = CheckResult("a", "A", Status.OK, "")
    warn = CheckResult("b", "B", Status.WARN, "")
    fail = CheckResult("c", "C", Status.FAIL, "")
    skip = CheckResult("d", "D", Status.SKIP, "")
    assert Report((ok, warn, skip)).exit_code() == 0
    assert Report((ok, warn)).exit_code(strict=True) == 1
    assert Report((ok, skip)).exit_code(strict=True) == 0
    assert Report((ok, fail)).exit_code() == 1
    assert Report((skip, skip)).exit_code() == 2
    bug = CheckResult("e", "E", Status.BUG, "")
    assert Report((ok, bug)).exit_code() == 3
    assert Report((fail, bug)).exit_code() == 1  # what was found outranks our crash


@dataclass
class MeetingProbe(FakeProbe):
    """The slow probes pass only once all of them are running at the same time."""

    meeting: threading.Barrier = field(default_factory=lambda: threading.Barrier(4, timeout=2))

    def _hit(self, name: str) -> None:
        super()._hit(name)
        if name in ("platform", "interpreter", "nvml", "host_memory"):
            self.meeting.wait()


def test_the_slow_probes_run_together() -> None:
    # NVML, vLLM's Python, uname (platform) and /proc each wait on the machine: one at a time,
    # check would take the sum of their waits.
    probe = MeetingProbe()
    results = run(probe)
    assert {c.status for c in results.values()} <= {Status.OK, Status.SKIP}, results
    assert all(probe.calls[n] == 1 for n in ("platform", "interpreter", "nvml", "host_memory"))


def test_every_probe_crashing_exits_2() -> None:
    everything = {"platform", "interpreter", "nvml", "host_memory", "port", "environ"}
    report = run_checks(FakeProbe(crash=everything), Options())
    assert {c.status for c in report.checks} == {Status.SKIP}
    assert report.exit_code() == 2


def test_json_dict_schema() -> None:
    report = run_checks(FakeProbe(), Options(offload_gb=2))
    data = report.to_dict()
    assert data["schema_version"] == 1
    assert set(data) == {"schema_version", "tool_version", "checks", "summary", "facts"}
    assert set(data["checks"][0]) == {
        "id", "title", "status", "message", "details", "remedy", "links",
    }  # fmt: skip
    assert data["summary"] == {"ok": 9, "warn": 0, "fail": 0, "skip": 1, "bug": 0}  # a new key
    assert data["facts"]["nvml"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert data["facts"]["options"]["offload_gb"] == 2
