"""Many inputs on a pool of processes, one engine each; results come back in input order.

Each worker analyses a log and renders what the output format needs of it (the per-log text,
or for JSON the secret-scrubbed record), so the parent only prints: on two cores a batch runs about twice
as fast as in one process. A worker ignores SIGINT: Ctrl+C is the parent's to handle.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_offload_doctor.analyze.engine import Engine
from vllm_offload_doctor.analyze.logread import Source
from vllm_offload_doctor.analyze.model import Analysis
from vllm_offload_doctor.analyze.render import RENDERERS, Renderer
from vllm_offload_doctor.errors import InputError
from vllm_offload_doctor.output.formats import OutputFormat

MIN_PER_JOB = 4  # inputs per worker below which a pool costs more than it saves


@dataclass(frozen=True, slots=True)
class Job:
    """What every worker needs to analyse and render like the parent would."""

    rule_dirs: tuple[Path, ...]
    max_bytes: int | None
    fmt: OutputFormat
    renderer: Renderer
    several: bool


@dataclass(frozen=True, slots=True)
class Done:
    source: Source
    analysis: Analysis | None
    error: str | None = None  # the input could not be read (scrubbed by the caller)
    item: str | None = None  # the format's per-log text, rendered in the worker
    record: dict[str, Any] | None = None  # the scrubbed record, for json


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def workers_for(jobs: int | None, sources: Sequence[Source]) -> int:
    """How many processes: --jobs (default every core), fewer when the batch is small;
    1 when an input is stdin (it belongs to this process)."""
    if any(s.path is None for s in sources):
        return 1
    wanted = cpu_count() if jobs is None or jobs <= 0 else jobs
    return max(1, min(wanted, len(sources) // MIN_PER_JOB))


_JOB: Job | None = None
_ENGINE: Engine | None = None


def _init(job: Job) -> None:
    global _JOB, _ENGINE
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _JOB, _ENGINE = job, Engine(extra_rule_dirs=job.rule_dirs, max_bytes=job.max_bytes)


def _work(source: Source) -> Done:
    assert _JOB is not None and _ENGINE is not None
    return run_one(_ENGINE, _JOB, source)


def run_one(engine: Engine, job: Job, source: Source) -> Done:
    try:
        analysis = engine.analyze_source(source)
    except InputError as exc:
        return Done(source, None, str(exc))
    form = RENDERERS[job.fmt]
    item = form.item(job.renderer, analysis, job.several) if form.item is not None else None
    # Only the JSON document is built from records here; jsonl's item already holds its record.
    record = job.renderer.record(analysis) if job.fmt is OutputFormat.JSON else None
    return Done(source, analysis, item=item, record=record)


def analyze_all(
    engine: Engine, job: Job, sources: Iterable[Source], workers: int
) -> Iterator[Done]:
    """Each source's result, in input order, as soon as it and those before it are done."""
    if workers <= 1:
        for source in sources:
            yield run_one(engine, job, source)
        return
    import multiprocessing  # here: a single log's start-up never pays for them (~8 ms)
    from concurrent.futures import ProcessPoolExecutor

    # fork where the platform has it: the workers start with this process's imports.
    method = "fork" if sys.platform.startswith("linux") else None
    pool = ProcessPoolExecutor(workers, multiprocessing.get_context(method), _init, (job,))
    try:
        yield from pool.map(_work, sources, chunksize=8)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
