"""A full disk is named as such (exit 2, one line, JSON in JSON mode), never read as a server
failure or a bug, and what was written before stays."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import uuid
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
