"""A full disk is named as such (exit 2, one line, JSON in JSON mode), never read as a server
failure or a bug, and what was written before stays."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_compare_e2e import FAKE, _argv, _env, free_port, kill_marked

from vllm_offload_doctor import cli, common_cli, exitcodes

REPO = Path(__file__).resolve().parents[2]
LOG = REPO / "fixtures" / "logs" / "oom-weights-0.25.1.log"


def _full(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/full/report.json")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        cli.main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_output_file_on_a_full_disk(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(common_cli, "write_atomically", _full)
    code, _, err = run(capsys, "analyze", str(LOG), "-o", str(tmp_path / "r.txt"))
    assert code == exitcodes.USAGE
    assert "no space left on the device writing /full/report.json" in err
    assert "Traceback" not in err and "bug" not in err and len(err.strip().splitlines()) == 1


def test_a_full_disk_in_json_mode_is_a_json_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(common_cli, "write_atomically", _full)
    code, out, _ = run(
        capsys, "analyze", str(LOG), "--format", "json", "-o", str(tmp_path / "r.json")
    )
    doc = json.loads(out[out.rindex('{\n  "schema_version"') :])  # after the text view beside -o
    assert code == doc["exit_code"] == exitcodes.USAGE
    assert doc["error"]["kind"] == "disk_full"


def test_another_os_error_is_still_a_bug(monkeypatch, capsys, tmp_path):
    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(common_cli, "write_atomically", broken)
    code, _, err = run(capsys, "analyze", str(LOG), "-o", str(tmp_path / "r.txt"))
    assert code == exitcodes.INTERNAL and "a bug of offload-doctor" in err


def test_compare_on_a_full_disk_stops_its_servers_and_keeps_the_report(tmp_path):
    # The disk fills when the first mode's log is saved: a state of the machine, not of vLLM.
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import errno, os\n"
        "from vllm_offload_doctor.compare import artifacts\n"
        "def full(raw, dest):\n"
        "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dest))\n"
        "artifacts.save_scrubbed_log = full\n"
    )
    marker = uuid.uuid4().hex
    env = _env("effective", marker)
    env["PYTHONPATH"] = os.pathsep.join([str(inject), str(REPO), env.get("PYTHONPATH", "")])
    out = tmp_path / "run"
    try:
        proc = subprocess.run(
            _argv(out, free_port()),
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        leftovers = kill_marked(marker)
    assert leftovers == [], f"processes left behind: {leftovers}"
    assert FAKE.exists()
    assert proc.returncode == exitcodes.USAGE, proc.stderr
    assert "no space left on the device writing" in proc.stderr
    assert "Traceback" not in proc.stderr and "bug" not in proc.stderr
    assert json.loads((out / "report.json").read_text())["schema_version"] == 1


# -- a full TMPDIR, where the raw server logs go (issue 20 item 7) ----------------------------
# fefc042: a 4 KiB tmpfs hung the run until it was killed; a TMPDIR that filled while the
# baseline started gave "FAILED the baseline mode failed ... exited with status 1" (exit 1).


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a real full TMPDIR needs root to mount a small tmpfs")
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize(
    ("size", "extra_kib"),
    [("4k", 0), ("72k", 110)],  # full from the start; filled by the baseline's own log
    ids=["full-before-start", "filled-mid-run"],
)
def test_a_full_tmpdir_is_named_not_read_as_a_server_failure(
    tmp_path: Path, size: str, extra_kib: int
) -> None:
    extra = tmp_path / "extra.log"
    extra.write_text("".join(f"INFO line {i} {'x' * 1000}\n" for i in range(extra_kib)))
    with _tmpfs(tmp_path / "tmp", size) as tmp:
        marker = uuid.uuid4().hex
        env = _env("effective", marker, TMPDIR=str(tmp), FAKE_VLLM_EXTRA_LOG=str(extra))
        out = tmp_path / "run"
        try:
            proc = subprocess.run(
                _argv(out, free_port()), env=env, cwd=tmp_path, capture_output=True,
                text=True, timeout=90,
            )  # fmt: skip
        finally:
            leftovers = kill_marked(marker)
        assert leftovers == [], f"processes left behind: {leftovers}"
        assert list(tmp.iterdir()) == []  # no raw log left behind either
    assert proc.returncode == exitcodes.USAGE, proc.stdout + proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("offload-doctor: error: no space left on the device of "), error
    assert "(TMPDIR, where the raw server logs are kept)" in error and str(tmp) in error
    assert "Traceback" not in proc.stderr and "Verdict" not in proc.stdout
    report = json.loads((out / "report.json").read_text())
    assert "no space left" in report["error"] and report["verdict"]["title"] == "could not run"
    for m in report["modes"]:  # a mode that ran keeps its figures, its log is not judged
        assert m["analysis_error"].startswith("log not judged: no space left"), m


def test_a_tmpdir_with_no_room_stops_before_any_server_starts(tmp_path: Path) -> None:
    """Everywhere (no mount needed): the file system of TMPDIR reports no room left."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import os\n"
        "real = os.statvfs\n"
        "def statvfs(path):\n"
        "    st = real(path)\n"
        "    if str(path).startswith(os.environ['TMPDIR']):\n"
        "        return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, 0, 0,\n"
        "                                  st.f_files, st.f_ffree, st.f_favail, st.f_flag,\n"
        "                                  st.f_namemax))\n"
        "    return st\n"
        "os.statvfs = statvfs\n"
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    marker = uuid.uuid4().hex
    env = _env("effective", marker, TMPDIR=str(tmp))
    env["PYTHONPATH"] = os.pathsep.join([str(inject), env["PYTHONPATH"]])
    out = tmp_path / "run"
    try:
        proc = subprocess.run(
            [*_argv(out, free_port()), "--format", "json"], env=env, cwd=tmp_path,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        leftovers = kill_marked(marker)
    assert leftovers == []
    doc = json.loads(proc.stdout)
    assert proc.returncode == doc["exit_code"] == exitcodes.USAGE
    assert doc["error"]["kind"] == "disk_full" and str(tmp) in doc["error"]["message"]
    assert json.loads((out / "report.json").read_text())["modes"] == []  # nothing started
