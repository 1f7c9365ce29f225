"""Property tests: no input makes the log engine raise (other than InputError) or hang."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shared_corpus import CORPUS, NOT_FOUND

from vllm_offload_doctor import logread
from vllm_offload_doctor.analyze import Engine
from vllm_offload_doctor.errors import InputError
from vllm_offload_doctor.model import Analysis, Category

CATEGORIES = {c.value for c in Category}
SEEDS = ["A-012.log", "B-005.log", "H-002.log", "H-003.log", "B-021.log", "C-016.log"]
PER_EXAMPLE_S = 5.0

ENGINE = Engine()
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _seed_lines() -> list[list[str]]:
    out = []
    for name in SEEDS:
        path = CORPUS / name
        if path.is_file():
            out.append(path.read_text(encoding="utf-8", errors="replace").splitlines())
    return out


SEED_LINES = _seed_lines()
needs_corpus = pytest.mark.skipif(not SEED_LINES, reason=NOT_FOUND)


def check(analysis: Analysis) -> None:
    assert analysis.verdict.category.value in CATEGORIES
    assert analysis.offload.status is not None
    analysis.to_dict()  # renderable


def analyze_bytes(data: bytes) -> Analysis | None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.log"
        path.write_bytes(data)
        t0 = time.perf_counter()
        try:
            result = ENGINE.analyze_source(logread.Source("fuzz.log", path))
        except InputError:
            return None
        finally:
            assert time.perf_counter() - t0 < PER_EXAMPLE_S
    check(result)
    return result


@FUZZ
@given(st.binary(max_size=4096))
def test_arbitrary_bytes(data: bytes) -> None:
    analyze_bytes(data)


@FUZZ
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_behind_gzip_magic(data: bytes) -> None:
    analyze_bytes(b"\x1f\x8b" + data)


@FUZZ
@given(st.lists(st.text(max_size=300), max_size=40))
def test_arbitrary_text_lines(lines: list[str]) -> None:
    check(ENGINE.analyze_lines(lines))


LOG_ALPHABET = st.sampled_from(
    [*"()[]{}:|=-_.,'\" \t\r\x1b^M0123456789",
     "INFO ", "ERROR ", "WARNING ", "pid=", "11-24 14:37:21 ", "x.py:1] ", "Traceback ",
       "File \"", "GiB", "KV cache", "CUDA out of memory", "Error", "(APIServer pid=1) ",
       "[repeated 3x across cluster]", "INFO:     ", "cpu_offload_gb", "--cpu-offload-gb ",
       "│", "</font>", "&gt;", "hf_", "sk-"]
)


@FUZZ
@given(st.lists(st.lists(LOG_ALPHABET, max_size=60).map("".join), max_size=60))
def test_log_shaped_noise(lines: list[str]) -> None:
    check(ENGINE.analyze_lines(lines))
    analyze_bytes("\n".join(lines).encode())


@st.composite
def mutated_log(draw: st.DrawFn) -> bytes:
    lines = list(draw(st.sampled_from(SEED_LINES)))
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["drop", "dup", "shuffle", "truncate", "bytes", "glue", "cut"]))
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        if op == "drop":
            del lines[i : i + draw(st.integers(1, 20))]
        elif op == "dup":
            lines[i:i] = lines[i : i + draw(st.integers(1, 20))] * draw(st.integers(1, 5))
        elif op == "shuffle":
            j = draw(st.integers(i, min(len(lines), i + 30)))
            chunk = lines[i:j]
            draw(st.randoms(use_true_random=False)).shuffle(chunk)
            lines[i:j] = chunk
        elif op == "truncate":
            lines = lines[:i]
        elif op == "bytes":
            junk = draw(st.binary(min_size=1, max_size=64)).decode("latin-1")
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + junk + lines[i][at:]
        elif op == "glue":
            n = draw(st.integers(2, 40))
            lines[i : i + n] = [draw(st.sampled_from([" ", "", "\t"])).join(lines[i : i + n])]
        elif op == "cut":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
    return "\n".join(lines).encode("utf-8", "surrogateescape")


@needs_corpus
@FUZZ
@given(mutated_log())
def test_mutated_real_logs(data: bytes) -> None:
    analyze_bytes(data)


@needs_corpus
@settings(max_examples=20, deadline=None)
@given(mutated_log())
def test_mutated_real_logs_in_memory(data: bytes) -> None:
    check(ENGINE.analyze_lines(data.decode("utf-8", "replace").splitlines()))


@pytest.mark.parametrize(
    "line",
    [
        "(" * 200_000,
        "a" * 1_000_000,
        "ERROR 11-24 14:37:21 x.py:1] " + "(" * 200_000,
        "Traceback " * 50_000,
        "(APIServer pid=1) " * 20_000,
        "INFO 11-24 14:37:21 x.py:1] " * 20_000,
        "\x1b[" * 100_000,
        "^[[" * 100_000,
        "│" * 200_000,
        "<font>" * 50_000,
        "File \"" * 50_000,
        "GiB " * 100_000,
    ],
    ids=lambda s: repr(s[:12]) + f"x{len(s)}",
)
def test_pathological_line_finishes_quickly(line: str) -> None:
    t0 = time.perf_counter()
    analyze_bytes(line.encode())
    check(ENGINE.analyze_lines([line]))
    assert time.perf_counter() - t0 < 10
