"""`offload-doctor check`: every precondition for CPU weight offloading, on this machine."""

from __future__ import annotations

from pathlib import Path

import click

from vllm_offload_doctor import exitcodes
from vllm_offload_doctor.common_cli import (
    Output,
    color_option,
    complete_path,
    format_option,
    output_option,
    quiet_option,
    verbose_option,
)
from vllm_offload_doctor.machine.fit import KV_CACHE_DTYPES
from vllm_offload_doctor.output.formats import OutputFormat


@click.command("check", short_help="Can this machine and this vLLM offload at all?")
@click.option(
    "--offload-gb",
    "--cpu-offload-gb",
    "offload_gb",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="GiB you plan to offload per GPU (vLLM's --cpu-offload-gb).",
)
@click.option(
    "--tensor-parallel-size",
    "-tp",
    "tensor_parallel_size",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Number of GPUs vLLM will use; host memory is budgeted for all of them.",
)
@click.option(
    "--gpu-memory-utilization",
    type=click.FloatRange(0, 1, min_open=True),
    default=None,
    help="Fraction of each GPU vLLM may use [default: the installed vLLM's: 0.92 from 0.20, "
    "0.9 before].",
)
@click.option(
    "--model",
    metavar="DIR|ORG/NAME",
    help="Local model directory or a repo id already in the Hugging Face cache (never downloaded).",
    shell_complete=complete_path,
)
@click.option(
    "--max-model-len",
    type=click.IntRange(min=1),
    default=None,
    help="Context length vLLM will serve; sizes the KV cache [default: the model's].",
)
@click.option(
    "--kv-cache-dtype",
    type=click.Choice(KV_CACHE_DTYPES),
    default="auto",
    show_default=True,
    help="vLLM's --kv-cache-dtype; sizes the KV cache (auto: the model's dtype).",
)
@click.option(
    "--gpu-memory-gib",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Plan the fit for GPUs of this size instead of the ones here (or with none).",
)
@click.option(
    "--link-gbs",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Host-to-GPU GB/s to price each token of offload on [default: the GPU's PCIe link, "
    "or PCIe gen4 and gen5 x16 without a GPU].",
)
@click.option(
    "--python",
    "python",
    type=click.Path(exists=True, dir_okay=False),
    help="Interpreter that runs vLLM (default: the one behind `vllm` on PATH).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Host vLLM will bind.")
@click.option(
    "--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="Port to test."
)
@format_option(
    "check",
    "markdown is a paste-ready block for a bug report (no secrets, user or host names).",
)
@color_option()
@output_option()
@quiet_option()
@verbose_option("Show details and links for every check (with --list: what each one tests).")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
@click.option(
    "--list", "list_checks", is_flag=True, help="List the checks and what each one tests."
)
def check(
    offload_gb: float,
    tensor_parallel_size: int,
    gpu_memory_utilization: float | None,
    model: str | None,
    max_model_len: int | None,
    kv_cache_dtype: str,
    gpu_memory_gib: float | None,
    link_gbs: float | None,
    python: str | None,
    host: str,
    port: int,
    fmt: OutputFormat,
    color: bool | None,
    output: Path | None,
    quiet: bool,
    verbose: bool,
    strict: bool,
    list_checks: bool,
) -> int:
    """Can this machine and this vLLM offload weights to the CPU at all?

    Exit status: 0 all ok or warnings only, 1 a check failed (--strict: or warned),
    2 nothing could be checked or bad usage. A --model that cannot be read fails
    the fit check alone.

    \b
    Examples:
      offload-doctor check                                # this machine and its vLLM
      offload-doctor check --model MODEL_DIR --offload-gb 8    # will it fit?
      offload-doctor check --python VLLM_PYTHON           # the vLLM of another venv
      offload-doctor check --format markdown              # a reply to paste into an issue
      offload-doctor check --format json -o check.json    # saved for a script, text on screen
    """
    from vllm_offload_doctor.checks import Options, run_checks
    from vllm_offload_doctor.checks.render import render
    from vllm_offload_doctor.machine.probes import RealProbe

    out = Output(fmt, output, quiet=quiet, color=color)
    if list_checks:
        out.report(lambda f, _color: _list_checks(verbose, f))
        out.close()
        return exitcodes.OK
    options = Options(
        offload_gb=offload_gb,
        tensor_parallel_size=tensor_parallel_size,
        gpu_memory_utilization=gpu_memory_utilization,
        model=model,
        max_model_len=max_model_len,
        gpu_memory_gib=gpu_memory_gib,
        link_gbs=link_gbs,
        kv_cache_dtype=kv_cache_dtype,
        python=python,
        host=host,
        port=port,
    )
    report = run_checks(RealProbe(), options)
    out.report(lambda f, c: render(report, f, verbose=verbose, color=c))
    out.close()
    return report.exit_code(strict=strict)


def _list_checks(verbose: bool, fmt: OutputFormat) -> str:
    """Each check's id and title; with -v, its module's documentation (always, in JSON)."""
    import json

    from vllm_offload_doctor.checks import all_checks
    from vllm_offload_doctor.output.formats import SCHEMA_VERSION

    checks = all_checks()
    if fmt is OutputFormat.JSON:
        listed = [{"id": c.id, "title": c.title, "doc": c.doc} for c in checks]
        return json.dumps({"schema_version": SCHEMA_VERSION, "checks": listed}, indent=2)
    if fmt is OutputFormat.MARKDOWN:
        rows = [f"| `{c.id}` | {c.title} | {(c.doc.splitlines() or [''])[0]} |" for c in checks]
        return "\n".join(["| id | check | what it tests |", "|---|---|---|", *rows])
    width = max(len(c.id) for c in checks)
    lines: list[str] = []
    for c in checks:
        first = c.doc.splitlines()[0] if c.doc else ""
        lines.append(f"{c.id:<{width}}  {c.title}: {first}")
        if verbose and c.doc:
            lines.extend(f"    {line}".rstrip() for line in c.doc.splitlines()[1:])
    return "\n".join(lines)
