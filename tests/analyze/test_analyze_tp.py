"""Multi-rank logs: one offload figure per rank, and a verdict that says when ranks disagree."""

from __future__ import annotations

from vllm_offload_doctor.analyze.engine import analyze_lines
from vllm_offload_doctor.analyze.model import OffloadStatus

HEAD = [
    "(APIServer pid=10) INFO 11-29 15:16:40 [api_utils.py:339]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.25.1",
    "(APIServer pid=10) INFO 11-29 15:16:40 [api_utils.py:273] non-default args: "
    "{'model': '/m', 'tensor_parallel_size': 2, 'cpu_offload_gb': 4.0}",
]


def _rank(proc: str, offloaded: float | None, loading: float) -> list[str]:
    lines = []
    if offloaded is not None:
        lines.append(
            f"({proc}) INFO 11-29 15:17:11 [uva.py:58] Total CPU offloaded parameters: {offloaded}"
        )
    lines.append(
        f"({proc}) INFO 11-29 15:17:13 [gpu_model_runner.py:5306] "
        f"Model loading took {loading} GiB memory and 1.2 seconds"
    )
    return lines


def test_two_ranks_that_agree_give_one_figure_per_rank() -> None:
    lines = [
        *HEAD,
        "(Worker_TP0 pid=20) INFO 11-29 15:17:10 [base.py:123] Offloader set to UVAOffloader",
        *_rank("Worker_TP0 pid=20", 4.01, 11.5),
        *_rank("Worker_TP1 pid=21", 3.98, 11.6),
        "(APIServer pid=10) INFO:     Application startup complete.",
    ]
    a = analyze_lines(lines)
    assert a.offload.status is OffloadStatus.EFFECTIVE
    assert a.offload.offloaded_gib == 4.01
    assert not a.offload.ranks_disagree
    assert a.facts.ranks["Worker_TP0"].offloaded_gib == 4.01
    assert a.facts.ranks["Worker_TP1"].offloaded_gib == 3.98
    assert a.facts.tensor_parallel_size == 2


def test_ranks_that_disagree_are_reported() -> None:
    lines = [*HEAD, *_rank("Worker_TP0 pid=20", 4.0, 11.5), *_rank("Worker_TP1 pid=21", None, 15.5)]
    a = analyze_lines(lines)
    assert a.offload.ranks_disagree
    assert "disagree" in a.offload.explanation
    assert a.facts.ranks["Worker_TP1"].status is OffloadStatus.UNKNOWN


def test_ray_workers_are_told_apart_by_pid() -> None:
    lines = [
        *HEAD,
        *_rank("RayWorkerWrapper pid=31, ip=10.0.0.2", 4.0, 11.5),
        *_rank("RayWorkerWrapper pid=32, ip=10.0.0.3", 4.0, 11.5),
    ]
    a = analyze_lines(lines)
    assert set(a.facts.ranks) == {"RayWorkerWrapper pid=31", "RayWorkerWrapper pid=32"}
    assert a.offload.status is OffloadStatus.EFFECTIVE


def test_records_before_a_worker_is_named_join_its_rank() -> None:
    # Real vLLM 0.25.1 TP=2: the offloader line comes from "(Worker pid=N)" before it becomes Worker_TP0.
    lines = [
        *HEAD,
        "(Worker pid=20) INFO 11-29 16:30:02 [base.py:123] Offloader set to UVAOffloader",
        *_rank("Worker_TP0 pid=20", 0.41, 0.16),
        "(Worker_TP1 pid=21) INFO 11-29 16:30:03 [uva.py:58] Total CPU offloaded parameters: 0.41",
    ]
    a = analyze_lines(lines)
    assert set(a.facts.ranks) == {"Worker_TP0", "Worker_TP1"}
    assert a.facts.ranks["Worker_TP0"].offloader == "UVAOffloader"
    assert not a.offload.ranks_disagree
    assert a.offload.status is OffloadStatus.EFFECTIVE
