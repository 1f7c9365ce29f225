"""The run folder: its lock, the exact commands, scrubbed logs and the report files.

Every run gets a folder of its own; a folder another run is using (its lock is held) or that
holds an earlier run's report is refused (`--force` clears our own known artifacts first).
Everything written here passes through redact.py (`scrub_argv`, `scrub_env`, `scrub_text`,
`scrub_file`) so no secret reaches a saved file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import shlex
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO

from vllm_offload_doctor.compare.config import CompareConfig, fmt_gb
from vllm_offload_doctor.errors import DoctorError
from vllm_offload_doctor.redact import scrub_argv, scrub_data, scrub_env, scrub_file

ENV_PREFIXES = ("VLLM_", "CUDA_", "NCCL_", "PYTORCH_", "TORCH_", "HF_", "NVIDIA_", "TRANSFORMERS_")
LOCK_NAME = ".offload-doctor.lock"
KNOWN_FILES = ("report.json", "report.md", "report.html", "commands.txt")
KNOWN_GLOBS = (
    "mode-*.log",
    ".report.json.tmp-*",
    ".report.md.tmp-*",
    ".report.html.tmp-*",
    ".commands.txt.tmp-*",
)


def relevant_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables that shape a vLLM run, masked (`scrub_env`): they go into every artifact."""
    env = dict(os.environ if env is None else env)
    return scrub_env({k: env[k] for k in sorted(env) if k.startswith(ENV_PREFIXES)})


def commands_text(cfg: CompareConfig, fix_env: Mapping[str, str] | None = None) -> str:
    lines = ["# offload-doctor compare: the exact commands (secrets redacted)", ""]
    env = relevant_env()
    if env:
        lines.append("# environment passed unchanged to every mode:")
        lines += [f"#   {k}={v}" for k, v in env.items()]
        lines.append("")
    for gb in cfg.modes():
        lines.append(f"# offload {fmt_gb(gb)} GiB")
        lines.append(shlex.join(scrub_argv(cfg.argv(gb))))
    if fix_env:
        assign = " ".join(f"{k}={v}" for k, v in fix_env.items())
        lines.append(
            "# --verify-fix, only if offload is ignored on vLLM 0.22-0.27.x: "
            f"offload {fmt_gb(cfg.offload_gb[0])} GiB again"
        )
        lines.append(f"{assign} " + shlex.join(scrub_argv(cfg.argv(cfg.offload_gb[0]))))
    body = json.dumps(scrub_data(cfg.request_body()), ensure_ascii=False)
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    auth = " -H 'authorization: Bearer ***'" if cfg.api_key() else ""
    lines += [
        "",
        f"# request: {cfg.warmup} warm-up + {cfg.repeats} measured, identical in every mode",
        f"curl -s http://{host}:{cfg.port}/v1/chat/completions "
        f"-H 'content-type: application/json'{auth} -d {shlex.quote(body)}",
    ]
    return "\n".join(lines) + "\n"


def commands_data(
    cfg: CompareConfig, fix_env: Mapping[str, str] | None = None
) -> dict[str, object]:
    """What `commands_text` says, as data: `compare --dry-run --format json`."""
    verify = None
    if fix_env:
        gb = cfg.offload_gb[0]
        verify = {"offload_gb": gb, "env": dict(fix_env), "argv": scrub_argv(cfg.argv(gb))}
    return {
        "dry_run": True,
        "environment": relevant_env(),
        "modes": [{"offload_gb": gb, "argv": scrub_argv(cfg.argv(gb))} for gb in cfg.modes()],
        "verify_fix": verify,
        "request": {
            "warmup": cfg.warmup,
            "repeats": cfg.repeats,
            "url": f"http://{f'[{cfg.host}]' if ':' in cfg.host else cfg.host}:{cfg.port}"
            "/v1/chat/completions",
            "body": scrub_data(cfg.request_body()),
        },
    }


