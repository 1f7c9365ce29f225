"""Secrets by structure (issue 20): generated values in generated places, never in any output.

A value in a secret's place (a key, flag, variable, header, field or query parameter of a
secret family, in any quoting; URL userinfo; a PEM body; a webhook path) is masked whatever it
looks like. A token with no place is masked by its shape (known prefixes, JWTs, a random run
of 20+ characters). The checks run on `scrub_text`/`scrub_lines` and through every analyze
format, with and without --redact, plain and gzipped, and on compare's artifact writers.
"""

from __future__ import annotations

import gzip
import json
import random
import string
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from shared_corpus import CORPUS, NOT_FOUND

from vllm_offload_doctor import redact
from vllm_offload_doctor.cli import cli
from vllm_offload_doctor.redact import scrub_argv, scrub_env, scrub_lines, scrub_text

needs_corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason=NOT_FOUND)

# Names of the secret families, spelt the ways configs, env files and headers spell them.
FAMILY = [
    "password",
    "passwd",
    "pass",
    "pwd",
    "secret",
    "token",
    "key",
    "auth",
    "credential",
    "credentials",
    "sig",
    "signature",
    "cookie",
    "session",
    "private_key",
    "apikey",
    "access_key",
    "passphrase",
]
PREFIXES = ["", "db_", "my-", "aws_", "x-api-", "client_", "azure_storage_", "hf_", "session_"]
ALNUM = string.ascii_letters + string.digits
# A value in a secret's place may be anything a password can be (no blank or quote).
VALUE = st.text(alphabet=ALNUM + "!#$%^*~.+", min_size=10, max_size=40).filter(
    lambda v: v[0] not in "-." and sum(c.isalnum() for c in v) >= 8
)


@st.composite
def secret_name(draw: st.DrawFn) -> str:
    word = draw(st.sampled_from(FAMILY))
    prefix = draw(st.sampled_from(PREFIXES))
    if word == "pwd" and not prefix:
        prefix = "db_"  # a bare PWD is the shell's working directory, not a password
    name = prefix + word
    style = draw(st.sampled_from(["lower", "upper", "title"]))
    if style == "upper":
        name = name.upper()
    elif style == "title":
        name = "-".join(p.capitalize() for p in name.replace("_", "-").split("-"))
    return name


def _places(name: str, v: str) -> list[str]:
    flag = name.lower().replace("_", "-")
    env = name.upper().replace("-", "_")
    return [
        f"{name}={v}",
        f"{name} = '{v}'",
        f'{name}="{v}"',
        f"{name}: {v}",
        f'"{name}": "{v}"',
        f"'{name}': '{v}'",
        f'\\"{name}\\": \\"{v}\\"',  # JSON inside a Python repr or a JSON string
        f"&quot;{name}&quot;: &quot;{v}&quot;",  # HTML-escaped JSON
        f"b'{name}={v}'",
        f"{{'{name}': b'{v}'}}",
        f"--{flag} {v}",
        f"--{flag}={v}",
        f'export {env}="{v}"',
        f"{env}={v} vllm serve m",
        f"https://h.example/x?a=1&{name}={v}&b=2",
        f"-H '{name}: {v}'",
        f'{{"name": "{env}", "value": "{v}"}}',
        f"- name: {env} value: {v}",
    ]


def _url_places(v: str) -> list[str]:
    return [
        f"https://alice:{v}@mirror.example.com/m",
        f"postgres://u:{v}@db.internal:5432/app",
        f"redis://:{v}@cache:6379/0",
        f"s3://AKIDEXAMPLE:{v}@bucket/key",
        f"https://alice%3A{v}@mirror.example.com/m",
        f"https%3A%2F%2Falice%3A{v}%40mirror.example.com",
        f"ftp://u:a@{v}@files.example.org/x",  # a raw `@` in the password
        f"https://u:ab/{v}@host.example/x",  # a raw `/` in the password
        f"curl -u alice:{v} https://h.example/x",
    ]


@st.composite
def placed_secret(draw: st.DrawFn) -> tuple[str, str]:
    v = draw(VALUE)
    kind = draw(st.sampled_from(["named", "url"]))
    options = _places(draw(secret_name()), v) if kind == "named" else _url_places(v)
    line = draw(st.sampled_from(options))
    # The place's own words are not the secret: a value that is also a piece of them
    # (`example.co` of `mirror.example.com`) would be found there, masked or not.
    # Placed once: replacing it also removes such a piece (`alice:example.co@mirror.example.com`).
    fixed = line.replace(v, " ") + " ERROR 11-29 15:14:25 [core.py:1] "
    assume(line.count(v) == 1 and v not in fixed and v[-8:] not in fixed)
    return line, v


