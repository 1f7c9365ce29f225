"""Every entry of the knowledge maps (rules/maps/*.toml) gives its category on its own `fire`
lines through the whole analysis, and not on its `quiet` lines (issue 8.1, 8.2)."""

from __future__ import annotations

import pytest

from vllm_offload_doctor.analyze.engine import analyze_lines
from vllm_offload_doctor.analyze.knowledge import builtin_knowledge

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


def test_every_entry_has_a_quiet_line() -> None:
    assert [e.id for e in KNOW.exceptions if not e.quiet] == []
    assert [f.id for f in KNOW.frames if not f.quiet] == []


def _broken_maps(tmp_path, old: str, new: str, name: str = "exceptions.toml"):  # type: ignore[no-untyped-def]
    import shutil

    from vllm_offload_doctor.analyze.knowledge import maps_dir

    for f in ("exceptions.toml", "frames.toml"):
        shutil.copy(maps_dir() / f, tmp_path / f)
    path = tmp_path / name
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    ("old", "new", "name", "key"),
    [
        ("[deaths]\n", '[deaths]\nquiet = ["x"]\n', "exceptions.toml", "deaths.quiet"),
        ('category = "model_download"', 'category = "oom_kv_cache"', "exceptions.toml", "category"),
        (
            'fire = ["modelscope.hub.errors.NotExistError',
            'fire = ["modelscope.hub.NotExist',
            "exceptions.toml",
            "fire",
        ),
        ('id = "offloader"', 'id = "offloader"\nspeed = 1', "frames.toml", "speed"),
        (
            'derive = "arg-utils"\nraises = true',
            'derive = "arg-utils"\nraises = "vllm/engine/arg_utils.py"',
            "frames.toml",
            "raises",
        ),
        ('derive = "arg-utils"', 'derive = "arg-checks"', "frames.toml", "derive"),
        ('derive = "arg-utils"', 'derive = "arg-utils"\npath = "x/"', "frames.toml", "path"),
        ("why = \"jinja2's code, not vLLM's\"\n", "", "frames.toml", "why"),
        (
            'rule = "ARG001"\ncategory = "bad_args"\nderive',
            'rule = "DIST001"\ncategory = "distributed"\nderive',
            "frames.toml",
            "differs from arg-utils's",
        ),
    ],
)
def test_broken_map_names_file_and_key(tmp_path, old: str, new: str, name: str, key: str) -> None:  # type: ignore[no-untyped-def]
    from vllm_offload_doctor.analyze.knowledge import load_knowledge
    from vllm_offload_doctor.analyze.rules import load_rules
    from vllm_offload_doctor.errors import RuleFileError

    directory = _broken_maps(tmp_path, old, new, name)
    with pytest.raises(RuleFileError) as err:
        load_knowledge(load_rules(), directory)
    assert name in str(err.value) and key in str(err.value)
