"""compare never writes through a planted link (issue 20)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_offload_doctor.compare.artifacts import LOCK_NAME, _lock
from vllm_offload_doctor.errors import DoctorError


def test_lock_symlink_refused_victim_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(victim)
    with pytest.raises(DoctorError) as exc:
        _lock(out).close()
    assert "symbolic link" in str(exc.value) and "\n" not in str(exc.value)
    assert victim.read_text() == "precious\n"


def test_plain_lock_still_taken(tmp_path: Path) -> None:
    lock = _lock(tmp_path)
    lock.close()
    assert (tmp_path / LOCK_NAME).is_file()
