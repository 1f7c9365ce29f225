"""Issue 20's named secret shapes, one case each (tests/support/issue20_shapes.py), through the
masker and through analyze's outputs; and secrets that straddle the evidence cut.

The generated property tests (test_secrets_property.py) cover the families; these pin the
cases the attack round reported, so each one is a named failure if it comes back. On the code
the issue was filed against (fefc042), 20 of the 30 cases leaked through `scrub_lines`.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from click.testing import CliRunner
from issue20_shapes import CASES, FILE_NAMES

from vllm_offload_doctor.cli import cli
from vllm_offload_doctor.redact import scrub_lines

HEAD = "INFO 11-29 15:14:20 [api_server.py:1] vLLM API server version 0.11.0"
OOM = "ERROR 11-29 15:14:25 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. ctx "
RUNS = [
    ("text",),
    ("json",),
    ("jsonl",),
    ("markdown",),
    ("json", "--redact"),
]


def _outputs(log: Path) -> list[tuple[str, str]]:
    runner = CliRunner()
    outs = []
    for fmt, *flags in RUNS:
        res = runner.invoke(cli, ["analyze", "--format", fmt, *flags, str(log)])
        outs.append((" ".join([fmt, *flags]), res.output))
    return outs


@pytest.mark.parametrize(("name", "lines", "secrets"), CASES, ids=[c[0] for c in CASES])
def test_each_named_shape_is_masked(name: str, lines: list[str], secrets: list[str]) -> None:
    out = "\n".join(scrub_lines(lines))
    assert [s for s in secrets if s in out] == [], out
    assert len(out.splitlines()) == len(lines)  # masked in place, no line lost


SINGLE = [c for c in CASES if len(c[1]) == 1]


@pytest.mark.parametrize(("name", "lines", "secrets"), SINGLE, ids=[c[0] for c in SINGLE])
def test_each_named_shape_is_masked_in_analyze_outputs(
    tmp_path: Path, name: str, lines: list[str], secrets: list[str]
) -> None:
    # The shape rides on the OOM line, so that line is shown as evidence in every format.
    log = tmp_path / "s.log"
    log.write_text(f"{HEAD}\n{OOM}{lines[0]}\n")
    for where, out in _outputs(log):
        assert "CUDA out of memory" in out, (where, out[:1000])
        assert [s for s in secrets if s in out] == [], (where, out[:2000])


@pytest.mark.parametrize(("file_name", "secret"), FILE_NAMES)
def test_a_secret_in_the_file_name_is_masked_in_analyze_outputs(
    tmp_path: Path, file_name: str, secret: str
) -> None:
    data = f"{HEAD}\n{OOM}\n".encode()
    log = tmp_path / file_name
    log.write_bytes(gzip.compress(data) if file_name.endswith(".gz") else data)
    for where, out in _outputs(log):
        assert "CUDA out of memory" in out, (where, out[:1000])
        assert secret not in out and secret[-8:] not in out, (where, out[:1500])


# Evidence is cut to 600 (or 400) characters; cut first, a secret lost the shape the masker
# needs and its head was shown (issue 20: 4 of 5 shapes leaked in json, jsonl and markdown).
CUT_SHAPES = [
    ("URL password", "https://u:Zq9fLw2pXyKd7Tn4Rb8MhunTer@hub.example/x", "Zq9fLw2p"),
    ("hf_ token", "hf_Q7vX2kLp9RtZ4mWb8NcYs3Hf6Jd1GqUe5A", "Q7vX2kLp"),
    (
        "JWT",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJzdXBwb3J0LTQyIn0.Tk3nS1gN4tUr3_Xq9LmZp2Rv7Yw",
        "eyJzdWIiOiJz",
    ),
    (
        "github_pat_",
        "github_pat_11ABCDEFG0aBcDeFgHiJkL_MnOpQrStUvWxYz0123456789AbCdEfGhIj",
        "0aBcDeFg",
    ),
]


# The rule's evidence line is cut at 600 characters; a notable line (no rule decides) at 400.
CUTS = {600: OOM, 400: "ERROR 11-29 15:14:25 [core.py:1] Something odd happened: "}


@pytest.mark.parametrize("cut", sorted(CUTS))
@pytest.mark.parametrize(("shape", "secret", "head"), CUT_SHAPES, ids=[s[0] for s in CUT_SHAPES])
def test_a_secret_across_the_evidence_cut_is_masked(
    tmp_path: Path, shape: str, secret: str, head: str, cut: int
) -> None:
    at = secret.index(head) + len(head) + 2  # the cut falls just past the head
    start = CUTS[cut]
    line = start + "y" * (cut - len(start) - at) + " " + secret + " tail"
    log = tmp_path / "cut.log"
    log.write_text(f"{HEAD}\n{line}\n")
    for where, out in _outputs(log):
        assert start.split("] ")[1][:20] in out, (where, out[:1000])  # the line is shown
        assert head not in out, (where, shape, out[:3000])
