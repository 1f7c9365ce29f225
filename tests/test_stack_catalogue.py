"""The stack catalogue: parsing the shipped inputs, the shipped data, and the categories it lends."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from vllm_offload_doctor.analyze.engine import analyze_lines
from vllm_offload_doctor.analyze.stack import builtin_stack

ROOT = Path(__file__).resolve().parent.parent


def _script():
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("stack_catalogue", ROOT / "scripts" / "stack_catalogue.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cuda_enum_parsed_from_header_excerpt():
    text = (ROOT / "tests" / "data" / "driver_types-excerpt.h").read_text()
    got = {e["name"]: e for e in _script().cuda_errors(text)}
    assert set(got) == {"cudaErrorNoKernelImageForDevice", "cudaErrorStreamCaptureUnsupported"}
    assert got["cudaErrorNoKernelImageForDevice"]["code"] == 209
    assert got["cudaErrorNoKernelImageForDevice"]["template"] == (
        "This indicates that there is no kernel image available that is suitable for the device."
    )


def test_rust_strings_from_a_string_table():
    blob = b"\x00junk\x00Error while deserializing header\x00xx Error while serializing\x00"
    names = [e["name"] for e in _script().rust_strings(blob)]
    assert names == ["Error while deserializing header", "Error while serializing"]


def test_shipped_data_matches_the_script():
    mod = _script()
    for _, _, prefix, _ in mod.PINS:
        if not any(mod.CACHE.glob(prefix + "*.whl")):
            pytest.skip(f"no cached wheel {prefix} in .stack-cache/ (run scripts/stack_catalogue.py)")
    assert mod.dump(mod.build()) == mod.OUT.read_text(encoding="utf-8")


def test_every_lend_entry_names_a_catalogued_message():
    shipped = json.loads((ROOT / "vllm_offload_doctor" / "data" / "stack-messages.json").read_text())
    lent = builtin_stack()
    names = {m.name for m in (*lent.by_name.values(), *lent.heads)}
    assert {"cudaErrorStreamCaptureUnsupported", "cudaErrorNoKernelImageForDevice",
            "Error while deserializing header"} <= names
    assert names <= {m["name"] for m in shipped["messages"]}


FIRE = [
    ("ERROR [core.py:1] Search for `cudaErrorStreamCaptureUnsupported' in https://docs.nvidia.com/"
     "cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.", "crash_other"),
    # Only the enum name: the words of GPU001 are not in the line, the catalogue decides.
    ("ERROR Search for `cudaErrorNoKernelImageForDevice' in https://docs.nvidia.com/cuda/ for more "
     "information.", "unsupported_gpu"),
    ("safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge", "model_download"),
]


@pytest.mark.parametrize("text,category", FIRE)
def test_library_message_lends_its_category(text, category):
    result = analyze_lines(text.splitlines(), "x.log")
    assert result.verdict.category.value == category
    assert any("from " in f.message and ("driver_types.h" in f.message or ".so" in f.message)
               for f in result.findings)


QUIET = [
    "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/ for more information.",
    "safetensors_rust.SafetensorError: Error while serializing: IoError",
]


@pytest.mark.parametrize("text", QUIET)
def test_unmapped_library_message_lends_nothing(text):
    result = analyze_lines(text.splitlines(), "x.log")
    assert not any("driver_types.h" in f.message or ".so of" in f.message for f in result.findings)
