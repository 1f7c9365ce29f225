"""What one `compare` run does: the model, the modes, the server argv and the request."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from vllm_offload_doctor.errors import DoctorError, ServerStartError

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
DEFAULT_REVISION = "c1899de289a04d12100db370d81485cdf75e47ca"
DEFAULT_PROMPT = "Назови одним словом столицу Франции. /no_think"
DEFAULT_EXPECT = ("Париж", "Paris")
DEFAULT_TIMEOUT_S = 900.0  # a 150 GiB model with offload takes ~140 s; leave room for slow disks
# Pinning the offload adds about X / 0.6 s to start-up (H200); the default allows twice that.
TIMEOUT_PER_OFFLOADED_S = 2 / 0.6
# The escape hatch that makes the V1 runner (which honours --cpu-offload-gb) the default again.
V1_RUNNER_ENV = ("VLLM_USE_V2_MODEL_RUNNER", "0")
# Flags compare sets itself; passing them after `--` would make the two modes differ.
MANAGED_FLAGS = (
    "--cpu-offload-gb",
    "--host",
    "--port",
    "--max-model-len",
    "--served-model-name",
    "--revision",
)
SECRET_FLAGS = ("--api-key",)
# Managed flags that are the same in every mode: after `--` they are taken as compare's own.
ABSORBED_FLAGS = {"--max-model-len": "max_model_len", "--served-model-name": "served_model_name"}
DEFAULT_MAX_MODEL_LEN = 2048


def absorb_passthrough(
    extra: list[str], own: dict[str, str | int | None]
) -> tuple[list[str], dict[str, str | int | None]]:
    """Take `--max-model-len N` / `--served-model-name S` given after `--` as compare's options.

    They are the same in every mode, so `vllm serve`-style command lines work unchanged; a value
    that contradicts compare's own option is an error.
    """
    rest: list[str] = []
    values = dict(own)
    i = 0
    while i < len(extra):
        arg = extra[i]
        flag, eq, inline = arg.partition("=")
        if flag not in ABSORBED_FLAGS:
            rest.append(arg)
            i += 1
            continue
        if eq:
            value, i = inline, i + 1
        elif i + 1 < len(extra):
            value, i = extra[i + 1], i + 2
        else:
            raise DoctorError(f"{flag} after `--` needs a value")
        key = ABSORBED_FLAGS[flag]
        typed: str | int = value
        if key == "max_model_len":
            try:
                typed = int(value)
            except ValueError:
                raise DoctorError(f"{flag} {value!r} is not a whole number") from None
        if values.get(key) is not None and values[key] != typed:
            raise DoctorError(
                f"{flag} {value} after `--` contradicts compare's {flag} {values[key]}; give it once"
            )
        values[key] = typed
    return rest, values


TP_FLAGS = ("--tensor-parallel-size", "-tp")


def with_tensor_parallel(extra: list[str], size: int | None) -> list[str]:
    """`extra` with compare's `-tp N` added for `vllm serve`; the same value after `--` is fine,
    another one is an error."""
    if size is None:
        return extra
    if size < 1:
        raise DoctorError(f"--tensor-parallel-size {size}: must be 1 or more")
    for i, arg in enumerate(extra):
        flag, eq, inline = arg.partition("=")
        if flag not in TP_FLAGS:
            continue
        value = inline if eq else (extra[i + 1] if i + 1 < len(extra) else "")
        if value.strip() != str(size):
            raise DoctorError(
                f"{flag} {value} after `--` contradicts compare's --tensor-parallel-size "
                f"{size}; give it once"
            )
        return extra
    return [*extra, "--tensor-parallel-size", str(size)]


def looks_local(model: str) -> bool:
    """A path, not a hub id: `/x`, `./x`, `../x`, `~/x`, or more than one `/` (`org/name` is an id)."""
    if "://" in model:  # a URL is for vLLM to fetch, not a path
        return False
    return model.startswith(("/", "./", "../", "~")) or model in (".", "..") or model.count("/") > 1


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
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    host: str = "127.0.0.1"
    port: int = 8000
    repeats: int = 5
    warmup: int = 1
    prompt: str = DEFAULT_PROMPT
    expect: list[str] | None = None  # None: Париж/Paris for the default prompt, no check otherwise
    max_tokens: int = 32
    stream: bool = False
    timeout_s: float | None = None  # None: DEFAULT_TIMEOUT_S, more for a larger offload
    request_timeout_s: float = 300.0
    out_dir: Path = Path("offload-doctor-runs")
    extra_args: list[str] = field(default_factory=list)
    grace_s: float = 10.0
    verify_fix: bool = False
    force: bool = False
    strict: bool = False  # stop before any server starts when the host cannot hold an offload

    def timeout_for(self, gb: float) -> float:
        """Seconds the mode offloading `gb` GiB per GPU may take to become ready."""
        if self.timeout_s is not None:
            return self.timeout_s
        return DEFAULT_TIMEOUT_S + TIMEOUT_PER_OFFLOADED_S * max(0.0, gb)

    def exposure(self) -> str | None:
        """A warning when each server binds more than the loopback: others can reach it."""
        if _loopback(self.host):
            return None
        where = (
            "every network this machine is on"
            if self.host in ("0.0.0.0", "::", "")
            else (f"the network of {self.host}")
        )
        return (
            f"--host {self.host}: each vllm serve listens on {self.host}:{self.port}, reachable "
            f"from {where} while it runs (anyone who can connect may send requests); "
            "--host 127.0.0.1 keeps it on this machine"
        )

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

    def request_body(self) -> dict[str, object]:
        body: dict[str, object] = {
            "model": self.served,
            "messages": [{"role": "user", "content": self.prompt}],
            "max_tokens": self.max_tokens,
            "stream": self.stream,
        }
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def _extra_value(self, *flags: str) -> str | None:
        args = self.extra_args
        for i, a in enumerate(args):
            for flag in flags:
                if a == flag and i + 1 < len(args):
                    return args[i + 1]
                if a.startswith(flag + "="):
                    return a.split("=", 1)[1]
        return None

    def tensor_parallel_size(self) -> int:
        value = self._extra_value(*TP_FLAGS)
        if value is not None:
            with contextlib.suppress(ValueError):
                return int(value)
        return 1

    def gpu_memory_utilization(self) -> float | None:
        value = self._extra_value("--gpu-memory-utilization")
        if value is not None:
            with contextlib.suppress(ValueError):
                return float(value)
        return None

    def api_key(self, env: dict[str, str] | None = None) -> str | None:
        """The key the server will demand: `--api-key` after `--`, else VLLM_API_KEY."""
        key = self._extra_value(*SECRET_FLAGS)
        if key:
            return key
        return (os.environ if env is None else env).get("VLLM_API_KEY") or None

    def fix_env(self, env: dict[str, str] | None = None) -> dict[str, str] | None:
        """The environment --verify-fix adds, or None when off or already in effect."""
        name, value = V1_RUNNER_ENV
        if not self.verify_fix or (os.environ if env is None else env).get(name) == value:
            return None
        return {name: value}

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
        if not 1 <= self.port <= 65535:
            raise DoctorError(f"--port {self.port}: must be 1-65535")
        for flag, value in (
            ("--timeout", DEFAULT_TIMEOUT_S if self.timeout_s is None else self.timeout_s),
            ("--request-timeout", self.request_timeout_s),
            ("--max-tokens", self.max_tokens),
        ):
            if not value > 0:  # also refuses NaN
                raise DoctorError(f"{flag} {value:g}: must be more than 0")
        if not self.grace_s >= 0:
            raise DoctorError(f"--grace {self.grace_s:g}: must be 0 or more")
        for a in self.extra_args:
            flag = a.split("=", 1)[0]
            own = "--offload-gb" if flag == "--cpu-offload-gb" else flag
            if flag in MANAGED_FLAGS:
                raise DoctorError(
                    f"{flag} after `--` would make the modes differ or clash with compare's own "
                    f"options; use compare's {own}"
                )

    def check_model(self) -> None:
        """A local-looking --model that is missing fails now, not minutes into a load.

        Not part of validate(): --dry-run prints commands for another machine."""
        if looks_local(self.model) and not Path(self.model).expanduser().exists():
            from vllm_offload_doctor.redact import scrub_text

            raise DoctorError(f"--model {scrub_text(self.model)}: no such file or directory")

    def check_command(self) -> None:
        exe = self.vllm_cmd[0]
        found = (
            shutil.which(exe) if os.sep not in exe else (exe if os.access(exe, os.X_OK) else None)
        )
        if not found:
            raise ServerStartError(
                f"cannot run {exe!r}: not found or not executable (see --vllm-cmd)"
            )


def _loopback(host: str) -> bool:
    import ipaddress

    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it resolves to some interface's address