@st.composite
def random_token(draw: st.DrawFn, size: int | None = None) -> str:
    """A token as issuers make them: drawn from a CSPRNG, not a shrunk `000...AAA`."""
    rng = random.Random(draw(st.integers(0, 2**64)))
    n = size or draw(st.integers(24, 48))
    return "".join(rng.choice(ALNUM) for _ in range(n))


RANDOM_TOKEN = random_token()


@st.composite
def shaped_secret(draw: st.DrawFn) -> tuple[str, str]:
    """A token recognisable by its shape alone, in free text."""
    t = draw(RANDOM_TOKEN)
    shape = draw(st.sampled_from(["hf", "ghp", "pat", "sk", "jwt", "slack", "discord", "teams"]))
    value = {
        "hf": f"hf_{t}{t}"[:37],
        "ghp": f"ghp_{t}{t}"[:40],
        "pat": f"github_pat_11A{t}_{t}",
        "sk": f"sk-proj-{t}",
        "jwt": f"eyJhbGciOiJIUzI1NiJ9.eyJ{t}.{t[::-1]}",
        "slack": f"https://hooks.slack.com/services/T0{t[:8]}/B0{t[8:16]}/{t}",
        "discord": f"https://discord.com/api/webhooks/1234567890/{t}",
        "teams": f"https://acme.webhook.office.com/webhookb2/{t}/IncomingWebhook/{t[::-1]}",
    }[shape]
    secret = t if shape != "jwt" else t[::-1]
    context = draw(st.sampled_from(["got {s} back", "({s})", "'{s}'", "value {s}.", "[{s}]"]))
    return context.format(s=value), secret


@settings(max_examples=400, deadline=None)
@given(placed_secret(), st.sampled_from(["", "ERROR 11-29 15:14:25 [core.py:1] ", "  "]))
def test_a_value_in_a_secrets_place_is_masked(placed: tuple[str, str], prefix: str) -> None:
    line, value = placed
    out = scrub_text(prefix + line)
    assert value not in out, out
    assert value[-8:] not in out, out


@settings(max_examples=300, deadline=None)
@given(shaped_secret())
def test_a_token_is_masked_by_its_shape(shaped: tuple[str, str]) -> None:
    line, secret = shaped
    out = scrub_text(line)
    assert secret not in out and secret[-10:] not in out, out


def test_a_bare_random_token_is_masked_by_its_entropy() -> None:
    # With no prefix and no place, only the draw tells a key from a name: the test is a rate.
    rng = random.Random(20)
    for size in (20, 24, 32, 40):
        for alphabet in (ALNUM, ALNUM + "+/", ALNUM + "-_"):
            tokens = ["".join(rng.choice(alphabet) for _ in range(size)) for _ in range(500)]
            caught = sum(scrub_text(f"got {t} back") == f"got {redact.MASK} back" for t in tokens)
            assert caught >= 0.88 * len(tokens), (size, alphabet[-2:], caught)


@needs_corpus
def test_the_entropy_test_flags_nothing_in_the_corpus() -> None:
    # False positives would hide model names, paths and ids a reader needs.
    flagged = []
    for log in sorted(CORPUS.glob("*.log")):
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            flagged += [
                m.group(0) for m in redact._BLOB.finditer(line) if redact._random(m.group(0))
            ]
    assert flagged == []


