"""What a check returns: `Status`, `CheckResult`, the `Result` builder, the `Options` and the `Report`."""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from vllm_offload_doctor import __version__, exitcodes
from vllm_offload_doctor.links import DOCTOR_ISSUES
from vllm_offload_doctor.output.formats import SCHEMA_VERSION


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    BUG = "bug"  # the check itself crashed: a bug of the doctor, not a finding about the machine


_RANK = {Status.OK: 0, Status.SKIP: 0, Status.BUG: 0, Status.WARN: 1, Status.FAIL: 2}


def worst(*statuses: Status) -> Status:
    return max(statuses, key=lambda s: _RANK[s], default=Status.OK)


@dataclass(frozen=True, slots=True)
class CheckResult:
    id: str
    title: str
    status: Status
    message: str
    details: tuple[str, ...] = ()
    remedy: str = ""
    links: tuple[str, ...] = ()
    data: dict[str, Any] | None = None  # the check's figures, for JSON readers


@dataclass(frozen=True, slots=True)
class Result:
    """Builds the results of one check: `r.fail("message", details, remedy=..., links=...)`."""

    id: str
    title: str

    def make(
        self,
        status: Status,
        message: str,
        details: Iterable[str] = (),
        *,
        remedy: str = "",
        links: Iterable[str] = (),
        data: dict[str, Any] | None = None,
    ) -> CheckResult:
        return CheckResult(
            self.id, self.title, status, message, tuple(details), remedy, tuple(links), data
        )

    def ok(
        self,
        message: str,
        details: Iterable[str] = (),
        *,
        links: Iterable[str] = (),
        data: dict[str, Any] | None = None,
    ) -> CheckResult:
        return self.make(Status.OK, message, details, links=links, data=data)

    def warn(
        self,
        message: str,
        details: Iterable[str] = (),
        *,
        remedy: str = "",
        links: Iterable[str] = (),
        data: dict[str, Any] | None = None,
    ) -> CheckResult:
        return self.make(Status.WARN, message, details, remedy=remedy, links=links, data=data)

    def fail(
        self,
        message: str,
        details: Iterable[str] = (),
        *,
        remedy: str = "",
        links: Iterable[str] = (),
        data: dict[str, Any] | None = None,
    ) -> CheckResult:
        return self.make(Status.FAIL, message, details, remedy=remedy, links=links, data=data)

    def skip(
        self, message: str, details: Iterable[str] = (), *, data: dict[str, Any] | None = None
    ) -> CheckResult:
        return self.make(Status.SKIP, message, details, data=data)

    def bug(self, exc: BaseException) -> CheckResult:
        """The check crashed: say so, where, and where to report it."""
        where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        details = [f"raised at {Path(f.filename).name}:{f.lineno} in {f.name}" for f in where]
        return self.make(
            Status.BUG,
            f"this check crashed ({type(exc).__name__}: {exc}): a bug of offload-doctor, "
            "not a finding about this machine",
            details,
            remedy="Please report it with the output of `offload-doctor check --format "
            f"markdown`: {DOCTOR_ISSUES}",
            links=(DOCTOR_ISSUES,),
        )


@dataclass(frozen=True, slots=True)
class Options:
    """What the user plans to run: vLLM's own flags, plus what check itself needs."""

    offload_gb: float = 0.0
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None  # None: the installed vLLM's default
    model: str | None = None
    max_model_len: int | None = None  # None: the model's own
    gpu_memory_gib: float | None = None  # plan for a GPU of this size instead of the one here
    link_gbs: float | None = None  # host-to-GPU GB/s to price a token on (None: the GPU's, or PCIe)
    kv_cache_dtype: str | None = None  # vLLM's --kv-cache-dtype; None or "auto": the model's
    python: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000


@dataclass(frozen=True, slots=True)
class Report:
    checks: tuple[CheckResult, ...]
    facts: dict[str, Any] = field(default_factory=dict)
    tool_version: str = __version__

    def summary(self) -> dict[str, int]:
        return {s.value: sum(1 for c in self.checks if c.status is s) for s in Status}

    def exit_code(self, *, strict: bool = False) -> int:
        """0: ok or warnings only; 1: a failure (or a warning with strict); 3: a check crashed
        (a bug of ours); 2: nothing checked."""
        counts = self.summary()
        if counts["fail"] or (strict and counts["warn"]):
            return exitcodes.FOUND
        if counts["bug"]:
            return exitcodes.INTERNAL
        if not counts["ok"] and not counts["warn"]:
            return exitcodes.USAGE
        return exitcodes.OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool_version": self.tool_version,
            "checks": [_check_dict(c) for c in self.checks],
            "summary": self.summary(),
            "facts": self.facts,
        }


def _check_dict(c: CheckResult) -> dict[str, Any]:
    d = asdict(c)
    if d["data"] is None:  # only the checks that have figures carry them
        del d["data"]
    return d
