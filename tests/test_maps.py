"""Every entry of the knowledge maps (rules/maps/*.toml) gives its category on its own `fire`
lines through the whole analysis, and not on its `quiet` lines (issue 8.1, 8.2)."""

from __future__ import annotations

import pytest

from vllm_offload_doctor.analyze import analyze_lines
from vllm_offload_doctor.knowledge import builtin_knowledge

KNOW = builtin_knowledge()
EXC = [(e.id, e.category, line, True) for e in KNOW.exceptions for line in e.fire] + [
    (e.id, e.category, line, False) for e in KNOW.exceptions for line in e.quiet
]
FRAMES = [(f.id, f.category, line, True) for f in KNOW.frames for line in f.fire] + [
    (f.id, f.category, line, False) for f in KNOW.frames for line in f.quiet
]


@pytest.mark.parametrize(("entry", "category", "line", "fire"), EXC, ids=lambda v: str(v)[:40])
def test_exception_entry(entry: str, category, line: str, fire: bool) -> None:  # type: ignore[no-untyped-def]
    got = analyze_lines([line]).verdict.category
    assert (got == category) is fire, f"{entry}: {line!r} gave {got.value}"


@pytest.mark.parametrize(("entry", "category", "line", "fire"), FRAMES, ids=lambda v: str(v)[:40])
def test_frame_entry(entry: str, category, line: str, fire: bool) -> None:  # type: ignore[no-untyped-def]
    # A frame decides when the exception line does not: a traceback cut off after the frame.
    lines = ["Traceback (most recent call last):", line, "AssertionError"]
    got = analyze_lines(lines).verdict.category
    assert (got == category) is fire, f"{entry}: {line!r} gave {got.value}"


def test_every_entry_has_a_quiet_line_or_is_a_frame_without_near_miss() -> None:
    missing = [e.id for e in KNOW.exceptions if not e.quiet]
    # Entries whose pattern is a unique vLLM/library sentence have no meaningful near miss.
    assert set(missing) <= {
        "vllm-invalid-repo-or-path", "torch-cuda-init", "no-platform", "hip-no-device",
        "no-kernel-for-gpu", "host-enomem", "quoted-import-error", "vllm-argparse",
        "chat-template-missing",
    }