@st.composite
def pem_block(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    kind = draw(
        st.sampled_from(
            [
                "PRIVATE KEY",
                "RSA PRIVATE KEY",
                "EC PRIVATE KEY",
                "OPENSSH PRIVATE KEY",
                "ENCRYPTED PRIVATE KEY",
                "CERTIFICATE",
                "EC PARAMETERS",
            ]
        )
    )
    width = draw(st.sampled_from([64, 70, 76]))
    body = draw(st.text(alphabet=ALNUM + "+/", min_size=40, max_size=400))
    body += "=" * draw(st.integers(0, 2))
    rows = [body[i : i + width] for i in range(0, len(body), width)]
    prefix = draw(st.sampled_from(["", "    ", "(EngineCore pid=7) ", "  12: "]))
    lines = [f"{prefix}-----BEGIN {kind}-----", *(prefix + r for r in rows)]
    lines.append(f"{prefix}-----END {kind}-----")
    return lines, [r for r in rows if len(r.rstrip("=")) >= 4]


@settings(max_examples=200, deadline=None)
@given(pem_block())
def test_a_pem_block_of_any_type_is_masked_whole(block: tuple[list[str], list[str]]) -> None:
    lines, rows = block
    out = "\n".join(scrub_lines(["INFO starting", *lines, "INFO Application startup complete."]))
    assert all(r not in out for r in rows), out
    assert out.endswith("INFO Application startup complete.")


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["hf_", "ghp_", "sk-proj-", "github_pat_11A"]),
    random_token(34),
    st.integers(1, 38),
    st.sampled_from([80, 100, 120]),
)
def test_a_token_split_by_a_line_wrap_is_masked_on_both_lines(
    prefix: str, token: str, cut: int, width: int
) -> None:
    value = prefix + token
    cut = min(cut, len(value) - 1)
    head = "ERROR 11-29 15:14:25 [hub.py:1] 401 with "
    first = (head + " " * width)[: width - cut] + value[:cut]
    second = value[cut:] + " while loading the model"
    out = scrub_lines([first, second])
    # Neither half of the token survives (6+ of its own characters, the prefix aside).
    at = max(0, cut - len(prefix))
    for half in (token[:at], token[at:]):
        if len(half) >= 6:
            assert half not in "\n".join(out), out
    assert out[1].endswith("while loading the model")


def test_a_yaml_env_entry_names_then_values_the_secret() -> None:
    out = scrub_lines(["env:", "  - name: HF_TOKEN", "    value: Zq9fLw2pXy", "  - name: HF_HOME"])
    assert out[2] == "    value: ***" and out[3] == "  - name: HF_HOME"


def test_every_later_value_of_a_multi_valued_api_key_is_masked_in_text() -> None:
    out = scrub_text("vllm serve m --api-key k1Secret -k2Secret k3Secret --port 8000")
    assert "Secret" not in out and out.endswith("--port 8000")


@pytest.mark.parametrize(
    "line",
    [
        "KeyError: 'model.layers.0.mlp.experts.w13_weight'",
        "The model `DeepSeek-R1-Distill-Qwen-32B-Q4_K_M` does not exist.",
        "vllm serve /tmp/model/Qwen3-Coder-480B-A35B-Instruct-FP8 --port 8000",
        "Qwen2VLForConditionalGeneration has no vLLM implementation",
        "ssh://git@github.com/vllm-project/vllm.git",
        "passing tests pass=true, key_cache=None",
        "PWD=/home/alice/work",
    ],
)
def test_names_paths_and_words_are_left_alone(line: str) -> None:
    assert scrub_text(line) == line


# -- through every analyze output -----------------------------------------------------------

FORMATS = ("text", "json", "jsonl", "markdown", "html")
HEAD = "INFO 11-29 15:14:20 [api_server.py:1] vLLM API server version 0.11.0"
OOM = "ERROR 11-29 15:14:25 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. ctx "


def _outputs(log: Path) -> list[tuple[str, str]]:
    runner = CliRunner()
    outs = []
    for fmt in FORMATS:
        for flag in ((), ("--redact",)):
            res = runner.invoke(cli, ["analyze", "--format", fmt, *flag, str(log)])
            outs.append((f"{fmt} {' '.join(flag)}", res.output))
    return outs


_STATIC: list[str] = []


