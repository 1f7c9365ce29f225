"""The Python that runs vLLM, and the vLLM version.

`python`: the interpreter behind `vllm` on PATH (or `--python PATH`) against the installed vLLM's
`Requires-Python`; without vLLM, against current vLLM's (>=3.11,<3.15). The line says how it was
found. With no `vllm` on PATH, offload-doctor's own Python (a pipx or uv tool environment of its
own) is not taken for vLLM's: it is neither passed nor told to `pip install vllm`.

`vllm`: 0.12.0-0.27.1 silently ignore `--cpu-offload-gb` under Model Runner V2 (vLLM issue #51396,
fixed in 0.28.0 by PR #51413). V2 is the default for dense models from 0.25 and for some
architectures from 0.22, so those versions fail or warn unless `VLLM_USE_V2_MODEL_RUNNER=0`;
`=1` fails on any affected version. Before 0.17 offload works but nothing in the log confirms it.
"""

from __future__ import annotations

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from vllm_offload_doctor import runner
from vllm_offload_doctor.checks.context import Context
from vllm_offload_doctor.checks.model import CheckResult, Result, Status
from vllm_offload_doctor.checks.registry import register
from vllm_offload_doctor.links import MRV2, PR_MRV2_FIX
from vllm_offload_doctor.machine.probes import InterpreterInfo

CURRENT_REQUIRES_PYTHON = ">=3.11,<3.15"  # vLLM 0.32 and 0.33


def found_by(it: InterpreterInfo) -> str:
    """How the interpreter was chosen, in a few words for the check's line."""
    if it.source == "--python":
        return "--python"
    if it.source.startswith("shebang of "):
        return "behind `vllm` on PATH"
    return "offload-doctor's own"


def own_without_vllm(it: InterpreterInfo) -> bool:
    """The doctor's own interpreter, with no vLLM: nothing here is vLLM's to judge."""
    return it.own and not it.error and not it.vllm_version


@register("python", "Python")
def check_python(ctx: Context, r: Result) -> CheckResult:
    it = ctx.interpreter
    details = (f"interpreter: {it.executable}", f"chosen by: {it.source}")
    if own_without_vllm(it):
        return r.skip(
            "no vLLM interpreter found: no `vllm` on PATH, and offload-doctor's own Python "
            "has no vLLM (pass vLLM's with --python)",
            details,
        )
    if it.error or not it.python_version:
        return r.fail(
            f"cannot query {it.executable}: {it.error}",
            details,
            remedy="Pass the interpreter that runs vLLM with --python PATH.",
        )
    spec_text = it.vllm_requires_python
    name = f"Python {it.python_version} ({found_by(it)})"
    if it.vllm_version and not spec_text:
        return r.ok(f"{name}: vLLM {it.vllm_version} declares no Requires-Python", details)
    who = f"vLLM {it.vllm_version}" if it.vllm_version else "current vLLM (0.32/0.33)"
    spec_text = spec_text or CURRENT_REQUIRES_PYTHON
    try:
        fits = Version(it.python_version) in SpecifierSet(spec_text)
    except (InvalidSpecifier, InvalidVersion):
        return r.warn(f"{name}; cannot read {who}'s Requires-Python {spec_text!r}", details)
    if fits:
        return r.ok(f"{name} meets {who}'s Requires-Python {spec_text}", details)
    return r.make(
        Status.FAIL if it.vllm_version else Status.WARN,
        f"{name} is outside {who}'s Requires-Python {spec_text}",
        details,
        remedy="Create a virtual environment with a supported Python (3.11-3.14 for vLLM 0.32+).",
    )


@register("vllm", "vLLM")
def check_vllm(ctx: Context, r: Result) -> CheckResult:
    it = ctx.interpreter
    if it.error:
        return r.skip("the interpreter could not be queried")
    if own_without_vllm(it):
        return r.fail(
            "vLLM not found: no `vllm` on PATH (offload-doctor's own Python is not vLLM's)",
            (f"offload-doctor runs on {it.executable}",),
            remedy="Activate vLLM's environment, or pass its interpreter with --python "
            "/path/to/vllm-venv/bin/python (vLLM belongs in an environment of its own).",
        )
    if not it.vllm_version:
        return r.fail(
            f"vLLM is not installed for {it.executable}",
            remedy=f"{it.executable} -m pip install vllm (or pass the interpreter that has it "
            "with --python).",
        )
    details = (f"vllm {it.vllm_version}", f"torch {it.torch_version or 'not installed'}")
    version = ctx.vllm_version
    if version is None:
        return r.warn(f"vLLM {it.vllm_version}: version not understood", details)
    env_v2 = ctx.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    name = f"vLLM {it.vllm_version} (torch {it.torch_version or 'missing'})"
    ignored = f"{name}: --cpu-offload-gb is silently ignored by Model Runner V2 ({runner.WINDOW})"
    fix = "Upgrade to vLLM 0.28.0 or later, or export VLLM_USE_V2_MODEL_RUNNER=0."
    if version >= runner.FIXED_IN:
        return r.ok(
            f"{name}: offload works on both model runners (fixed in 0.28.0)",
            details,
            links=(PR_MRV2_FIX,),
        )
    if version >= runner.V2_IGNORES_FROM and env_v2 == "1":
        return r.fail(
            f"{ignored}, and VLLM_USE_V2_MODEL_RUNNER=1 selects it", details, remedy=fix, links=MRV2
        )
    if version >= Version("0.25"):
        if env_v2 == "0":
            return r.ok(
                f"{name}: VLLM_USE_V2_MODEL_RUNNER=0 keeps the V1 runner, where offload works",
                details,
                links=MRV2,
            )
        return r.fail(
            f"{ignored}; V2 is the default for dense models from 0.25",
            details,
            remedy=fix,
            links=MRV2,
        )
    if version >= runner.V1_ESCAPE_FROM and env_v2 != "0":
        return r.warn(
            f"{ignored}; V2 is already the default for some architectures (Llama, Mistral, "
            "Qwen3 and more)",
            details,
            remedy=fix,
            links=MRV2,
        )
    if version < Version("0.17"):
        return r.warn(
            f"{name}: offload works, but before 0.17 nothing in the log confirms offload",
            details,
            remedy="Use `offload-doctor compare` to see whether offload took effect, or upgrade.",
            links=MRV2 if version >= runner.V2_IGNORES_FROM else (),
        )
    return r.ok(f"{name}: offload works on the default V1 runner", details, links=MRV2)
