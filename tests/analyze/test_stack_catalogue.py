"""The stack catalogue: parsing the shipped inputs, the shipped data, and the categories it lends."""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from script_loader import load_script

from vllm_offload_doctor.analyze.engine import analyze_lines
from vllm_offload_doctor.analyze.stack import builtin_stack

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "vllm_offload_doctor" / "data" / "stack-messages.json"


def _script():
    return load_script("stack_catalogue")


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


def test_nccl_names_pair_with_the_library_texts():
    header = (
        "typedef enum { ncclSuccess = 0,\n ncclUnhandledCudaError = 1,\n ncclInvalidUsage = 5,\n"
        " ncclInProgress = 7,\n ncclNumResults = 8 } ncclResult_t;"
    )
    blob = (
        b"\x00no error\x00unhandled cuda error (run with NCCL_DEBUG=INFO for details)\x00"
        b"invalid usage\x00invalid usage (run with NCCL_DEBUG=WARN for details)\x00"
    )
    got = {e["name"]: e for e in _script().nccl_results(header, blob)}
    assert set(got) == {
        "ncclUnhandledCudaError",
        "ncclInvalidUsage",
    }  # no text for InProgress: left out
    assert got["ncclInvalidUsage"] == {
        "name": "ncclInvalidUsage",
        "code": 5,
        "kind": "code",
        "template": "invalid usage (run with NCCL_DEBUG=WARN for details)",
    }


def test_errno_defines_with_their_comments():
    linux = "#define\tEADDRINUSE\t98\t/* Address already in use */\n#define EDEADLOCK EDEADLK\n"
    macos = "#define EADDRINUSE      48              /* Address already in use */\n"
    gai = "# define EAI_AGAIN\t  -3\t/* Temporary failure in name resolution.  */\n"
    mod = _script()
    assert mod.errno_table(linux) == [
        {"name": "EADDRINUSE", "code": 98, "kind": "errno", "template": "Address already in use"}
    ]
    assert mod.errno_table(macos)[0]["code"] == 48
    assert mod.errno_table(gai)[0] == {
        "name": "EAI_AGAIN",
        "code": -3,
        "kind": "errno",
        "template": "Temporary failure in name resolution",
    }


def test_python_messages_read_classes_raises_and_constants():
    source = '''
X_IMPORT_ERROR = """
{0} requires the X library but it was not found in your environment.
"""
class OutOfResources(Exception):
    def __str__(self):
        return f"out of resource: {self.name}, Required: {self.required}"
class GatedRepoError(Exception):
    """Raised when trying to access a gated repository. More words."""
def check(a):
    msg = f"Version mismatch: {a}"
    if a:
        raise RuntimeError(msg)
    raise ValueError("short")
    raise ImportError(f"Failed to import {a} because of the following error (look up):\\n{a}")
'''
    got = {e["name"]: e for e in _script().python_messages(source)}
    assert got["OutOfResources"]["template"] == "out of resource: {}, Required: {}"
    assert got["GatedRepoError"] == {
        "name": "GatedRepoError",
        "kind": "class",
        "template": "Raised when trying to access a gated repository.",
    }
    assert got["Version mismatch: {}"]["kind"] == "text"
    assert "Failed to import {} because of the following error (look up):" in got
    assert "{0} requires the X library but it was not found in your environment." in got
    assert "short" not in got  # too little literal text to tell it from another library's


def test_c_strings_keep_sentences_only():
    blob = (
        b"\x00No CUDA GPUs are available\x00_ZN3c104cuda20CUDACachingAllocatorE\x00"
        b"x INTERNAL ASSERT FAILED at CUDA.cpp, please report a bug\x00CUDA driver error: \x00"
    )
    got = {e["name"]: e["template"] for e in _script().c_strings(blob, "CUDA")}
    assert got == {
        "No CUDA GPUs are available": "No CUDA GPUs are available",
        "CUDA driver error": "CUDA driver error: {detail}",
    }