def _static_text(folder: Path) -> str:
    """Every output of a log that holds no secret: what the pages print of their own."""
    if not _STATIC:
        log = folder / "plain.log"
        log.write_text(f"{HEAD}\n{OOM}\n", encoding="utf-8")
        _STATIC.append("\n".join(out for _, out in _outputs(log)))
    return _STATIC[0]


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(st.one_of(placed_secret(), shaped_secret()), min_size=1, max_size=4),
    st.booleans(),
)
def test_no_generated_secret_reaches_any_analyze_output(
    tmp_path_factory: pytest.TempPathFactory, secrets: list[tuple[str, str]], gz: bool
) -> None:
    lines = [HEAD] + [OOM + line for line, _ in secrets]
    assume(all(v not in HEAD + OOM for _, v in secrets))
    folder = tmp_path_factory.mktemp("gen")
    # A value whose tail the pages print anyway (`conclusi` of the HTML's `.inconclusive`)
    # would be found though masked: such draws are refused, the assertion is unchanged.
    static = _static_text(folder)
    assume(all(v not in static and v[-8:] not in static for _, v in secrets))
    data = ("\n".join(lines) + "\n").encode()
    log = folder / ("s.log.gz" if gz else "s.log")
    log.write_bytes(gzip.compress(data) if gz else data)
    for where, out in _outputs(log):
        assert "CUDA out of memory" in out, where  # the planted lines are shown as evidence
        for _, value in secrets:
            assert value not in out and value[-8:] not in out, (where, value, out[:2000])


@pytest.mark.parametrize(
    "name",
    ["password=Zq9fLw2pXyHunter.log", "alice:Zq9fLw2pXyHunter@gpu.example.com.log"],
)
def test_a_secret_in_the_file_name_is_masked(tmp_path: Path, name: str) -> None:
    log = tmp_path / name
    log.write_text(f"{HEAD}\n{OOM}\n")
    for where, out in _outputs(log):
        assert "CUDA out of memory" in out, where
        assert "Zq9fLw2pXyHunter" not in out and "pXyHunter" not in out, (where, out[:1500])


# -- compare's artifacts ----------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(placed_secret(), shaped_secret())
def test_compare_argv_env_and_records_hide_generated_secrets(
    placed: tuple[str, str], shaped: tuple[str, str]
) -> None:
    (line, value), (free, token) = placed, shaped
    # One argument holding the place, and a flag or curl's -u as the shell splits them.
    split = line.split(" ") if line.startswith(("--", "curl")) else []
    argv = ["vllm", "serve", "m", "--override", line, *split, "--model", free]
    env = {"HF_ENDPOINT": line, "NOTE": free}
    record = {"request": {"prompt": free}, "evidence": [{"text": line}, {"text": free}]}
    dumped = " ".join(scrub_argv(argv)) + json.dumps(scrub_env(env))
    dumped += json.dumps(redact.scrub_data(record))
    assert value not in dumped and token not in dumped, dumped


def test_scrub_file_masks_a_wrapped_token_on_both_lines(tmp_path: Path) -> None:
    token = "hf_" + "Q7vX2kLp9RtZ4mWb8NcYs3Hf6Jd1GqUe5A"
    src = tmp_path / "server.log"
    first = ("ERROR 11-29 15:14:25 [hub.py:1] 401 with " + " " * 80)[:70] + token[:10]
    src.write_text(f"INFO start\n{first}\n{token[10:]} while loading\nINFO done\n")
    redact.scrub_file(src)
    out = src.read_text()
    assert token[3:10] not in out and token[10:] not in out, out
    assert out.endswith("while loading\nINFO done\n") and out.startswith("INFO start\n")


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["Authorization: Bearer", "Bearer", "password:", "--api-key", "HF_TOKEN="]),
    st.text(alphabet=ALNUM + "._-", min_size=10, max_size=40).filter(lambda v: v[0].isalnum()),
    st.sampled_from([60, 80]),
)
def test_a_value_wrapped_onto_the_next_line_after_its_name_is_masked(
    name: str, value: str, width: int
) -> None:
    assume(not value.isalpha())  # a word (`Error`) after `Bearer` is no token
    head = "ERROR 11-29 15:14:25 [hub.py:1] request with " + " " * width
    first = head[: width - len(name) - 1] + " " + name
    out = scrub_lines([first, value + " while loading"])
    assert value not in "\n".join(out), out


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.one_of(placed_secret(), shaped_secret()), min_size=1, max_size=6))
def test_a_saved_server_log_hides_every_generated_secret(
    tmp_path_factory: pytest.TempPathFactory, secrets: list[tuple[str, str]]
) -> None:
    # compare keeps each mode's server log only through scrub_file.
    log = tmp_path_factory.mktemp("mode") / "mode-0.log"
    log.write_text(
        "".join(f"(APIServer pid=1) INFO 11-29 [x.py:1] {line}\n" for line, _ in secrets)
    )
    redact.scrub_file(log)
    out = log.read_text()
    for _, value in secrets:
        assert value not in out and value[-8:] not in out, out
