"""No write through a planted link: every file compare writes is opened new (O_EXCL|O_NOFOLLOW)
or renamed into place, and an --out that is a link is refused."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from vllm_offload_doctor.compare.artifacts import WriteError, atomic_write, save_scrubbed_log
from vllm_offload_doctor.compare.config import CompareConfig
from vllm_offload_doctor.compare.logmirror import LogMirror
from vllm_offload_doctor.compare.render import report_files
from vllm_offload_doctor.compare.run import CompareRun

FAKE = Path(__file__).resolve().parents[1] / "fake-vllm"


def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim.txt"
    v.write_text("precious\n")
    return v


def test_atomic_write_never_writes_through_a_link_at_its_temporary_name(tmp_path: Path) -> None:
    v = victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / f".report.json.tmp-{os.getpid()}").symlink_to(v)
    (out / "report.json").symlink_to(v)  # and at the name itself: the link is replaced
    atomic_write(out / "report.json", "{}")
    assert v.read_text() == "precious\n"
    assert (out / "report.json").read_text() == "{}" and not (out / "report.json").is_symlink()


def test_a_saved_log_never_goes_through_a_link(tmp_path: Path) -> None:
    v = victim(tmp_path)
    raw = tmp_path / "raw.log"
    raw.write_text("INFO token hf_QpWoEiRuTyAlSkDjFhGzXmCnVb3141592653\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / f".mode-0.log.tmp-{os.getpid()}").symlink_to(v)
    (out / "mode-0.log").symlink_to(v)
    save_scrubbed_log(raw, out / "mode-0.log")
    assert v.read_text() == "precious\n"
    saved = (out / "mode-0.log").read_text()
    assert "INFO token" in saved and "3141592653" not in saved


def test_the_live_log_copy_refuses_a_planted_link(tmp_path: Path) -> None:
    v = victim(tmp_path)
    (tmp_path / "mode-0.log").symlink_to(v)
    with pytest.raises(WriteError, match="already exists"):
        LogMirror(tmp_path / "raw.log", tmp_path / "mode-0.log").start()
    assert v.read_text() == "precious\n"


def test_an_out_that_is_a_link_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "someone-else"
    real.mkdir()
    (tmp_path / "out").symlink_to(real)
    cfg = CompareConfig(vllm_cmd=[sys.executable, str(FAKE)], out_dir=tmp_path / "out")
    with pytest.raises(WriteError, match="symbolic link"):
        CompareRun(cfg, progress=io.StringIO(), files=report_files).execute()
    assert list(real.iterdir()) == []


def test_report_json_is_there_from_the_first_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed before its first mode starts still leaves a readable report.json."""
    import json

    from vllm_offload_doctor.compare import artifacts

    seen: list[dict[str, object]] = []

    def sweep(tmp: Path) -> None:  # the first thing after the folder is claimed
        seen.append(json.loads((tmp_path / "out" / "report.json").read_text()))
        raise KeyboardInterrupt

    monkeypatch.setattr(artifacts, "sweep_raw_dirs", sweep)
    cfg = CompareConfig(vllm_cmd=[sys.executable, str(FAKE)], out_dir=tmp_path / "out")
    with pytest.raises(KeyboardInterrupt):
        CompareRun(cfg, progress=io.StringIO(), files=report_files).execute()
    assert seen and seen[0]["complete"] is False and seen[0]["modes"] == []


def test_report_json_shows_a_ready_mode_while_it_is_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import socket

    from vllm_offload_doctor.compare import run as run_mod

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    real = run_mod.measure
    seen: list[dict[str, object]] = []

    def measure(*args: object, **kw: object) -> object:
        seen.append(json.loads((tmp_path / "out" / "report.json").read_text())["modes"][-1])
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(run_mod, "measure", measure)
    monkeypatch.setenv("FAKE_VLLM_SCENARIO", "effective")
    cfg = CompareConfig(
        vllm_cmd=[sys.executable, str(FAKE)],
        model="/tmp/model",
        port=port,
        repeats=1,
        warmup=0,
        grace_s=2,
        out_dir=tmp_path / "out",
    )
    CompareRun(cfg, progress=io.StringIO(), files=report_files).execute()
    assert [m["status"] for m in seen] == ["starting", "starting"]
    assert all(isinstance(m.get("startup_s"), float) for m in seen)  # saved before measuring


def test_the_live_log_copy_masks_whole_lines_as_they_come(tmp_path: Path) -> None:
    from vllm_offload_doctor.compare import logmirror

    raw, dest = tmp_path / "raw.log", tmp_path / "mode-0.log"
    token = "hf_QpWoEiRuTyAlSkDjFhGzXmCnVb3141592653"
    mirror = LogMirror(raw, dest, every_s=3600)  # copied by hand below
    mirror.start()
    bulk = "".join(f"INFO line {i} {'x' * 100}\n" for i in range(2 * logmirror.CHUNK // 100))
    raw.write_text(bulk + f"INFO token {token}\nINFO half a li")
    mirror.copy()
    text = dest.read_text()
    assert text.startswith("INFO line 0 ") and "INFO token " in text
    assert token not in text and "half a li" not in text  # an unfinished line waits
    with raw.open("a") as f:
        f.write("ne\n")
    mirror.stop()
    assert dest.read_text().endswith("INFO half a line\n")
    assert dest.read_text().count("\n") == bulk.count("\n") + 2
