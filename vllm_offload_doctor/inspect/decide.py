"""The verdict: does each rank's shared memory hold what `--cpu-offload-gb` asked for?

Measured on an H200 (vLLM 0.25.1, --cpu-offload-gb 0.5): EngineCore RssShmem 63,752 kB when V2
ignored the flag, 672,008 kB when V1 offloaded 0.51 GiB. A server holds well under
BASELINE_MAX_GIB of shared memory without offload.
"""

from __future__ import annotations

from vllm_offload_doctor import runner
from vllm_offload_doctor.inspect.model import (
    Inspection,
    ProcFacts,
    RankResult,
    ServerFacts,
    Verdict,
)
from vllm_offload_doctor.machine.pcie import PRACTICAL_FRACTION, link_bandwidth_gbs, step_cost_ms

BASELINE_GIB = 63_752 / 2**20  # shared memory of a rank that offloads nothing (measured)
BASELINE_MAX_GIB = 0.25  # above this, without offload requested, something else shares memory
EFFECTIVE_FRACTION = 0.5  # held >= this share of the request: in effect
IGNORED_FRACTION = 0.2  # held < this share of the request: ignored
FIX = (
    "restart with VLLM_USE_V2_MODEL_RUNNER=0 (the V1 runner honours the flag; 0.22-0.27.x) "
    "or upgrade to vLLM >= 0.28.0"
)


def rank_procs(facts: ServerFacts) -> list[ProcFacts]:
    """The processes that hold weights: the TP workers, else EngineCore (TP 1 runs in it)."""
    workers = [p for p in facts.procs if p.role.startswith("Worker")]
    if workers:
        return sorted(workers, key=lambda p: p.role)
    return [p for p in facts.procs if p.role.startswith("EngineCore")]


def runner_explanation(version_text: str | None, env_v2: str | None) -> tuple[str, str | None]:
    """Why the runner ignored the flag, and the fix, from the version and VLLM_USE_V2_MODEL_RUNNER."""
    from packaging.version import InvalidVersion, Version  # here: the CLI's import stays light

    try:
        version = Version(version_text) if version_text else None
    except InvalidVersion:
        version = None
    if version is None:
        return (
            f"the vLLM version is unknown; {runner.WINDOW} ignore the flag under Model Runner V2",
            FIX,
        )
    if runner.ignores_under_v2(version):
        if env_v2 == "1":
            why = "VLLM_USE_V2_MODEL_RUNNER=1 selects Model Runner V2"
        elif env_v2 == "0":
            return (
                f"vLLM {version_text} with VLLM_USE_V2_MODEL_RUNNER=0 should offload; "
                "nothing known explains it: run `offload-doctor analyze` on its log",
                None,
            )
        elif version >= Version("0.25"):
            why = "Model Runner V2 is the default for dense models from 0.25"
        elif version >= runner.V1_ESCAPE_FROM:
            why = "Model Runner V2 is the default for some architectures from 0.22"
        else:
            why = "Model Runner V2 was selected"
        return (
            f"vLLM {version_text} silently ignores --cpu-offload-gb under Model Runner V2 "
            f"(0.12.0-0.27.1): {why}",
            FIX,
        )
    return (
        f"vLLM {version_text} is outside the known Model Runner V2 window (0.12.0-0.27.1); "
        "run `offload-doctor analyze` on its log",
        None,
    )


