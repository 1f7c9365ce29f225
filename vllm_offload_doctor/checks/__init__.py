"""`check`'s preconditions for CPU weight offloading: one module per check, run in a fixed order.

Each check reads the machine only through the `Probe` in its `Context`, never prints, and returns
`CheckResult`s made with the `Result` it is given; `run_checks` runs them all: a probe that could not
run (ProbeError, OSError) makes its check a SKIP, any other exception is a BUG of ours, shown with the link
to report it. To add one: write `checks/<name>.py` whose docstring tells the user what it
checks (`offload-doctor check --list -v` prints it), decorate `def check_<name>(ctx: Context, r:
Result)` with `@register("<id>", "<Title>")`, add the module's name to `MODULES` below (that sets its
place in the report), and test it in `tests/checks/` through the `FakeProbe`. A new probe
answer goes in `probes.Probe`, `RealProbe`, the `FakeProbe` and a cached property of `Context`.

Importing this package is cheap (the renderers need only the result model); the check modules are
imported on first use.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING

from vllm_offload_doctor.checks.model import CheckResult, Options, Report, Result, Status, worst

if TYPE_CHECKING:
    from vllm_offload_doctor.checks.registry import Check
    from vllm_offload_doctor.machine.probes import Probe

__all__ = [
    "MODULES",
    "CheckResult",
    "Options",
    "Report",
    "Result",
    "Status",
    "all_checks",
    "run_checks",
    "worst",
]

# The check modules, in the order of the report; importing one registers its checks.
MODULES = ("platform", "python_vllm", "gpu", "host_memory", "fit", "port", "env")


@cache
def all_checks() -> tuple[Check, ...]:
    """Every registered check, in report order (modules in `MODULES` order, then file order)."""
    from vllm_offload_doctor.checks.registry import REGISTERED

    for name in MODULES:
        importlib.import_module(f"{__name__}.{name}")
    return tuple(sorted(REGISTERED, key=lambda c: MODULES.index(c.module)))


def run_checks(probe: Probe, options: Options) -> Report:
    """Run every check; one that cannot probe is a SKIP with the reason, one that crashes a BUG."""
    from vllm_offload_doctor.checks.context import Context
    from vllm_offload_doctor.errors import ProbeError

    ctx = Context(probe, options)
    with ctx.prefetching():
        checks = all_checks()  # imported while the probes wait on the machine
    results: list[CheckResult] = []
    for check in checks:
        r = check.result()
        try:
            out = check.fn(ctx, r)
        except (ProbeError, OSError) as exc:
            out = r.skip(f"could not check: {str(exc) or type(exc).__name__}")
        except Exception as exc:
            out = r.bug(exc)
        results.extend(out if isinstance(out, list) else [out])
    return Report(checks=tuple(results), facts=ctx.facts())
