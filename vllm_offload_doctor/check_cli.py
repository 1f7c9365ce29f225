"""`offload-doctor check`: every precondition for CPU weight offloading, on this machine."""

from __future__ import annotations

import os
import sys

import click


@click.command("check")
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
    default=0.9,
    show_default=True,
    help="Fraction of each GPU vLLM may use (vLLM's default for most versions).",
)
@click.option(
    "--model",
    metavar="DIR|ORG/NAME",
    help="Local model directory or a repo id already in the Hugging Face cache (never downloaded).",
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
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "markdown"]),
    default="text",
    show_default=True,
    help="markdown is a paste-ready block for a bug report (no secrets, user or host names).",
)
@click.option("-v", "--verbose", is_flag=True, help="Show details and links for every check.")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
def check(
    offload_gb: float,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    model: str | None,
    python: str | None,
    host: str,
    port: int,
    fmt: str,
    verbose: bool,
    strict: bool,
) -> int:
    """Can this machine and this vLLM offload weights to the CPU at all?

    Exit status: 0 all ok or warnings only, 1 a check failed (--strict: or warned),
    2 nothing could be checked or bad usage.
    """
    from vllm_offload_doctor.check_render import OutputFormat, render
    from vllm_offload_doctor.checks import Options, run_checks
    from vllm_offload_doctor.probes import RealProbe

    options = Options(
        offload_gb=offload_gb,
        tensor_parallel_size=tensor_parallel_size,
        gpu_memory_utilization=gpu_memory_utilization,
        model=model,
        python=python,
        host=host,
        port=port,
    )
    report = run_checks(RealProbe(), options)
    color = not os.environ.get("NO_COLOR") and sys.stdout.isatty()
    click.echo(render(report, OutputFormat(fmt), verbose=verbose, color=color), color=color)
    return report.exit_code(strict=strict)
