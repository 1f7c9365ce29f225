"""CompareRun: each mode in turn (start, wait, measure, stop, analyse), the report kept on disk.

A server log is written raw into a private temporary folder (only this run opens it), copied
scrubbed into the run folder as it grows (a killed doctor leaves it there), analysed, and saved
whole and scrubbed at the mode's end; the raw copy is then deleted (and the folder of a run that
was killed is swept by the next run).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from secrets import token_hex
from typing import TYPE_CHECKING, TextIO

from vllm_offload_doctor import __version__, exitcodes
from vllm_offload_doctor.analyze.model import Category, Severity
from vllm_offload_doctor.compare import artifacts as art
from vllm_offload_doctor.compare.config import V1_RUNNER_ENV, CompareConfig, fmt_gb
from vllm_offload_doctor.compare.decide import (
    FitInputs,
    compare_pair,
    decide,
    gpu_util_default,
    has_escape_hatch,
    nvsmi_note,
    out_of_memory,
    version_of,
    with_fix,
)
from vllm_offload_doctor.compare.hostmem import (
    HostProbe,
    HostSampler,
    RealHostProbe,
    engine_gone_silently,
    host_death_summary,
    host_spared,
)
from vllm_offload_doctor.compare.logscan import read_mode_log
from vllm_offload_doctor.compare.measure import measure
from vllm_offload_doctor.compare.model import (
    CompareReport,
    CompareStatus,
    Comparison,
    Finding,
    ModeResult,
    ModeStatus,
    ReportConfig,
    Role,
    Verdict,
)
from vllm_offload_doctor.compare.records import Stop
from vllm_offload_doctor.errors import DoctorError, ServerStartError
from vllm_offload_doctor.redact import scrub_argv, scrub_data, scrub_text

if TYPE_CHECKING:
    from vllm_offload_doctor.compare.preflight import MachineProbe
    from vllm_offload_doctor.compare.server import ServerProcess


class HostTooSmallError(DoctorError):
    """--strict: the preflight found an offload mode the host cannot hold."""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def report_config(cfg: CompareConfig) -> ReportConfig:
    return ReportConfig(
        vllm_cmd=tuple(scrub_argv(cfg.vllm_cmd)),
        model=scrub_text(cfg.model),
        revision=cfg.effective_revision,
        served_model_name=scrub_text(cfg.served),
        baseline_gb=cfg.baseline_gb,
        offload_gb=tuple(cfg.offload_gb),
        max_model_len=cfg.max_model_len,
        host=cfg.host,
        port=cfg.port,
        repeats=cfg.repeats,
        warmup=cfg.warmup,
        stream=cfg.stream,
        timeout_s=cfg.timeout_for(max(cfg.modes())),
        tensor_parallel_size=cfg.tensor_parallel_size(),
        extra_args=tuple(scrub_argv(cfg.extra_args)),
        request=scrub_data(cfg.request_body()),
        expect=tuple(cfg.expected_answers),
        verify_fix=True if cfg.verify_fix else None,
        exposed=cfg.exposure(),
    )


# The report's files in the run folder (name -> text), rendered by the command's renderer.
ReportFiles = Callable[[CompareReport], Mapping[str, str]]


class CompareRun:
    """Runs every mode in turn and keeps the report up to date and on disk after every step.

    The run only produces the report; `files` (compare.render.report_files) renders what is
    saved of it, and the CLI renders what it prints.
    """

    def __init__(
        self,
        cfg: CompareConfig,
        progress: TextIO | None = None,
        host_probe: HostProbe | None = None,
        machine: MachineProbe | None = None,
        *,
        files: ReportFiles,
    ) -> None:
        self.cfg = cfg
        self.files = files
        self.host_probe = host_probe
        self.machine = machine
        self.progress = progress
        self.out = cfg.out_dir
        self.report = CompareReport(
            tool_version=__version__,
            started_at=_now(),
            config=report_config(cfg),
            environment=art.relevant_env(),
        )
        self._raw_dir: Path | None = None
        self._disk_full: art.DiskFull | None = None  # found after a mode: raised once it is saved

    # ------------------------------------------------------------------ report on disk

    def _set(self, **changes: object) -> None:
        self.report = replace(self.report, **changes)  # type: ignore[arg-type]

    def _put_mode(self, mode: ModeResult, index: int | None = None) -> int:
        modes = list(self.report.modes)
        if index is None:
            modes.append(mode)
            index = len(modes) - 1
        else:
            modes[index] = mode
        self._set(modes=tuple(modes))
        return index

    def write(self) -> None:
        for name, text in self.files(self.report).items():
            art.atomic_write(self.out / name, text)

    def _say(self, message: str) -> None:
        if self.progress is not None:
            self.progress.write(message + "\n")
            self.progress.flush()

    # ------------------------------------------------------------------ the run

    def execute(self) -> int:
        tmp = Path(tempfile.gettempdir())
        raw = tmp / f"{art.raw_dir_prefix()}{token_hex(6)}"  # made once the folder is ours
        # The janitor comes first and goes last: killed at any moment between, this run leaves
        # neither its raw (unmasked) logs nor its lock file behind.
        with art.janitor(self.out, raw), art.claim(self.out, force=self.cfg.force):
            self.write()  # a report from the first moment: a SIGKILL at any time leaves one
            try:
                art.sweep_raw_dirs(tmp)
                raw.mkdir(mode=0o700)  # private, and new (never an existing folder or link)
            except OSError as exc:
                doing = f"cannot create a private folder for the server logs in {tmp}"
                raise art.write_error(tmp, exc, doing) from exc
            self._raw_dir = raw
            try:
                return self._execute()
            finally:
                shutil.rmtree(raw, ignore_errors=True)

    def _execute(self) -> int:
        cfg = self.cfg
        art.atomic_write(self.out / "commands.txt", art.commands_text(cfg, self._fix_env()))
        self.write()
        try:
            assert self._raw_dir is not None
            full = art.no_room(self._raw_dir)  # a server that cannot log is not a failed server
            if full is not None:
                raise full
            self._preflight()
            self._run_modes()
            self._set(complete=True)
        except KeyboardInterrupt:
            self._set(
                interrupted=True,
                verdict=Verdict(
                    Finding(
                        CompareStatus.INCONCLUSIVE,
                        "interrupted",
                        "Interrupted before every mode was measured; the partial figures are kept.",
                    )
                ),
            )
            raise
        except DoctorError as exc:
            self._set(
                error=str(exc),
                verdict=Verdict(Finding(CompareStatus.INCONCLUSIVE, "could not run", str(exc))),
            )
            raise
        finally:
            self._set(finished_at=_now())
            with contextlib.suppress(DoctorError):
                self.write()
        effective = self.report.verdict.status == CompareStatus.EFFECTIVE
        return exitcodes.OK if effective else exitcodes.FOUND

    def _preflight(self) -> None:
        """check's host and fit questions for the modes about to run, before any of them starts."""
        from vllm_offload_doctor.compare.preflight import run_preflight

        if self.machine is None:
            from vllm_offload_doctor.machine.probes import RealProbe

            self.machine = RealProbe()
        try:
            pre = run_preflight(self.cfg, self.machine)
        except Exception as exc:  # a probe that fails must not stop the measurement
            self._say(f"preflight: could not read the host ({type(exc).__name__}: {exc})")
            return
        self._set(preflight=pre.to_dict())
        for line in pre.lines():
            self._say(f"preflight: {line}")
        self.write()
        if pre.blocked:
            sizes = ", ".join(fmt_gb(gb) for gb in pre.blocked)
            message = (
                f"the host cannot hold --cpu-offload-gb {sizes}: it needs at least "
                f"{min(m.low_gib for m in pre.modes if m.offload_gb in pre.blocked):.0f} GiB of "
                f"host memory and {pre.usable_gib:.1f} GiB is usable; this host holds at most "
                f"--cpu-offload-gb {pre.largest_offload_gib}"
            )
            if self.cfg.strict:
                raise HostTooSmallError(message + " (--strict: nothing was started)")
            self._say(f"preflight: {message}; running anyway (--strict stops here)")

    def _fix_env(self) -> dict[str, str] | None:
        return self.cfg.fix_env()

    def _run_modes(self) -> None:
        cfg = self.cfg
        modes = cfg.modes()
        n = len(modes)
        base = self.run_mode(0, n, modes[0], Role.BASELINE)
        offs: list[ModeResult] = []
        if base.ok or out_of_memory(base):
            if not base.ok:
                self._say(
                    "baseline ran out of GPU memory: the model needs offload; "
                    "running the offload mode(s)"
                )
            offs = [self.run_mode(i, n, gb, Role.OFFLOAD) for i, gb in enumerate(modes) if i]
        else:
            cause = base.analysis.title if base.analysis else base.reason
            self._say(
                f"the baseline failed ({cause}); offload cannot change that, so the offload "
                "mode(s) are not run"
            )
        fit = self._fit_inputs(base)
        comps = [compare_pair(base, off, fit) for off in offs]
        if not comps:
            comps = [compare_pair(base, None)]
        comps, notes = self._verify(base, comps)
        served = sum(1 for m in self.report.modes if m.ok)
        version = version_of(base) or next((version_of(m) for m in offs if version_of(m)), None)
        verdict = decide(comps, served, nvsmi_note(version, cfg.gpu_memory_utilization()))
        notes += self._host_notes() + self._flood_notes()
        if notes:
            f = verdict.finding
            verdict = replace(verdict, finding=replace(f, notes=f.notes + tuple(notes)))
        self._set(comparisons=tuple(comps), verdict=verdict)

    def _host_notes(self) -> list[str]:
        """What the host was budgeted and what it measured, for each offload mode."""
        from vllm_offload_doctor.compare.preflight import host_figures

        out = []
        for m in self.report.modes:
            if m.role == Role.BASELINE and m.offload_gb == 0:
                continue
            line = host_figures(m.offload_gb, m.host_memory, self.report.preflight)
            if line:
                out.append(line)
        return list(dict.fromkeys(out))

    def _flood_notes(self) -> list[str]:
        """A server that flooded its log is named: its saved log lost its middle, and so may the
        verdict the lines needed."""
        return [
            f"offload {fmt_gb(m.offload_gb)} GiB: {m.stop.log_flood}; what it wrote in between "
            "was not read"
            for m in self.report.modes
            if m.stop is not None and m.stop.log_flood
        ]

    def _fit_inputs(self, base: ModeResult) -> FitInputs:
        """Weights per GPU (local models only), gpu_memory_utilization and context length."""
        util = self.cfg.gpu_memory_utilization() or gpu_util_default(version_of(base))
        mml = self.cfg.max_model_len
        if base.ok:
            return FitInputs(None, util, mml)
        from vllm_offload_doctor.machine.modelsize import inspect_model

        try:
            size = inspect_model(self.cfg.model, os.environ, Path.home())
        except (DoctorError, OSError, ValueError):
            return FitInputs(None, util, mml)
        tp = self.cfg.tensor_parallel_size()
        return FitInputs(size.total_bytes / 2**30 / tp, util, mml, size.shape, tp)

    def _verify(
        self, base: ModeResult, comps: list[Comparison]
    ) -> tuple[list[Comparison], list[str]]:
        """--verify-fix: re-run an ignored offload mode with the prescribed escape hatch."""
        if not self.cfg.verify_fix:
            return comps, []
        ignored = [i for i, c in enumerate(comps) if c.status == CompareStatus.IGNORED]
        env = self._fix_env()
        if not ignored:
            already = (
                f" ({V1_RUNNER_ENV[0]}={V1_RUNNER_ENV[1]} is already set)" if env is None else ""
            )
            return comps, [
                f"--verify-fix: nothing to verify, no offload mode was ignored{already}."
            ]
        off = next(m for m in self.report.modes if m.offload_gb == comps[ignored[0]].offload_gb)
        version = version_of(off)
        if env is None:
            return comps, [
                f"--verify-fix: {V1_RUNNER_ENV[0]}={V1_RUNNER_ENV[1]} is already set; "
                "there is no further fix to verify."
            ]
        if not has_escape_hatch(version):
            return comps, [
                f"--verify-fix: vLLM {version or '(unknown version)'} has no "
                f"{V1_RUNNER_ENV[0]} escape hatch (0.22-0.27.x only); nothing was re-run."
            ]
        out = list(comps)
        assign = " ".join(f"{k}={v}" for k, v in env.items())
        for i in ignored:
            gb = out[i].offload_gb or 0.0
            fix_mode = self.run_mode(
                len(self.report.modes), len(self.report.modes) + 1, gb, Role.VERIFY_FIX, env
            )
            fix = compare_pair(base, fix_mode, self._fit_inputs(base))
            out[i] = with_fix(out[i], fix, assign)
        return out, []

    # ------------------------------------------------------------------ one mode

    def run_mode(
        self, i: int, n: int, gb: float, role: Role, env: dict[str, str] | None = None
    ) -> ModeResult:
        from vllm_offload_doctor.compare.progress import LogFollower, Progress, RequestProgress
        from vllm_offload_doctor.compare.server import PortTaken, ServerProcess

        cfg = self.cfg
        label = fmt_gb(gb) + ("-fix" if role == Role.VERIFY_FIX else "")
        assert self._raw_dir is not None
        raw_log = self._raw_dir / f"mode-{label}.log"
        argv = cfg.argv(gb)
        mode = ModeResult(
            label=label,
            offload_gb=gb,
            role=role,
            command=tuple(scrub_argv(argv)),
            log=f"mode-{label}.log",
            status=ModeStatus.STARTING,
            env=env,
        )
        idx = self._put_mode(mode)
        self.write()
        what = f"offload {fmt_gb(gb)} GiB" + (f" with {' '.join(env)}=…" if env else "")
        prog = Progress(f"{i + 1}/{n} {what}", self.progress) if self.progress else None
        follower = LogFollower(raw_log)
        key = cfg.api_key()
        srv = ServerProcess(
            argv,
            log_path=raw_log,
            host=cfg.host,
            port=cfg.port,
            served_model=cfg.served,
            grace_s=cfg.grace_s,
            env=dict(os.environ, **(env or {})),
            api_key=key,
        )

        if self.host_probe is None:
            self.host_probe = RealHostProbe()
        sampler = HostSampler(self.host_probe, lambda: srv.pid)
        from vllm_offload_doctor.compare.logmirror import LogMirror

        mirror = LogMirror(raw_log, self.out / mode.log)

        def tick(elapsed: float) -> None:
            nonlocal mode
            phase = follower.poll()
            if prog:
                prog.update(elapsed, phase)
            if mode.pid is None and srv.pid is not None:  # the server pid, once it exists
                mode = replace(mode, pid=srv.pid)
                self._put_mode(mode, idx)
                self.write()

        not_started = False
        try:
            mirror.start()
            try:
                srv.start()
            except PortTaken as exc:
                not_started = True
                mode = replace(mode, status=ModeStatus.NOT_STARTED, reason=exc.state.describe())
                raise
            except OSError as exc:
                raise ServerStartError(f"cannot start {shlex.join(argv[:2])}: {exc}") from exc
            sampler.start()
            res = srv.wait_ready(cfg.timeout_for(gb), on_tick=tick)
            mode = replace(mode, startup_s=round(res.startup_s, 2), phase=follower.poll())
            self._put_mode(mode, idx)
            self.write()  # readiness is a state a killed run should still show
            if res.ready:
                if prog:
                    prog.line(f"ready in {res.startup_s:.1f} s; measuring")
                served = measure(srv, cfg, key, RequestProgress(prog) if prog else None)
                if prog:
                    prog.done()
                ok = served.latency.ok > 0
                mode = replace(
                    mode,
                    served=served,
                    status=ModeStatus.OK if ok else ModeStatus.REQUESTS_FAILED,
                    reason=None if ok else _request_failure(served),
                )
            else:
                status = (
                    ModeStatus.EXITED
                    if res.exited
                    else ModeStatus.UNAUTHORIZED
                    if res.unauthorized
                    else ModeStatus.TIMEOUT
                )
                mode = replace(mode, status=status, returncode=res.returncode, reason=res.reason)
                if prog:
                    prog.line(f"{res.reason} (last phase: {mode.phase})")
        except KeyboardInterrupt:
            mode = replace(mode, status=ModeStatus.INTERRUPTED, reason="interrupted")
            raise
        finally:
            if prog:
                prog.done()
            mirror.stop()
            if not_started:  # nothing ran: no log, nothing to stop
                with contextlib.suppress(OSError):
                    (self.out / mode.log).unlink()
            else:
                mode = self._finish_mode(mode, srv, raw_log, sampler)
            self._put_mode(mode, idx)
            if prog and mode.stop:
                flood = f"; {mode.stop.log_flood}" if mode.stop.log_flood else ""
                prog.line(
                    f"stopped in {mode.stop.stop_s:.1f} s ({', '.join(mode.stop.signals) or 'exited'})"
                    + flood
                )
            self.write()
        if self._disk_full is not None:
            raise self._disk_full
        return mode

    def _finish_mode(
        self, mode: ModeResult, srv: ServerProcess, raw_log: Path, sampler: HostSampler
    ) -> ModeResult:
        """Stop the server, analyse the raw log, save it scrubbed, delete the raw copy."""
        s = srv.stop()
        host = sampler.stop(mode.offload_gb)
        mode = replace(
            mode,
            host_memory=host,
        )
        mode = replace(
            mode,
            stop=Stop(
                round(s.stop_s, 3),
                tuple(s.signals),
                s.returncode,
                tuple(s.swept),
                tuple(s.survivors),
                s.port_free,
                s.log_flood,
            ),
            leftover_pids=tuple(s.survivors) if s.survivors else None,
        )
        # A log cut short by a full TMPDIR would be judged as the server's failure: the mode
        # keeps what was measured, its log is not judged, and the run stops naming the disk.
        self._disk_full = art.no_room(raw_log.parent, art.FULL_BYTES)
        if self._disk_full is not None:
            with contextlib.suppress(art.WriteError):  # else the live copy in --out stays
                art.save_scrubbed_log(raw_log, self.out / mode.log)
            with contextlib.suppress(OSError):
                raw_log.unlink()
            return replace(mode, analysis_error=f"log not judged: {self._disk_full}")
        try:
            analysis, facts, last_error = read_mode_log(raw_log, mode.log)
        except Exception as exc:  # the verdict must survive an analysis bug
            mode = replace(mode, analysis_error=f"log analysis failed: {type(exc).__name__}: {exc}")
        else:
            analysis = replace(
                analysis,
                title=scrub_text(analysis.title),
                summary=scrub_text(analysis.summary),
                offload_explanation=scrub_text(analysis.offload_explanation),
                evidence=tuple((n, scrub_text(t)) for n, t in analysis.evidence)
                if not mode.ok
                else (),
            )
            if facts.model_runner_evidence:
                facts = replace(
                    facts, model_runner_evidence=scrub_text(facts.model_runner_evidence)
                )
            mode = replace(mode, analysis=analysis, log_facts=facts)
            if not mode.ok and last_error:
                mode = replace(mode, last_error_line=scrub_text(last_error)[:400])
            mode = _named_host_death(mode)
        try:
            art.save_scrubbed_log(raw_log, self.out / mode.log)
        finally:
            with contextlib.suppress(OSError):
                raw_log.unlink()
        return mode