def _sources_of(mod, library):
    return [s for s in mod.PINS if s[0] == library]


LIBRARIES = sorted({m["library"] for m in json.loads(SHIPPED.read_text())["messages"]})


@pytest.mark.parametrize("library", LIBRARIES)
def test_shipped_data_matches_the_script(library):
    mod = _script()
    sources = _sources_of(mod, library)
    assert sources, f"{library} in the shipped file but no pin makes it"
    for s in sources:
        if mod.cached(s[1]) is None:
            pytest.skip(
                f"no cached wheel for {s[1]} in .stack-cache/ (run scripts/stack_catalogue.py)"
            )
    want = mod.merge(e for s in sources for e in mod.source_entries(s))
    shipped = [m for m in json.loads(SHIPPED.read_text())["messages"] if m["library"] == library]
    assert json.dumps(shipped, sort_keys=True) == json.dumps(want, sort_keys=True)


def test_shipped_file_is_the_script_output():
    mod = _script()
    missing = [s[1] for s in mod.PINS if mod.cached(s[1]) is None]
    if missing:
        pytest.skip(f"no cached wheels for {', '.join(missing)} in .stack-cache/")
    assert mod.dump(mod.build()) == SHIPPED.read_text(encoding="utf-8")


def test_every_lend_entry_names_a_catalogued_message():
    shipped = json.loads(SHIPPED.read_text())["messages"]
    lend = tomllib.loads((ROOT / "rules" / "maps" / "stack.toml").read_text())["lend"]
    for entry in lend:
        names = {m["name"] for m in shipped if m["library"] == entry["library"]}
        for n in entry["names"]:
            hit = any(x.startswith(n[:-1]) for x in names) if n.endswith("*") else n in names
            assert hit, f"{entry['library']}: {n!r} is in no catalogued message"


FIRE = [
    (
        "ERROR [core.py:1] Search for `cudaErrorStreamCaptureUnsupported' in https://docs.nvidia.com/"
        "cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.",
        "crash_other",
        "cuda-runtime",
    ),
    # Only the enum name: the words of GPU001 are not in the line, the catalogue decides.
    (
        "ERROR Search for `cudaErrorNoKernelImageForDevice' in https://docs.nvidia.com/cuda/ for more "
        "information.",
        "unsupported_gpu",
        "cuda-runtime",
    ),
    (
        "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge",
        "model_download",
        "safetensors",
    ),
    (
        "torch.distributed.DistBackendError: [3] is setting up NCCL communicator and retrieving ncclUniqueId "
        "failed: ncclRemoteError",
        "distributed",
        "nccl",
    ),
    (
        "RuntimeError: x.cpp:1, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.21.5\n"
        "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
        "distributed",
        "nccl",
    ),
    # macOS numbers EADDRINUSE 48, Linux 98: both are the address in use.
    ("OSError: [Errno 48] Address already in use", "port_in_use", "errno-macos"),
    ("OSError: [Errno 98] Address already in use", "port_in_use", "errno-linux"),
    ("BlockingIOError: [Errno 12] Cannot allocate memory", "oom_host", "errno-linux"),
    (
        "socket.gaierror: [Errno -3] Temporary failure in name resolution",
        "model_download",
        "gai-glibc",
    ),
    ("RuntimeError: No CUDA GPUs are available", "driver_cuda", "torch"),
    (
        "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 65536, Hardware "
        "limit: 49152. Reducing block sizes or `num_stages` may help.",
        "unsupported_gpu",
        "triton",
    ),
    (
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        "oom_host",
        "ray",
    ),
    (
        "RuntimeError: Version mismatch: The cluster was started with: Ray: 2.9.0 Python: 3.10.12 This "
        "process on node 10.0.0.2 was started with: Ray: 2.10.0 Python: 3.10.12",
        "python_env",
        "ray",
    ),
    (
        "RuntimeError: Failed to import transformers.models.llama.modeling_llama because of the following "
        "error (look up to see its traceback):",
        "python_env",
        "transformers",
    ),
    (
        "huggingface_hub.errors.GatedRepoError: 403 Client Error. (Request ID: Root=1-x)",
        "model_download",
        "huggingface_hub",
    ),
    (
        "Exception: Error while initializing BPE: Token `<x>` out of vocabulary",
        "tokenizer_template",
        "tokenizers",
    ),
]


