"""Property tests of the log engine.

No input makes it raise (other than InputError) or hang; long crafted lines (>= 256 KB) go
through the real CLI under a hang guard; planted secrets never reach any format; a log keeps
its verdict when a collector prefixes its lines or it has CRLF line ends.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planted_secrets import PLACES, SECRETS, SELF_EVIDENT, assert_no_leak, leaks, planted_line
from shared_corpus import CORPUS, NOT_FOUND

from vllm_offload_doctor import redact
from vllm_offload_doctor.analyze import logread
from vllm_offload_doctor.analyze.engine import Engine
from vllm_offload_doctor.analyze.model import Analysis, Category
from vllm_offload_doctor.analyze.render import Renderer
from vllm_offload_doctor.errors import InputError

CATEGORIES = {c.value for c in Category}
SEEDS = ["A-012.log", "B-005.log", "H-002.log", "H-003.log", "B-021.log", "C-016.log"]
FIXTURE_LOGS = sorted((Path(__file__).resolve().parents[2] / "fixtures" / "logs").glob("*.log"))
HANG_GUARD_S = 300  # a subprocess past this is hung (quadratic): not a timing

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
        try:
            result = ENGINE.analyze_source(logread.Source("fuzz.log", path))
        except InputError:
            return None
    check(result)
    return result


@FUZZ
@given(st.binary(max_size=4096))
def test_arbitrary_bytes(data: bytes) -> None:
    analyze_bytes(data)


@FUZZ
@given(
    st.sampled_from(
        [
            logread.GZIP_MAGIC,
            logread.BZ2_MAGIC + b"9",
            logread.XZ_MAGIC,
            b"\xff\xfe",
            b"\xfe\xff",
            b"\xef\xbb\xbf",
            b"\x00\x00",
        ]
    ),
    st.binary(max_size=2048),
)
def test_arbitrary_bytes_behind_a_magic_or_bom(magic: bytes, data: bytes) -> None:
    analyze_bytes(magic + data)


@FUZZ
@given(st.lists(st.text(max_size=300), max_size=40))
def test_arbitrary_text_lines(lines: list[str]) -> None:
    check(ENGINE.analyze_lines(lines))


LOG_ALPHABET = st.sampled_from(
    [
        *"()[]{}:|=-_.,'\" \t\r\x1b^M0123456789",
        "INFO ",
        "ERROR ",
        "WARNING ",
        "pid=",
        "11-24 14:37:21 ",
        "x.py:1] ",
        "Traceback ",
        'File "',
        "GiB",
        "KV cache",
        "CUDA out of memory",
        "Error",
        "(APIServer pid=1) ",
        "[repeated 3x across cluster]",
        "INFO:     ",
        "cpu_offload_gb",
        "--cpu-offload-gb ",
        "│",
        "</font>",
        "&gt;",
        "hf_",
        "sk-",
    ]
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


PATHOLOGICAL = [
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
    'File "' * 50_000,
    "GiB " * 100_000,
]


def _cli(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_offload_doctor", "analyze", *args, str(path)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode in (0, 1, 2), proc.stderr[-2000:]
    if proc.returncode == 2:
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    return proc


def test_pathological_lines_finish(tmp_path: Path) -> None:
    # One interpreter for all of them: the subprocess timeout is the hang guard.
    code = (
        "import sys, json, pathlib\n"
        "from vllm_offload_doctor.analyze import logread\n"
        "from vllm_offload_doctor.analyze.engine import Engine\n"
        "e = Engine()\n"
        "for i, line in enumerate(json.load(sys.stdin)):\n"
        "    p = pathlib.Path(sys.argv[1]) / f'{i}.log'\n"
        "    p.write_text(line)\n"
        "    e.analyze_source(logread.Source(p.name, p)).to_dict()\n"
        "    e.analyze_lines([line]).to_dict()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        input=json.dumps(PATHOLOGICAL),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


# -- long crafted lines through the real CLI -------------------------------------------------
OOM_HEAD = (
    "(APIServer pid=7) INFO 11-29 15:14:20 [api_server.py:1] vLLM API server version 0.11.0\n"
    "(APIServer pid=7) INFO 11-29 15:14:20 [utils.py:253] non-default args: "
    "{'model': 'Qwen/Qwen3-8B', 'cpu_offload_gb': 4.0}\n"
)
OOM_TAIL = (
    "(EngineCore_DP0 pid=9) ERROR 11-29 15:14:40 [core.py:1] torch.OutOfMemoryError: CUDA out "
    "of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.64 GiB of which "
    "25.06 MiB is free.\n"
)
FRAGMENTS = st.one_of(
    LOG_ALPHABET,
    st.sampled_from(
        [
            "token=",
            "'api_key': ['",
            "Authorization: Bearer ",
            "https://u:",
            "@h/",
            "-----BEGIN PRIVATE KEY-----",
            "eyJ",
            "AKIA",
            "=",
            "'",
            '"',
            "[",
            " ",
        ]
    ),
    st.builds(planted_line, st.sampled_from(sorted(SECRETS)), st.sampled_from(PLACES)),
)


@st.composite
def long_line(draw: st.DrawFn) -> str:
    """A line of 256-300 KB: a few fragments repeated, between a log prefix and a tail."""
    unit = "".join(draw(st.lists(FRAGMENTS, min_size=1, max_size=6)))
    size = draw(st.integers(256_000, 300_000))
    prefix = draw(
        st.sampled_from(
            [
                "",
                "(APIServer pid=7) ERROR 11-29 15:14:30 [x.py:1] ",
                "INFO 11-29 15:14:30 [utils.py:253] non-default args: {",
            ]
        )
    )
    body = (unit * (size // max(1, len(unit)) + 1))[:size]
    return prefix + body


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(long_line(), st.sampled_from(["json", "text", "markdown", "jsonl"]))
def test_long_crafted_lines_through_the_cli(line: str, fmt: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "long.log"
        path.write_text(OOM_HEAD + line + "\n" + OOM_TAIL, encoding="utf-8")
        proc = _cli(path, "--format", fmt)
    assert proc.returncode == 1  # the OOM after the long line is still found
    assert_no_leak(proc.stdout + proc.stderr, f"--format {fmt}")


@pytest.mark.parametrize("size", [280_000, 300_000])
def test_a_line_past_max_line_is_cut_at_a_blank_not_inside_a_secret(
    size: int, tmp_path: Path
) -> None:
    # Found by the test above: the forced cut at MAX_LINE split `token=` into `tok` and
    # `en=<key>`, and the second piece's key no longer looked like one.
    unit = "((((token=vllm-serve-api-key-7Hq2CUDA out of memory"
    line = (
        "(APIServer pid=7) ERROR 11-29 15:14:30 [x.py:1] " + (unit * (size // len(unit) + 1))[:size]
    )
    path = tmp_path / "long.log"
    path.write_text(OOM_HEAD + line + "\n" + OOM_TAIL, encoding="utf-8")
    proc = _cli(path, "--format", "json")
    assert proc.returncode == 1
    assert "7Hq2" not in proc.stdout + proc.stderr


def test_a_forced_cut_without_a_blank_stays_at_max_line() -> None:
    data = b"x" * (logread.MAX_LINE + 10)
    assert logread._soft_cut(data, 0) == logread.MAX_LINE
    spaced = b"y" * (logread.MAX_LINE - 100) + b" " + b"z" * 200
    assert logread._soft_cut(spaced, 0) == logread.MAX_LINE - 99


# -- planted secrets never reach any format --------------------------------------------------
ERR = "(APIServer pid=7) ERROR 11-29 15:14:25 [api_server.py:1]"


@st.composite
def planted(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(sorted(SECRETS)))
    places: list[str | None] = [None, *PLACES] if kind in SELF_EVIDENT else list(PLACES)
    text = planted_line(kind, draw(st.sampled_from(places)))
    before = draw(st.sampled_from(["", " ", "(", "'", "[", "x=", "\t", "msg: "]))
    after = draw(st.sampled_from(["", " ", ")", "'", "]", ",", ";", ".", "\\n"]))
    return before + text + after


@st.composite
def log_with_secrets(draw: st.DrawFn) -> str:
    """A failing vLLM log whose evidence lines carry planted secrets in their places."""
    secrets = draw(st.lists(planted(), min_size=1, max_size=6))
    lines = [OOM_HEAD.rstrip("\n")]
    for n, secret in enumerate(secrets):
        # The first one in the 401 line the verdict quotes: a secret that surely reaches output.
        shape = "error" if n == 0 else draw(st.sampled_from(["error", "args", "auth", "traceback"]))
        if shape == "error":
            lines.append(f"{ERR} 401 Client Error: Unauthorized for url: {secret}")
        elif shape == "args":
            lines.append(
                f"(APIServer pid=7) INFO 11-29 15:14:20 [utils.py:253] non-default args: "
                f"{{'model': 'Qwen/Qwen3-8B', 'cpu_offload_gb': 4.0, 'x': {secret}}}"
            )
        elif shape == "auth":
            lines.append(f"{ERR} requests.exceptions.HTTPError: 401 Client Error: {secret}")
        else:
            lines += [
                "Traceback (most recent call last):",
                f'  File "/srv/app.py", line 3, in main  # {secret}',
                f"OSError: 401 Unauthorized: {secret}",
            ]
    return "\n".join(lines) + "\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log_with_secrets(), st.booleans())
def test_planted_secrets_never_reach_any_format(log: str, crlf: bool) -> None:
    if crlf:
        log = log.replace("\n", "\r\n")
    a = ENGINE.analyze_lines(log.splitlines(keepends=True), name="planted.log")
    shown = Renderer(redact_secrets=False)
    # The guard that the secrets reach the renderers at all: raw where only the renderer masks,
    # or already masked where evidence is masked before it is cut (redact.scrub_cut).
    raw = shown.json([a], []) + shown.text(a)
    assert leaks(raw) or redact.MASK in raw, "no planted secret reached the output"
    for renderer in (Renderer(), Renderer(hosts=True, home=True)):
        for out in (
            renderer.json([a], []),
            renderer.jsonl_line(a),
            renderer.text(a),
            renderer.markdown(a),
            renderer.triage_table([a, a], [], markdown=True),
        ):
            assert_no_leak(out)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(planted(), st.lists(LOG_ALPHABET, max_size=8).map("".join)),
        min_size=1,
        max_size=12,
    )
)
def test_scrub_api_never_leaks(pieces: list[str]) -> None:
    text = " ".join(pieces)
    assert_no_leak(redact.scrub_text(text), "scrub_text")
    assert_no_leak("\n".join(redact.scrub_lines(pieces)), "scrub_lines")
    assert_no_leak(" ".join(redact.scrub_argv(text.split())), "scrub_argv")
    env = {f"VAR{i}": p for i, p in enumerate(pieces)}
    assert_no_leak(repr(redact.scrub_env(env)), "scrub_env")


# -- verdict stability -----------------------------------------------------------------------
def _stamp(i: int) -> str:
    return f"2026-11-29T15:{i // 60 % 60:02d}:{i % 60:02d}.{i:09d}Z"


COLLECTORS = {
    "none": lambda i: "",
    "docker compose": lambda i: "vllm-1  | ",
    "kubectl --timestamps": lambda i: _stamp(i) + " ",
    "CRI node file": lambda i: _stamp(i) + " stdout F ",
    "journald": lambda i: f"Nov 29 15:14:{i % 60:02d} gpu-node-3 vllm[4242]: ",
    "kubectl --prefix": lambda i: "[pod/vllm-0/vllm] ",
}


def _seed_logs() -> list[tuple[str, list[str]]]:
    logs = [
        (p.name, p.read_text(encoding="utf-8", errors="replace").splitlines()) for p in FIXTURE_LOGS
    ]
    logs += [(SEEDS[i], lines) for i, lines in enumerate(SEED_LINES)]
    return logs


SEED_LOGS = _seed_logs()


def _outcome(a: Analysis) -> tuple[str, str, tuple[str, ...]]:
    return (
        a.verdict.category.value,
        a.offload.status.value,
        tuple(sorted(f.rule_id for f in a.findings)),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(range(len(SEED_LOGS))),
    st.lists(st.sampled_from(sorted(COLLECTORS)), min_size=1, max_size=2),
    st.sampled_from(["\n", "\r\n", "mixed"]),
)
def test_verdict_stable_under_collector_prefix_and_crlf(
    seed: int, collectors: list[str], ends: str
) -> None:
    # Collectors stack (kubectl timestamps over compose); CRLF on every line or every other.
    name, lines = SEED_LOGS[seed]
    plain = ENGINE.analyze_lines([line + "\n" for line in lines], name=name)
    changed = "".join(
        "".join(COLLECTORS[c](i) for c in collectors)
        + line
        + (("\r\n" if i % 2 else "\n") if ends == "mixed" else ends)
        for i, line in enumerate(lines)
    ).encode()
    again = analyze_bytes(changed)
    assert again is not None
    assert _outcome(again) == _outcome(plain), (name, collectors, ends)


@pytest.mark.parametrize("place", [p for p in PLACES if " {v}" in p or "= {v}" in p])
@pytest.mark.parametrize("kind", ["api_key_arg", "bearer"])
def test_a_forced_cut_never_parts_a_secret_from_its_name(place: str, kind: str) -> None:
    # Found by test_long_crafted_lines_through_the_cli: a 280 KB line of `password: <key> ...`
    # was cut at the blank after `password:`, and the next piece began with the bare key.
    from vllm_offload_doctor.redact import scrub_text

    value = SECRETS[kind]
    planted = place.format(v=value)
    before = planted.index(value)  # the name and the blanks before the value
    # The value starts just past MAX_LINE: the last blank before the cap is the name's.
    line = "y" * (logread.MAX_LINE - before + 3) + " " + planted + " tail"
    pieces = logread._bound_lines(line.encode()).decode().split("\n")
    assert len(pieces) == 2
    assert all(value not in scrub_text(p) and value[-12:] not in scrub_text(p) for p in pieces)


# Values glued to the next field, each found by test_long_crafted_lines_through_the_cli: the
# first value's mask took the next name (or flag) along, and that name's value went unmasked.
GLUED = [
    "token=VLLM_API_KEY='{v}'",
    "token=password: {v}",
    "token=\"api_key\": \"{v}\"",
    "token='api_key': ['{v}']",
    "token=--api-key {v}",
    "Authorization: Bearer x7Kq2mZ9pL4wVLLM_API_KEY='{v}'",
    "Authorization: Bearer x7Kq2mZ9pL4wpassword: {v}",
    "Authorization: Bearer x7Kq2mZ9pL4w--api-key {v}",
    "Proxy-Authorization: x7Kq2mZ9pL4wpassword: {v}",
]


@pytest.mark.parametrize("shape", GLUED)
def test_a_value_glued_to_the_next_field_leaves_no_secret(shape: str) -> None:
    value = SECRETS["api_key_arg"]
    for line in (shape.format(v=value), ("CUDA out of memory" + shape.format(v=value)) * 3):
        masked = redact.scrub_text(line)
        assert value not in masked and value[-12:] not in masked, masked