def _named_host_death(mode: ModeResult) -> ModeResult:
    """A silent engine death while host memory ran out is `oom_host`, whatever the log says."""
    host, a = mode.host_memory, mode.analysis
    if mode.ok or host is None or a is None:
        return mode
    if not engine_gone_silently(mode.log_facts, a.category):
        return mode
    if not host.exhausted and a.category is Category.OOM_HOST:
        # analyze guessed the OOM killer from the offload size alone; the measurement says no.
        analysis = replace(
            a,
            category=Category.UNKNOWN,
            rule_id=None,
            title="The engine died with no exception",
            summary=host_spared(host),
        )
        return replace(mode, analysis=analysis)
    if not host.exhausted:  # say what host memory did, so the reader need not guess
        return replace(mode, analysis=replace(a, summary=a.summary + " " + host_spared(host)))
    title, summary, remedy = host_death_summary(host, mode.offload_gb)
    analysis = replace(
        a,
        category=Category.OOM_HOST,
        rule_id=None,
        title=title,
        summary=summary,
        severity=Severity.ERROR,
        remedy=remedy,
    )
    return replace(mode, analysis=analysis)


def _request_failure(served: object) -> str:
    from collections import Counter

    from vllm_offload_doctor.compare.records import Served

    assert isinstance(served, Served)
    errors = Counter(r.error for r in served.requests)
    return "every measured request failed: " + "; ".join(
        f"{e} (x{c})" for e, c in errors.most_common(2)
    )
