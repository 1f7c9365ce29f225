"""`offload-doctor compare`: A/B run of `vllm serve` with offload 0 vs X.

The report goes to stdout in the chosen --format, progress to stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from vllm_offload_doctor.common_cli import (
    Output,
    color_option,
    complete_path,
    format_option,
    output_option,
    quiet_option,
    verbose_option,
)
from vllm_offload_doctor.compare.config import (
    DEFAULT_MODEL,
    DEFAULT_TIMEOUT_S,
    TIMEOUT_PER_OFFLOADED_S,
)
from vllm_offload_doctor.compare.render import RENDERERS, report_files
from vllm_offload_doctor.output.formats import OutputFormat

if TYPE_CHECKING:
    from vllm_offload_doctor.compare.config import CompareConfig


@click.command(
    "compare",
    short_help="Measure offload 0 against offload X: did it take effect?",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "--model",
    default=DEFAULT_MODEL,
    show_default=True,
    help="Model name or local path given to `vllm serve`.",
    shell_complete=complete_path,
)
@click.option(
    "--revision",
    default=None,
    help="Model revision. Default: the pinned reference revision for "
    "Qwen/Qwen3-0.6B, none for any other model (e.g. a local path). "
    "`--revision none` drops it.",
)
@click.option(
    "--served-model-name",
    default=None,
    help="Name the server exposes and the request uses (default: the model).",
)
@click.option(
    "--offload-gb",
    "--cpu-offload-gb",
    "offload_gb",
    type=float,
    multiple=True,
    help="Offload GiB per GPU to test (repeatable). Default 0.5.",
)
@click.option(
    "--baseline-gb",
    type=float,
    default=0.0,
    show_default=True,
    help="Offload GiB of the baseline mode.",
)
@click.option(
    "--max-model-len",
    type=int,
    default=None,
    help="Context length of every mode (default 2048; also accepted after `--`).",
)
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address each `vllm serve` binds."
)
@click.option(
    "--port", type=int, default=8000, show_default=True, help="Port each `vllm serve` listens on."
)
@click.option(
    "--repeats", type=int, default=5, show_default=True, help="Measured requests per mode."
)
@click.option(
    "--warmup",
    type=int,
    default=1,
    show_default=True,
    help="Unmeasured requests first (the first request compiles kernels).",
)
@click.option("--prompt", default=None, help="User message (default: the reference question).")
@click.option(
    "--expect",
    multiple=True,
    help="Accepted answer, case-insensitive substring (repeatable). Default for the "
    "default prompt: Париж / Paris. A mismatch is reported, never a failure.",
)
@click.option(
    "--max-tokens", type=int, default=32, show_default=True, help="Tokens generated per request."
)
@click.option(
    "--stream/--no-stream",
    default=False,
    show_default=True,
    help="Stream responses to measure time to first token and inter-token latency.",
)
@click.option(
    "--vllm-cmd",
    default="vllm",
    show_default=True,
    help="Command that starts the server (split like a shell would, no shell run).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=None,
    help=f"Seconds each mode may take to become ready (a failing load ends the mode at once) "
    f"[default: {DEFAULT_TIMEOUT_S:g}, plus {TIMEOUT_PER_OFFLOADED_S:.1f} s per offloaded GiB: "
    "pinning adds about X / 0.6 s].",
)
@click.option(
    "--request-timeout",
    "request_timeout_s",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds one measured request may take before it counts as failed.",
)
@click.option(
    "--grace",
    "grace_s",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds to wait after SIGINT before SIGTERM/SIGKILL.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Artifacts folder (default ./offload-doctor-runs/<timestamp>-<random>). One run per "
    "folder: a folder in use or holding an earlier report is refused.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Reuse an --out that holds an earlier report (its report, logs and commands are "
    "deleted first).",
)
@click.option(
    "--verify-fix",
    is_flag=True,
    help="If offload is ignored and vLLM has an escape hatch (0.22-0.27.x: "
    "VLLM_USE_V2_MODEL_RUNNER=0), run the offload mode again with it and report whether it works.",
)
@click.option(
    "-tp",
    "--tensor-parallel-size",
    "tensor_parallel_size",
    type=int,
    default=None,
    help="GPUs per mode, passed to every `vllm serve` (also accepted after `--`); "
    "--offload-gb is then a budget per GPU.",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Stop before any server starts when the preflight finds the host cannot hold an "
    "offload mode (exit 2).",
)
@format_option("compare", "Report format on stdout (progress goes to stderr).")
@color_option()
@output_option()
@quiet_option()
@verbose_option("Print the exact commands and request on stderr before the run.")
@click.option("--dry-run", is_flag=True, help="Print the exact commands and request; run nothing.")
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED)
def compare(
    model: str,
    revision: str | None,
    served_model_name: str | None,
    offload_gb: tuple[float, ...],
    baseline_gb: float,
    max_model_len: int | None,
    host: str,
    port: int,
    repeats: int,
    warmup: int,
    prompt: str | None,
    expect: tuple[str, ...],
    max_tokens: int,
    stream: bool,
    vllm_cmd: str,
    timeout_s: float | None,
    request_timeout_s: float,
    grace_s: float,
    out_dir: str | None,
    force: bool,
    verify_fix: bool,
    tensor_parallel_size: int | None,
    strict: bool,
    fmt: OutputFormat,
    color: bool | None,
    output: Path | None,
    quiet: bool,
    verbose: bool,
    dry_run: bool,
    vllm_args: tuple[str, ...],
) -> int:
    """Run the same model with offload 0 and offload X, measure both, give the verdict.

    \b
    Everything after `--` goes unchanged to every `vllm serve`, e.g.
      offload-doctor compare -- --enforce-eager --kv-cache-dtype fp8
    (--max-model-len, --served-model-name and -tp there count as compare's own; an
    --api-key there or VLLM_API_KEY is sent as `Authorization: Bearer`.)
    The environment (e.g. VLLM_USE_V2_MODEL_RUNNER=0) passes through unchanged.

    \b
    A baseline that runs out of GPU memory is where offload is needed: the offload
    mode(s) still run and the verdict says whether offload makes the model fit.

    \b
    Exit status: 0 offload took effect; 1 ignored, a mode failed or inconclusive;
    2 usage or environment error; 130 interrupted (143 on SIGTERM, 129 SIGHUP,
    131 SIGQUIT).

    \b
    Examples:
      offload-doctor compare --model Qwen/Qwen3-0.6B --offload-gb 0.5
      offload-doctor compare --offload-gb 0.25 --offload-gb 0.5 --offload-gb 1
      offload-doctor compare --dry-run                   # print the commands only
      offload-doctor compare -q --format json -o ab.json # the report in a file, no output
      offload-doctor compare -- --enforce-eager          # extra `vllm serve` flags
    """
    import shlex
    import sys

    from vllm_offload_doctor import exitcodes
    from vllm_offload_doctor.compare.artifacts import commands_text, default_out_dir
    from vllm_offload_doctor.compare.config import (
        DEFAULT_MAX_MODEL_LEN,
        DEFAULT_PROMPT,
        CompareConfig,
        absorb_passthrough,
        with_tensor_parallel,
    )
    from vllm_offload_doctor.compare.run import CompareRun
    from vllm_offload_doctor.compare.server import Terminated, sigterm_as_interrupt
    from vllm_offload_doctor.errors import Interrupted

    extra, own = absorb_passthrough(
        with_tensor_parallel(list(vllm_args), tensor_parallel_size),
        {"max_model_len": max_model_len, "served_model_name": served_model_name},
    )
    cfg = CompareConfig(
        vllm_cmd=shlex.split(vllm_cmd),
        model=model,
        revision=revision,
        served_model_name=str(own["served_model_name"]) if own["served_model_name"] else None,
        offload_gb=list(offload_gb) or [0.5],
        baseline_gb=baseline_gb,
        max_model_len=int(own["max_model_len"] or DEFAULT_MAX_MODEL_LEN),
        host=host,
        port=port,
        repeats=repeats,
        warmup=warmup,
        prompt=prompt if prompt is not None else DEFAULT_PROMPT,
        expect=list(expect) if expect else None,
        max_tokens=max_tokens,
        stream=stream,
        timeout_s=timeout_s,
        request_timeout_s=request_timeout_s,
        out_dir=Path(out_dir) if out_dir else default_out_dir(),
        extra_args=extra,
        grace_s=grace_s,
        verify_fix=verify_fix,
        force=force,
        strict=strict,
    )
    cfg.validate()
    out = Output(fmt, output, quiet=quiet, color=color)
    if dry_run:
        out.report(lambda f, _color: _dry_run(cfg, f))
        out.close()
        return exitcodes.OK
    cfg.check_model()
    cfg.check_command()
    if verbose and not quiet:
        click.echo(commands_text(cfg, cfg.fix_env()), nl=False, err=True)
    exposed = cfg.exposure()
    if exposed:
        click.echo(f"offload-doctor: warning: {exposed}", err=True)

    run = CompareRun(cfg, progress=None if quiet else sys.stderr, files=report_files)
    try:
        with sigterm_as_interrupt():
            status = run.execute()
    except Terminated as exc:
        raise Interrupted(
            f"terminated; partial report in {cfg.out_dir}", signum=int(exc.signum)
        ) from None
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; partial report in {cfg.out_dir}") from None
    out.report(lambda f, c: RENDERERS[f](run.report, str(cfg.out_dir), color=c), nl=False)
    out.close()
    return status


def _dry_run(cfg: CompareConfig, fmt: OutputFormat) -> str:
    """A dry run answers in the format asked for, like the run itself."""
    import json

    from vllm_offload_doctor.compare.artifacts import commands_data, commands_text
    from vllm_offload_doctor.output.formats import SCHEMA_VERSION

    if fmt is OutputFormat.JSON:
        doc = {"schema_version": SCHEMA_VERSION, **commands_data(cfg, cfg.fix_env())}
        return json.dumps(doc, ensure_ascii=False, indent=2)
    if fmt is OutputFormat.MARKDOWN:
        return f"```bash\n{commands_text(cfg, cfg.fix_env())}```"
    return commands_text(cfg, cfg.fix_env()).removesuffix("\n")
