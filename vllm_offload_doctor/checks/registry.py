"""The registry of checks: a check module joins it with `@register`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from vllm_offload_doctor.checks.context import Context
from vllm_offload_doctor.checks.model import CheckResult, Result

CheckFn = Callable[[Context, Result], "CheckResult | list[CheckResult]"]


@dataclass(frozen=True, slots=True)
class Check:
    id: str
    title: str
    fn: CheckFn
    module: str  # the check module's name inside the package
    doc: str  # the check module's docstring: its user documentation

    def result(self) -> Result:
        return Result(self.id, self.title)


REGISTERED: list[Check] = []


def register(check_id: str, title: str) -> Callable[[CheckFn], CheckFn]:
    """Add a check; `checks.MODULES` orders the modules, a module's checks run in file order."""

    def add(fn: CheckFn) -> CheckFn:
        if any(c.id == check_id for c in REGISTERED):
            raise ValueError(f"check id {check_id!r} registered twice")
        module = sys.modules[fn.__module__]
        name = fn.__module__.rpartition(".")[2]
        REGISTERED.append(Check(check_id, title, fn, name, (module.__doc__ or "").strip()))
        return fn

    return add