def open_new(path: Path) -> int:
    """A new file for writing, never through a link planted under its name (O_EXCL|O_NOFOLLOW).

    Only for our own temporary names: whatever sits there (a planted link, a file left by a killed
    run of the same pid) is unlinked first, which never follows a link."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with os.fdopen(open_new(tmp), "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # replaces a link at `path` itself, never its target
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_error(path, exc) from exc


class WriteError(DoctorError):
    """The artifacts folder is not writable (read-only, full disk): one line, exit 2."""


class DiskFull(WriteError):
    """No room left where the run writes (--out, or TMPDIR's server logs): named, exit 2."""

    kind = "disk_full"


_FULL = (errno.ENOSPC, errno.EDQUOT)


def write_error(path: Path, exc: OSError, doing: str = "") -> WriteError:
    """The one-line error for a failed write of `path`; a full disk is a DiskFull."""
    cls = DiskFull if exc.errno in _FULL else WriteError
    return cls(f"{doing or f'cannot write {path}'}: {exc.strerror or exc}")


# A server needs this much room for its log to start; with less than FULL_BYTES left after it
# ran, its log was most likely cut short.
MIN_FREE_BYTES = 64 << 10
FULL_BYTES = 8 << 10
RAW_WHERE = "TMPDIR, where the raw server logs are kept"


def no_room(folder: Path, below: int = MIN_FREE_BYTES, what: str = RAW_WHERE) -> DiskFull | None:
    """A DiskFull naming `folder` when its file system has less than `below` bytes left.

    A server whose log cannot be written dies or goes silent; read as a server failure, that
    gave a contradictory verdict (issue 20: TMPDIR on a 4 KB tmpfs, "the baseline failed
    (Server healthy)"). It is the machine's state: named as such, before or after a server runs.
    """
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    # root may write into the blocks reserved for it; anyone else stops at f_bavail.
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    if free >= below:
        return None
    return DiskFull(
        f"no space left on the device of {folder} ({what}): {free // 1024} KiB free; "
        "free some space or set TMPDIR to a folder with room"
    )


def default_out_dir(base: Path = Path("offload-doctor-runs")) -> Path:
    """A folder no other run shares: the time to the second plus a random suffix."""
    return base / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


@contextlib.contextmanager
def claim(out: Path, *, force: bool) -> Iterator[None]:
    """Hold the folder for this run (flock: released even if we are killed).

    The lock file is removed when the run ends however it ends (after a SIGKILL, by the run's
    janitor; were it left, the lock is not, so the next run proceeds).
    """
    lock = _lock(out)
    try:
        if (out / "report.json").exists():
            if not force:
                raise DoctorError(
                    f"--out {out} holds the report of an earlier run; choose another --out, "
                    "or --force to replace it"
                )
            clear_known(out)
        try:
            lock.seek(0)
            lock.truncate()
            lock.write(f"{os.getpid()}\n")
            lock.flush()
        except OSError as exc:
            raise write_error(out / LOCK_NAME, exc) from exc
        yield
    finally:
        # Unlinked while still held: a run that opened it a moment ago finds it held and stops,
        # and one that locks it after we close sees it is no longer the folder's lock.
        with contextlib.suppress(OSError):
            (out / LOCK_NAME).unlink()
        lock.close()


def _lock(out: Path) -> IO[str]:
    """The folder's lock file, open and locked by us; DoctorError when another run holds it."""
    path = out / LOCK_NAME
    if out.is_symlink():  # a link could point the run into someone else's folder
        raise WriteError(f"cannot use --out {out}: it is a symbolic link; give the real folder")
    for _ in range(10):
        try:
            out.mkdir(parents=True, exist_ok=True)
            # O_NOFOLLOW: a planted link named like the lock would make us overwrite its target.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise WriteError(
                    f"cannot use --out {out}: {LOCK_NAME} is a symbolic link; remove it"
                ) from None
            raise WriteError(f"cannot use --out {out}: {exc.strerror or exc}") from exc
        lock: IO[str] = os.fdopen(fd, "r+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = lock.read().strip() or "?"
            lock.close()
            raise DoctorError(
                f"--out {out} is in use by another offload-doctor run (pid {holder}); "
                "give each run its own --out"
            ) from None
        try:
            held = os.fstat(fd)
            now = os.stat(path)
        except OSError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return lock
        lock.close()  # the run that held it removed it as we locked it: take the new one
    raise DoctorError(f"--out {out}: could not take its lock; give each run its own --out")


def clear_known(out: Path) -> None:
    """Remove the files an earlier run of ours left (nothing else in the folder)."""
    paths = [out / n for n in KNOWN_FILES] + [p for g in KNOWN_GLOBS for p in out.glob(g)]
    for p in paths:
        try:
            p.unlink(missing_ok=True)
        except OSError as exc:
            raise WriteError(f"cannot clear {p}: {exc.strerror or exc}") from exc


def save_scrubbed_log(raw: Path, dest: Path) -> None:
    """Scrub a server log in place in its private folder (`scrub_file`: streamed, memory bounded),
    copy it beside `dest` into a new file and rename it over `dest`."""
    import shutil

    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        scrub_file(raw)
    except FileNotFoundError:
        return  # the server never wrote a log
    except OSError as exc:  # in the private folder under TMPDIR, not in --out
        raise write_error(raw, exc, f"cannot mask {raw} in place ({RAW_WHERE})") from exc
    try:
        with open(raw, "rb") as src, os.fdopen(open_new(tmp), "wb") as out:
            shutil.copyfileobj(src, out)
        os.replace(tmp, dest)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if raw.exists():
            raise WriteError(f"cannot write {dest}: no such folder") from None
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_error(dest, exc) from exc


RAW_PREFIX = "offload-doctor-raw-"
JANITOR = str(Path(__file__).with_name("janitor.py"))


@contextlib.contextmanager
def janitor(out: Path, raw: Path) -> Iterator[None]:
    """A process that removes `raw` and the --out lock file if this one is killed (janitor.py);
    stopped before a normal end, which removes both itself."""
    import subprocess
    import sys

    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", JANITOR, str(os.getpid()), str(out / LOCK_NAME), str(raw)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl+C of the terminal is the doctor's to handle
        )
    except OSError:  # no cleanup after a SIGKILL, as before; the run itself goes on
        yield
        return
    try:
        yield
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def raw_dir_prefix() -> str:
    """The private folder of raw server logs carries our pid, so a later run can tell it is dead."""
    return f"{RAW_PREFIX}{os.getpid()}-"


def sweep_raw_dirs(tmp: Path) -> None:
    """Remove raw (unscrubbed) log folders left by runs that were killed (SIGKILL, OOM killer)."""
    import shutil

    with contextlib.suppress(OSError):
        for d in tmp.glob(RAW_PREFIX + "*-*"):
            pid = d.name[len(RAW_PREFIX) :].split("-", 1)[0]
            if not pid.isdigit() or d.is_symlink() or not d.is_dir():
                continue
            try:
                if d.stat().st_uid != os.getuid():
                    continue
                os.kill(int(pid), 0)
            except ProcessLookupError:
                shutil.rmtree(d, ignore_errors=True)
            except OSError:
                continue