@pytest.mark.parametrize("text,category,library", FIRE)
def test_library_message_lends_its_category(text, category, library):
    lent = builtin_stack().find(text)
    assert lent is not None and (lent.library, lent.category) == (library, category)
    result = analyze_lines(text.splitlines(), "x.log")
    assert result.verdict.category.value == category
    # Where no rule of the doctor's own reads the line, the verdict cites the library message.
    top = result.findings[0]
    if top.library_message is not None:
        assert top.library_message["library"] == library and top.library_message["versions"]
        assert "Library message " in top.message


QUIET = [
    "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/ for more information.",
    "safetensors_rust.SafetensorError: Error while serializing: IoError",
    # A number in one table with another table's text is neither.
    "OSError: [Errno 48] Cannot allocate memory",
    # Names the library defines that say nothing about whose fault it is.
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
    "huggingface_hub.errors.ValidationError: bad input",
    "pydantic_core._pydantic_core.ValidationError: 1 validation error for Foo",
    # A word that merely holds a lent class name.
    "MyOutOfResourcesHandler: nothing",
]


@pytest.mark.parametrize("text", QUIET)
def test_unlent_library_message_lends_nothing(text):
    result = analyze_lines(text.splitlines(), "x.log")
    assert not any(f.library_message for f in result.findings)


def test_a_rule_decides_before_the_catalogue():
    # An NCCL error printed while shutting down after a GPU OOM is the OOM.
    lines = [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 79.10 GiB of which 1.00 GiB is free.",
        "torch.distributed.DistBackendError: NCCL error: ncclRemoteError",
    ]
    result = analyze_lines(lines, "x.log")
    assert result.verdict.category.value.startswith("oom")


def test_json_cites_the_library_message():
    result = analyze_lines(["OSError: [Errno 48] Address already in use"], "x.log")
    cite = result.to_dict()["findings"][0]["library_message"]
    assert cite == {
        "library": "errno-macos",
        "package": "ziglang",
        "name": "EADDRINUSE",
        "file": "any-macos-any/sys/errno.h",
        "versions": ["0.13.0"],
    }


def test_rules_view_lists_the_library_messages_a_rule_reads():
    from vllm_offload_doctor.cli import cli

    out = CliRunner().invoke(cli, ["rules", "PORT001"]).output
    assert "Library messages it reads" in out
    assert "errno-macos EADDRINUSE = 48" in out and "ziglang 0.13.0" in out


def test_lent_entries_are_all_built():
    lend = tomllib.loads((ROOT / "rules" / "maps" / "stack.toml").read_text())["lend"]
    libraries = {e["library"] for e in lend}
    assert libraries <= {m.library for m in builtin_stack().lent}


def test_the_word_scan_finds_what_the_full_search_finds():
    # find() skips the name search and the core tests when one scan sees none of their words.
    from vllm_offload_doctor.analyze.normalize import parse

    stack = builtin_stack()
    full = copy.copy(stack)
    full._words = None
    corpus = ROOT.parent / "shared" / "corpus"
    logs = [*ROOT.glob("fixtures/**/*.log"), *(corpus.glob("*.log") if corpus.is_dir() else ())]
    texts = [t for t, _category, _library in FIRE] + QUIET
    texts += [
        parse(1, raw).msg for log in logs for raw in log.read_text("utf-8", "replace").split("\n")
    ]
    texts += [f"x: {m.name}: {m.template.strip()}" for m in stack.lent]
    found = 0
    for text in texts:
        assert stack.find(text) == full.find(text), text
        found += full.find(text) is not None
    assert found > 50