def decide(
    facts: ServerFacts,
    host_available: int | None = None,
    link: tuple[int | None, int | None] = (None, None),
) -> Inspection:
    requested = facts.offload_gb
    version = facts.vllm_version or (facts.http.version if facts.http else None)
    if facts.vllm_version is None and version:
        facts.vllm_version, facts.version_source = version, "/version"
    avail = round(host_available / 2**30, 2) if host_available is not None else None
    if facts.error:
        return Inspection(facts, Verdict.CANNOT_TELL, facts.error, host_available_gib=avail)
    if not requested or requested <= 0:
        return Inspection(
            facts,
            Verdict.NOT_REQUESTED,
            "no --cpu-offload-gb on the command line"
            if requested is None
            else f"--cpu-offload-gb {requested:g}: nothing to offload",
            ranks=_ranks(facts, None),
            host_available_gib=avail,
        )
    ranks = _ranks(facts, requested)
    if not ranks:
        return Inspection(
            facts,
            Verdict.CANNOT_TELL,
            "no EngineCore or Worker process under the API server (still starting, or "
            "VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps the engine in the API server)",
            host_available_gib=avail,
        )
    unread = [r for r in ranks if r.shmem_gib is None]
    if unread:
        errors = {p.pid: p.error for p in facts.procs}
        return Inspection(
            facts,
            Verdict.CANNOT_TELL,
            "cannot read "
            + ", ".join(f"{r.process} (pid {r.pid}): {errors.get(r.pid)}" for r in unread),
            ranks=ranks,
            host_available_gib=avail,
        )
    verdicts = {r.verdict for r in ranks}
    held = round(sum(r.held_gib or 0.0 for r in ranks), 2)
    per_rank = ", ".join(f"{r.process} {r.shmem_gib:.2f} GiB" for r in ranks)
    bw = link_bandwidth_gbs(*link)
    if verdicts == {Verdict.EFFECTIVE}:
        cost = None
        link_text = None
        if bw:
            rate = bw * PRACTICAL_FRACTION
            # The weights cross the link, not the pinned allocator's rounding that shared memory also counts.
            moved = min(requested, max(r.held_gib or 0.0 for r in ranks))
            cost = round(step_cost_ms(moved, rate), 2)
            link_text = f"PCIe gen{link[0]} x{link[1]}, ~{rate:.1f} GB/s in practice"
        return Inspection(
            facts,
            Verdict.EFFECTIVE,
            f"shared host memory per rank matches --cpu-offload-gb {requested:g}: {per_rank} "
            f"(baseline without offload: {BASELINE_GIB:.2f} GiB)",
            ranks=ranks,
            host_held_gib=held,
            host_available_gib=avail,
            per_token_ms=cost,
            link=link_text,
        )
    if verdicts == {Verdict.IGNORED}:
        why, fix = runner_explanation(version, facts.runner_env.get("VLLM_USE_V2_MODEL_RUNNER"))
        if facts.environ_error:
            why += f" (the API server's environment is unreadable: {facts.environ_error})"
        return Inspection(
            facts,
            Verdict.IGNORED,
            f"--cpu-offload-gb {requested:g} requested, but shared host memory is at the "
            f"baseline ({per_rank}); {why}",
            fix=fix,
            ranks=ranks,
            host_held_gib=held,
            host_available_gib=avail,
        )
    return Inspection(
        facts,
        Verdict.CANNOT_TELL,
        f"shared host memory does not match --cpu-offload-gb {requested:g} clearly ({per_rank}; "
        f"in effect would hold about {requested:g} GiB above a {BASELINE_GIB:.2f} GiB baseline): "
        "ranks disagree, the model is smaller than the request, or the request is too small to "
        "tell from the baseline",
        ranks=ranks,
        host_held_gib=held,
        host_available_gib=avail,
    )


def _ranks(facts: ServerFacts, requested: float | None) -> list[RankResult]:
    out = []
    for p in rank_procs(facts):
        shmem = p.rss_shmem_kb / 2**20 if p.rss_shmem_kb is not None else None
        held = max(0.0, shmem - BASELINE_GIB) if shmem is not None else None
        if held is None:
            v = Verdict.CANNOT_TELL
        elif requested is None:
            v = Verdict.NOT_REQUESTED
        elif held >= EFFECTIVE_FRACTION * requested:
            v = Verdict.EFFECTIVE
        elif (
            held < IGNORED_FRACTION * requested
            and shmem is not None
            and shmem < BASELINE_MAX_GIB + IGNORED_FRACTION * requested
        ):
            v = Verdict.IGNORED
        else:
            v = Verdict.CANNOT_TELL
        out.append(
            RankResult(
                p.role,
                p.pid,
                round(shmem, 3) if shmem is not None else None,
                round(held, 3) if held is not None else None,
                v,
                round(p.gpu_bytes / 2**30, 2) if p.gpu_bytes else None,
            )
        )
    return out
