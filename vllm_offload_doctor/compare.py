"""`compare`: run `vllm serve` with offload 0 and offload X one after the other, measure, decide.

The verdict uses two independent kinds of evidence:

* the logs, through the `analyze` engine: `Offloader set to …`, `Total CPU offloaded parameters`
  (per rank), the model runner, and `Model loading took X GiB` of both modes;
* the measurements: weights on GPU (`Model loading took`) falling by about the offloaded GiB,
  decode latency, GPU memory per process tree, host RSS, KV cache.

Model and revision: `--revision` defaults to the pinned reference revision only for the default
model `Qwen/Qwen3-0.6B`; any other model, and in particular a local path, gets no `--revision`
(vLLM would try the hub). The request's "model" is the served name: `--served-model-name` if
given (it is then passed to vLLM), else the model itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from vllm_offload_doctor import __version__
from vllm_offload_doctor.errors import DoctorError, PortInUseError, ServerStartError
from vllm_offload_doctor.pcie import PRACTICAL_FRACTION, step_cost_ms
from vllm_offload_doctor.redact import is_secret_name, redact, redact_argv

SCHEMA_VERSION = 1
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
DEFAULT_REVISION = "c1899de289a04d12100db370d81485cdf75e47ca"
DEFAULT_PROMPT = "Назови одним словом столицу Франции. /no_think"
DEFAULT_EXPECT = ("Париж", "Paris")
MRV2_LINKS = (
    "https://github.com/vllm-project/vllm/issues/51396",
    "https://github.com/vllm-project/vllm/pull/51413",
)
MRV2_REMEDY = (
    "Set VLLM_USE_V2_MODEL_RUNNER=0 (vLLM 0.22-0.27.x), or upgrade to vLLM >= 0.28.0, "
    "whose V2 model runner installs the offloader."
)
NVSMI_NOTE = (
    "nvidia-smi totals barely move with offloading: vLLM pre-reserves gpu_memory_utilization "
    "(default 0.9) of the card at startup and the KV cache takes whatever the offloaded weights "
    "free. Compare `Model loading took` (weights on GPU) and the KV cache size instead."
)
# Flags compare sets itself; passing them after `--` would make the two modes differ.
MANAGED_FLAGS = (
    "--cpu-offload-gb",
    "--host",
    "--port",
    "--max-model-len",
    "--served-model-name",
    "--revision",
)
ENV_PREFIXES = ("VLLM_", "CUDA_", "NCCL_", "PYTORCH_", "TORCH_", "HF_", "NVIDIA_", "TRANSFORMERS_")

STATUS_RANK = {"effective": 0, "inconclusive": 1, "ignored": 2, "failed": 3}


def fmt_gb(gb: float) -> str:
    return f"{gb:g}"


@dataclass(slots=True)
class CompareConfig:
    vllm_cmd: list[str] = field(default_factory=lambda: ["vllm"])
    model: str = DEFAULT_MODEL
    revision: str | None = None  # None: the default for DEFAULT_MODEL, none otherwise
    served_model_name: str | None = None
    offload_gb: list[float] = field(default_factory=lambda: [0.5])
    baseline_gb: float = 0.0
    max_model_len: int = 2048
    host: str = "127.0.0.1"
    port: int = 8000
    repeats: int = 5
    warmup: int = 1
    prompt: str = DEFAULT_PROMPT
    expect: list[str] | None = None  # None: Париж/Paris for the default prompt, no check otherwise
    max_tokens: int = 32
    stream: bool = False
    timeout_s: float = 600.0
    request_timeout_s: float = 300.0
    out_dir: Path = Path("offload-doctor-runs")
    extra_args: list[str] = field(default_factory=list)
    grace_s: float = 10.0

    @property
    def served(self) -> str:
        return self.served_model_name or self.model

    @property
    def effective_revision(self) -> str | None:
        if self.revision is not None:
            return None if self.revision.lower() in ("", "none") else self.revision
        return DEFAULT_REVISION if self.model == DEFAULT_MODEL else None

    @property
    def expected_answers(self) -> list[str]:
        if self.expect is not None:
            return list(self.expect)
        return list(DEFAULT_EXPECT) if self.prompt == DEFAULT_PROMPT else []

    def modes(self) -> list[float]:
        return [self.baseline_gb, *self.offload_gb]

    def argv(self, gb: float) -> list[str]:
        argv = [*self.vllm_cmd, "serve", self.model]
        if self.effective_revision:
            argv += ["--revision", self.effective_revision]
        argv += ["--cpu-offload-gb", fmt_gb(gb), "--host", self.host, "--port", str(self.port)]
        argv += ["--max-model-len", str(self.max_model_len)]
        if self.served_model_name and self.served_model_name != self.model:
            argv += ["--served-model-name", self.served_model_name]
        return argv + list(self.extra_args)

    def request_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.served,
            "messages": [{"role": "user", "content": self.prompt}],
            "max_tokens": self.max_tokens,
            "stream": self.stream,
        }
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def tensor_parallel_size(self) -> int:
        args = self.extra_args
        for i, a in enumerate(args):
            for flag in ("--tensor-parallel-size", "-tp"):
                value = None
                if a == flag and i + 1 < len(args):
                    value = args[i + 1]
                elif a.startswith(flag + "="):
                    value = a.split("=", 1)[1]
                if value is not None:
                    with contextlib.suppress(ValueError):
                        return int(value)
        return 1

    def validate(self) -> None:
        if not self.offload_gb:
            raise DoctorError("give at least one --offload-gb value")
        for gb in self.modes():
            if gb < 0:
                raise DoctorError(f"offload sizes must be >= 0 GiB, got {fmt_gb(gb)}")
        if self.baseline_gb in self.offload_gb:
            raise DoctorError(f"--offload-gb {fmt_gb(self.baseline_gb)} equals the baseline")
        if self.repeats < 1 or self.warmup < 0:
            raise DoctorError("--repeats must be >= 1 and --warmup >= 0")
        if not self.vllm_cmd:
            raise DoctorError("--vllm-cmd is empty")
        for a in self.extra_args:
            flag = a.split("=", 1)[0]
            own = "--offload-gb" if flag == "--cpu-offload-gb" else flag
            if flag in MANAGED_FLAGS:
                raise DoctorError(
                    f"{flag} after `--` would make the modes differ or clash with compare's own "
                    f"options; use compare's {own}"
                )

    def check_command(self) -> None:
        exe = self.vllm_cmd[0]
        found = (
            shutil.which(exe) if os.sep not in exe else (exe if os.access(exe, os.X_OK) else None)
        )
        if not found:
            raise ServerStartError(
                f"cannot run {exe!r}: not found or not executable (see --vllm-cmd)"
            )


def relevant_env(env: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if env is None else env)
    out = {}
    for k in sorted(env):
        if k.startswith(ENV_PREFIXES):
            out[k] = "***" if is_secret_name(k) else redact(env[k])
    return out


def commands_text(cfg: CompareConfig) -> str:
    lines = ["# offload-doctor compare: the exact commands (secrets redacted)", ""]
    env = relevant_env()
    if env:
        lines.append("# environment passed unchanged to every mode:")
        lines += [f"#   {k}={v}" for k, v in env.items()]
        lines.append("")
    for gb in cfg.modes():
        lines.append(f"# offload {fmt_gb(gb)} GiB")
        lines.append(shlex.join(redact_argv(cfg.argv(gb))))
    body = json.dumps(cfg.request_body(), ensure_ascii=False)
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    lines += [
        "",
        f"# request: {cfg.warmup} warm-up + {cfg.repeats} measured, identical in every mode",
        f"curl -s http://{host}:{cfg.port}/v1/chat/completions "
        f"-H 'content-type: application/json' -d {shlex.quote(body)}",
    ]
    return "\n".join(lines) + "\n"


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------------------- log analysis


def analyze_log(path: Path) -> tuple[Any, str | None]:
    """Run the `analyze` engine on a mode's log; never raises."""
    from vllm_offload_doctor.analyze import analyze_file

    try:
        return analyze_file(path, display_name=path.name), None
    except Exception as exc:
        return None, f"log analysis failed: {type(exc).__name__}: {exc}"


def analysis_dicts(a: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(log facts, analyze verdict) as plain dicts for the report."""
    f = a.facts
    ranks = {
        name: {
            "offloader": r.offloader,
            "offloaded_gib": r.offloaded_gib,
            "model_loading_gib": r.model_loading_gib,
            "status": str(r.status),
        }
        for name, r in sorted(f.ranks.items())
    }
    facts = {
        "vllm_version": f.vllm_version,
        "model_runner": f.model_runner,
        "model_runner_evidence": f.model_runner_evidence,
        "cpu_offload_gb": f.cpu_offload_gb,
        "tensor_parallel_size": f.tensor_parallel_size,
        "offloader": f.offloader,
        "offloaded_gib": f.offloaded_gib,
        "model_loading_gib": f.model_loading_gib,
        "kv_cache_gib": f.kv_cache_gib,
        "kv_cache_tokens": f.kv_cache_tokens,
        "reached_ready": f.reached_ready,
        "ranks": ranks,
    }
    v = a.verdict
    verdict = {
        "category": str(v.category),
        "rule_id": v.rule_id,
        "title": v.title,
        "summary": v.summary,
        "severity": str(v.severity),
        "remedy": v.remedy,
        "links": list(v.links),
        "offload_status": str(a.offload.status),
        "offload_explanation": a.offload.explanation,
        "ranks_disagree": a.offload.ranks_disagree,
    }
    return facts, verdict


# ---------------------------------------------------------------------------- the run


class CompareRun:
    """Runs every mode in turn, keeps `report` up to date and on disk after every step."""

    def __init__(self, cfg: CompareConfig, progress: TextIO | None = None) -> None:
        self.cfg = cfg
        self.progress = progress
        self.out = cfg.out_dir
        self.report: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "offload-doctor", "version": __version__},
            "started_at": _now(),
            "finished_at": None,
            "complete": False,
            "interrupted": False,
            "config": {
                "vllm_cmd": redact_argv(cfg.vllm_cmd),
                "model": cfg.model,
                "revision": cfg.effective_revision,
                "served_model_name": cfg.served,
                "baseline_gb": cfg.baseline_gb,
                "offload_gb": cfg.offload_gb,
                "max_model_len": cfg.max_model_len,
                "host": cfg.host,
                "port": cfg.port,
                "repeats": cfg.repeats,
                "warmup": cfg.warmup,
                "stream": cfg.stream,
                "timeout_s": cfg.timeout_s,
                "tensor_parallel_size": cfg.tensor_parallel_size(),
                "extra_args": redact_argv(cfg.extra_args),
                "request": cfg.request_body(),
                "expect": cfg.expected_answers,
            },
            "environment": relevant_env(),
            "modes": [],
            "comparisons": [],
            "verdict": {"status": "inconclusive", "summary": "the run has not finished"},
        }

    def write(self) -> None:
        from vllm_offload_doctor.compare_render import render_markdown

        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write(
            self.out / "report.json", json.dumps(self.report, indent=2, ensure_ascii=False)
        )
        atomic_write(self.out / "report.md", render_markdown(self.report))

    def execute(self) -> int:
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write(self.out / "commands.txt", commands_text(cfg))
        self.write()
        try:
            n = len(cfg.modes())
            for i, gb in enumerate(cfg.modes()):
                mode = self.run_mode(i, n, gb)
                if i == 0 and mode["status"] != "ok":
                    self._say(f"baseline failed ({mode.get('reason')}); skipping the offload modes")
                    break
            self.decide()
            self.report["complete"] = True
        except KeyboardInterrupt:
            self.report["interrupted"] = True
            self.report["verdict"] = {
                "status": "inconclusive",
                "title": "interrupted",
                "summary": "Interrupted before every mode was measured; "
                "the partial figures are kept.",
                "remedy": "",
                "links": [],
                "notes": [],
            }
            raise
        except DoctorError as exc:
            self.report["error"] = str(exc)
            self.report["verdict"] = {
                "status": "inconclusive",
                "title": "could not run",
                "summary": str(exc),
                "remedy": "",
                "links": [],
                "notes": [],
            }
            raise
        finally:
            self.report["finished_at"] = _now()
            self.write()
        return 0 if self.report["verdict"]["status"] == "effective" else 1

    def _say(self, message: str) -> None:
        if self.progress is not None:
            self.progress.write(message + "\n")
            self.progress.flush()

    # ------------------------------------------------------------------ one mode

    def run_mode(self, i: int, n: int, gb: float) -> dict[str, Any]:
        from vllm_offload_doctor.ports import probe_port
        from vllm_offload_doctor.progress import LogFollower, Progress
        from vllm_offload_doctor.server import ServerProcess

        cfg = self.cfg
        label = fmt_gb(gb)
        log_path = self.out / f"mode-{label}.log"
        argv = cfg.argv(gb)
        mode: dict[str, Any] = {
            "label": label,
            "offload_gb": gb,
            "role": "baseline" if i == 0 else "offload",
            "command": redact_argv(argv),
            "log": log_path.name,
            "status": "starting",
        }
        self.report["modes"].append(mode)
        self.write()
        state = probe_port(cfg.host, cfg.port)
        if not state.free:
            mode["status"] = "not_started"
            mode["reason"] = state.describe()
            raise PortInUseError(f"{state.describe()}; stop it or choose another --port")
        prog = (
            Progress(f"{i + 1}/{n} offload {label} GiB", self.progress) if self.progress else None
        )
        follower = LogFollower(log_path)
        srv = ServerProcess(
            argv,
            log_path=log_path,
            host=cfg.host,
            port=cfg.port,
            served_model=cfg.served,
            grace_s=cfg.grace_s,
        )

        def tick(elapsed: float) -> None:
            phase = follower.poll()
            if prog:
                prog.update(elapsed, phase)

        try:
            try:
                srv.start()
            except OSError as exc:
                raise ServerStartError(f"cannot start {shlex.join(argv[:2])}: {exc}") from exc
            mode["pid"] = srv.pid
            res = srv.wait_ready(cfg.timeout_s, on_tick=tick)
            mode["startup_s"] = round(res.startup_s, 2)
            mode["phase"] = follower.poll()
            if res.ready:
                if prog:
                    prog.line(f"ready in {res.startup_s:.1f} s; measuring")
                self.measure(mode, srv)
            else:
                mode["status"] = "exited" if res.exited else "timeout"
                mode["returncode"] = res.returncode
                mode["reason"] = res.reason
                if prog:
                    prog.line(f"{res.reason} (last phase: {mode['phase']})")
        except KeyboardInterrupt:
            mode["status"] = "interrupted"
            mode["reason"] = "interrupted"
            raise
        finally:
            if prog:
                prog.done()
            stop = srv.stop()
            mode["stop"] = stop.to_dict()
            if stop.survivors:
                mode["leftover_pids"] = stop.survivors
            analysis, err = analyze_log(log_path)
            if analysis is not None:
                mode["log_facts"], mode["analysis"] = analysis_dicts(analysis)
            else:
                mode["analysis_error"] = err
            if mode["status"] != "ok" and analysis is not None and analysis.notable:
                mode["last_error_line"] = redact(analysis.notable[-1].text)[:400]
            if prog:
                prog.line(f"stopped in {stop.stop_s:.1f} s ({', '.join(stop.signals) or 'exited'})")
            self.write()
        return mode

    def measure(self, mode: dict[str, Any], srv: Any) -> None:
        import httpx

        from vllm_offload_doctor.measure import (
            RequestResult,
            chat_request,
            fetch_info,
            gpu_snapshot,
            host_rss,
            latency_stats,
        )

        cfg = self.cfg
        pids = srv.live_tree()
        mode["processes"] = _proc_list(pids)
        mode["gpu"] = gpu_snapshot(pids)
        mode["host_rss"] = host_rss(pids)
        info = fetch_info(srv.base_url())
        mode["server_version"] = info["version"]
        mode["metrics"] = info["metrics"]
        if info["errors"]:
            mode["info_errors"] = info["errors"]
        url = f"{srv.base_url()}/v1/chat/completions"
        body = cfg.request_body()
        expect = cfg.expected_answers
        warm: list[RequestResult] = []
        measured: list[RequestResult] = []
        with httpx.Client(trust_env=False) as client:
            for n, results in ((cfg.warmup, warm), (cfg.repeats, measured)):
                for _ in range(n):
                    results.append(chat_request(client, url, body, expect, cfg.request_timeout_s))
        mode["warmup_requests"] = [r.to_dict() for r in warm]
        mode["requests"] = [r.to_dict() for r in measured]
        mode["latency"] = latency_stats(measured)
        answers = Counter(r.answer for r in measured if r.answer is not None)
        mode["answers"] = [{"answer": a, "count": c} for a, c in answers.most_common(3)]
        checked = [r.matched for r in measured if r.matched is not None]
        mode["answers_matched"] = {"matched": sum(checked), "checked": len(checked)}
        ok = [r for r in measured if r.ok]
        if ok:
            mode["status"] = "ok"
        else:
            mode["status"] = "requests_failed"
            errors = Counter(r.error for r in measured)
            mode["reason"] = "every measured request failed: " + "; ".join(
                f"{e} (x{c})" for e, c in errors.most_common(2)
            )

    # ------------------------------------------------------------------ verdict

    def decide(self) -> None:
        modes = self.report["modes"]
        base = modes[0]
        comparisons = [compare_pair(base, off, self.cfg) for off in modes[1:]]
        if not comparisons:  # the baseline failed before any offload mode ran
            comparisons.append(compare_pair(base, None, self.cfg))
        self.report["comparisons"] = comparisons
        worst = max(comparisons, key=lambda c: STATUS_RANK[c["status"]])
        verdict = {k: worst[k] for k in ("status", "title", "summary", "remedy", "links")}
        notes = list(dict.fromkeys(n for c in comparisons for n in c.get("notes", [])))
        verdict["notes"] = [*notes, NVSMI_NOTE]
        if len(comparisons) > 1:
            verdict["per_offload"] = {c["offload_gb"]: c["status"] for c in comparisons}
            verdict["summary"] = " ".join(
                f"[offload {fmt_gb(c['offload_gb'])} GiB: {c['status']}] {c['summary']}"
                for c in comparisons
            )
        self.report["verdict"] = verdict


def _proc_list(pids: list[int]) -> list[dict[str, Any]]:
    from vllm_offload_doctor.measure import process_names

    names = process_names(pids)
    return [{"pid": p, "name": names.get(p)} for p in pids]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# ---------------------------------------------------------------------------- decision


def _failure(mode: dict[str, Any], which: str) -> dict[str, Any]:
    a = mode.get("analysis") or {}
    reason = mode.get("reason") or mode.get("status")
    title = f"the {which} mode failed"
    summary = f"The {which} mode (offload {mode['label']} GiB) {reason}."
    cat = a.get("category")
    if a and cat not in ("healthy", "unknown"):
        summary += f" Root cause from its log ({cat}): {a.get('summary')}"
        title = f"the {which} mode failed: {a.get('title') or cat}"
    elif mode.get("status") == "timeout":
        summary += (
            f" Its log ends in the phase '{mode.get('phase')}'; raise --timeout if it was still "
            "making progress, else read the log."
        )
    elif a:
        summary += " Its log names no known root cause; read the end of the log."
    if (not a or cat in ("healthy", "unknown")) and mode.get("last_error_line"):
        summary += f" Last error line: {mode['last_error_line']}"
    if mode.get("analysis_error"):
        summary += f" ({mode['analysis_error']})"
    notes = []
    if a.get("offload_status") == "ignored":
        notes.append(
            "analyze also found that --cpu-offload-gb was silently ignored in this mode: "
            f"{a.get('offload_explanation') or ''}".strip()
        )
    links = list(a.get("links") or [])
    remedy = a.get("remedy") or ""
    if a.get("offload_status") == "ignored":
        links += [link for link in MRV2_LINKS if link not in links]
        remedy = remedy or MRV2_REMEDY
    return {
        "status": "failed",
        "title": title,
        "summary": summary,
        "remedy": remedy,
        "links": links,
        "notes": notes,
        "failed_mode": mode["label"],
    }


def compare_pair(
    base: dict[str, Any], off: dict[str, Any] | None, cfg: CompareConfig
) -> dict[str, Any]:
    """The verdict for one offload mode against the baseline."""
    out: dict[str, Any] = {
        "offload_gb": off["offload_gb"] if off else None,
        "baseline_gb": base["offload_gb"],
    }
    if base.get("status") != "ok":
        return out | _failure(base, "baseline")
    assert off is not None
    if off.get("status") != "ok":
        return out | _failure(off, "offload")
    requested = off["offload_gb"] - base["offload_gb"]
    bf = base.get("log_facts") or {}
    of = off.get("log_facts") or {}
    oa = off.get("analysis") or {}
    notes: list[str] = []
    ranks = _rank_view(bf, of, requested)
    out["ranks"] = ranks
    out["requested_gib"] = requested
    base_load, off_load = bf.get("model_loading_gib"), of.get("model_loading_gib")
    out["weights_on_gpu_gib"] = {"baseline": base_load, "offload": off_load}
    delta = (
        round(base_load - off_load, 3) if base_load is not None and off_load is not None else None
    )
    out["weights_delta_gib"] = delta
    offloaded = of.get("offloaded_gib")
    out["offloaded_gib"] = offloaded

    if not of and not bf:
        return out | {
            "status": "inconclusive",
            "title": "no log analysis",
            "summary": "Both modes ran, but their logs could not be analysed "
            f"({off.get('analysis_error') or base.get('analysis_error')}).",
            "remedy": "Read mode logs by hand: look for `Total CPU offloaded parameters` and "
            "compare `Model loading took` between the modes.",
            "links": [],
            "notes": notes,
        }

    rank_states = {r["status"] for r in ranks.values()} if ranks else set()
    moved = offloaded is not None and offloaded > 0
    if ranks:
        moved = moved or rank_states == {"effective"}
    fell = delta is not None and delta >= 0.5 * _expected(requested, base_load)
    unchanged = delta is not None and abs(delta) < max(0.05, 0.2 * requested)

    if oa.get("offload_status") == "ignored" or (not moved and unchanged):
        runner = of.get("model_runner")
        v2 = runner == "v2" or oa.get("category") == "offload_ignored"
        summary = (
            f"--cpu-offload-gb {fmt_gb(off['offload_gb'])} was requested but nothing moved: "
            f"weights on GPU {_gib(base_load)} vs {_gib(off_load)} GiB"
            " and no `Total CPU offloaded parameters` line."
        )
        if v2:
            summary += (
                f" vLLM {of.get('vllm_version') or '?'} used Model Runner V2, which never installs "
                "the weight offloader before 0.28.0."
            )
        elif oa.get("offload_explanation"):
            summary += " " + str(oa["offload_explanation"])
        else:
            summary += (
                " Possible causes: the model does not build its layers with make_layers, a "
                "--cpu-offload-params filter matched nothing, or --offload-backend prefetch."
            )
        links = list(oa.get("links") or [])
        if v2:
            links += [link for link in MRV2_LINKS if link not in links]
        remedy = MRV2_REMEDY if v2 else (oa.get("remedy") or "Check the offload flags in the log.")
        return out | {
            "status": "ignored",
            "title": "offload flag silently ignored",
            "summary": summary,
            "remedy": remedy,
            "links": links,
            "notes": notes,
        }

    if moved or fell:
        if ranks and len(rank_states) > 1:
            bad = sorted(k for k, r in ranks.items() if r["status"] != "effective")
            return out | {
                "status": "inconclusive",
                "title": "ranks disagree",
                "summary": f"Offload took effect on some ranks but not on {', '.join(bad)}.",
                "remedy": "Read each rank's `Total CPU offloaded parameters` line in the log.",
                "links": [],
                "notes": notes,
            }
        if moved and delta is not None and not fell:
            notes.append(
                f"The log reports {offloaded} GiB offloaded, but `Model loading took` fell only "
                f"{delta:g} GiB."
            )
        perf = performance(base, off, offloaded if offloaded else (delta or 0.0))
        out["performance"] = perf
        summary = (
            f"Offload took effect: {_gib(offloaded) if offloaded else '?'} GiB per GPU in host "
            f"memory; weights on GPU {_gib(base_load)} -> {_gib(off_load)} GiB."
        )
        if perf.get("text"):
            summary += " " + perf["text"]
        return out | {
            "status": "effective",
            "title": "offload took effect",
            "summary": summary,
            "remedy": "",
            "links": [],
            "notes": notes + perf.get("notes", []),
        }

    missing = [n for n, v in (("baseline", base_load), ("offload", off_load)) if v is None]
    why = (
        f"`Model loading took` is missing from the {' and '.join(missing)} log"
        if missing
        else f"weights on GPU fell by {delta:g} GiB, neither about 0 nor about {requested:g} GiB"
    )
    return out | {
        "status": "inconclusive",
        "title": "no measurable difference",
        "summary": f"Cannot tell whether offloading took effect: {why}, and the log has no "
        "`Total CPU offloaded parameters` line.",
        "remedy": "Check the vLLM version (the offload log lines exist from 0.17), the "
        "--offload-backend, and the mode logs; a larger --offload-gb makes the difference clearer.",
        "links": [],
        "notes": notes,
    }


def _expected(requested: float, base_load: float | None) -> float:
    """The weights a request can move: not more than what the baseline holds."""
    if base_load is None:
        return requested
    return max(0.0, min(requested, base_load * 0.95))


def _rank_view(bf: dict[str, Any], of: dict[str, Any], requested: float) -> dict[str, Any]:
    """Per-rank offload verdict: each TP rank logs its own lines (the budget is per GPU)."""
    oranks = of.get("ranks") or {}
    branks = bf.get("ranks") or {}
    view = {}
    for name, r in oranks.items():
        b = branks.get(name) or {}
        bl, ol = b.get("model_loading_gib"), r.get("model_loading_gib")
        delta = round(bl - ol, 3) if bl is not None and ol is not None else None
        off = r.get("offloaded_gib")
        if (off is not None and off > 0) or (
            delta is not None and delta >= 0.5 * _expected(requested, bl)
        ):
            status = "effective"
        elif delta is not None and abs(delta) < max(0.05, 0.2 * requested):
            status = "ignored"
        else:
            status = "unknown"
        view[name] = {
            "offloaded_gib": off,
            "model_loading_gib": {"baseline": bl, "offload": ol},
            "weights_delta_gib": delta,
            "status": status,
        }
    return view


def performance(base: dict[str, Any], off: dict[str, Any], offloaded_gib: float) -> dict[str, Any]:
    """Slowdown and extra time per output token, against what the host link allows."""
    bl, ol = base.get("latency") or {}, off.get("latency") or {}
    bmed, omed = bl.get("median_s"), ol.get("median_s")
    perf: dict[str, Any] = {"notes": []}
    if not bmed or not omed:
        perf["text"] = "No latency figures to compare."
        return perf
    perf["slowdown"] = round(omed / bmed, 2)
    tokens = ol.get("completion_tokens_median") or bl.get("completion_tokens_median")
    text = f"Median latency {bmed * 1e3:.0f} -> {omed * 1e3:.0f} ms ({perf['slowdown']:.2f}x)"
    extra = None
    if tokens:
        extra = (omed - bmed) * 1e3 / tokens
        perf["extra_ms_per_token"] = round(extra, 2)
        text += f", {extra:+.1f} ms per output token"
    text += "."
    bw, link = _link(off)
    perf["link"] = link
    if bw and offloaded_gib > 0:
        usable = bw * PRACTICAL_FRACTION
        bound = step_cost_ms(offloaded_gib, usable)
        floor = step_cost_ms(offloaded_gib, bw)
        perf["link_bound_ms_per_token"] = round(bound, 2)
        perf["link_floor_ms_per_token"] = round(floor, 2)
        text += (
            f" Every decode step reads the {offloaded_gib:g} GiB offloaded per GPU over the host "
            f"link ({link.get('desc')}): about {bound:.1f} ms per token at the ~{usable:.0f} GB/s "
            f"pinned copies usually reach, never less than {floor:.1f} ms at the raw {bw:.0f} GB/s."
        )
        if extra is not None and extra > 0:
            perf["measured_vs_bound"] = round(extra / bound, 2)
    elif offloaded_gib > 0:
        perf["notes"].append(f"PCIe link bandwidth unknown ({link.get('reason')}).")
    if extra is not None and extra > 0 and offloaded_gib > 0:
        implied = offloaded_gib * 2**30 / (extra / 1e3) / 1e9
        perf["implied_gbs"] = round(implied, 1)
        text += f" Measured: {extra:.1f} ms per token, about {implied:.0f} GB/s."
    elif extra is not None and offloaded_gib > 0:
        perf["notes"].append(
            "The offload mode was not slower: latency noise, too few --repeats, or the offloaded "
            "layers were not on the decode path."
        )
    perf["text"] = text
    return perf


def _link(mode: dict[str, Any]) -> tuple[float | None, dict[str, Any]]:
    gpu = mode.get("gpu") or {}
    if not gpu.get("available"):
        return None, {"reason": gpu.get("reason") or "no NVML reading"}
    devs = [d for d in gpu.get("devices", []) if d.get("tree_processes")] or gpu.get("devices", [])
    bws = [
        (d["pcie"]["bandwidth_gbs"], d) for d in devs if (d.get("pcie") or {}).get("bandwidth_gbs")
    ]
    if not bws:
        return None, {"reason": "NVML reports no PCIe link"}
    bw, d = min(bws, key=lambda x: x[0])
    p = d["pcie"]
    return bw, {
        "desc": f"PCIe gen{p['max_gen']} x{p['max_width']}",
        "bandwidth_gbs": bw,
        "device": d["index"],
        "current_gen": p["current_gen"],
        "current_width": p["current_width"],
    }


def _gib(v: float | None) -> str:
    return "?" if v is None else f"{v:g}"

