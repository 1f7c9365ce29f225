"""Planted secrets, shared by the leak tests of every command.

`SECRETS` maps a kind to a secret value; `secret_log()` is a vLLM log whose evidence-worthy
lines carry every one of them; `assert_no_leak(text)` fails naming each kind found in `text`.
Compare's tests plant the same values in arguments and the environment (`SECRET_ARGV`,
`SECRET_ENV`) and grep its artifacts with the same helper.
"""

from __future__ import annotations

# Every value is unique and appears nowhere else: a hit in the output is a leak.
SECRETS: dict[str, str] = {
    "hf_token": "hf_QpWoEiRuTyAlSkDjFhGzXmCnVb3141592653",
    "openai_key": "sk-proj-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0Fe",
    "github_classic": "ghp_R4nD0mCl4ss1cT0k3nAbCdEfGhIjKlMnOpQr",
    "github_oauth": "gho_0AuthT0k3nQwErTyUiOpAsDfGhJkLzXcVbNm",
    "github_fine_grained": "github_pat_11ABCDEFG0aBcDeFgHiJkL_MnOpQrStUvWxYz0123456789AbCdEfGhIjKlMnOp",
    "aws_access_key_id": "AKIAQ3EGRAW5EXAMPLE7",
    "aws_secret_key": "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",
    "slack_bot": "xoxb-2718281828-3141592653-AbCdEfGhIjKlMnOpQrStUv",
    "gitlab": "glpat-Gl4bP3rs0n4lT0k3nXyZ",
    "google_api": "AIzaSyD4x7Q9kW2mR5tV8yB1nC3fH6jL0pS2uE",
    "jwt": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJzdXBwb3J0LTQyIn0.Tk3nS1gN4tUr3_Xq9LmZp2Rv7Yw",
    "url_password": "Pa55w0rdInUrl!x",
    "bearer": "opaqueBearer7f3k9QzT2mW8",
    "basic_auth": "YWxpY2U6czNjcjN0LWJhc2ljLWF1dGg=",
    "api_key_arg": "vllm-serve-api-key-7Hq2",
    "api_key_non_default": "nd-api-key-Pz8Kd3Lw",
    "json_password": "Jz0n-Pa55-Qv7",
    "stripe": "sk_live_51HsTr1p3K3yAbCdEfGhIjKl",
    "pem_body": "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7PlAnTeD0Key",
    "env_api_key": "env-vllm-key-Rq4Tz",
    "high_entropy_bare": "Q7vX2kLp9RtZ4mWb8NcYs3Hf6Jd1GqUe5Ao0Ki",
}

_S = SECRETS
_PEM_INLINE = "-----BEGIN PRIVATE KEY-----\\n" + _S["pem_body"] + "\\n-----END PRIVATE KEY-----\\n"
_ERR = "(APIServer pid=1) ERROR 11-29 15:14:25 [api_server.py:1]"


def secret_log() -> str:
    """A vLLM 0.25-style log whose 401 download failure carries every planted secret."""
    return "\n".join(
        [
            f"$ HF_TOKEN={_S['hf_token']} VLLM_API_KEY={_S['env_api_key']} vllm serve "
            f"meta-llama/Llama-3.1-8B --api-key {_S['api_key_arg']} --port 8000",
            "(APIServer pid=1) INFO 11-29 15:14:20 [utils.py:253] non-default args: "
            "{'model_tag': 'meta-llama/Llama-3.1-8B', 'api_key': "
            f"['{_S['api_key_non_default']}'], 'hf_token': '{_S['hf_token']}', "
            "'model': 'meta-llama/Llama-3.1-8B', 'cpu_offload_gb': 4.0}",
            f"{_ERR} 401 Client Error: Unauthorized for url: "
            f"https://mirror-user:{_S['url_password']}@hf-mirror.example.com/api/models "
            f"(token {_S['hf_token']}, aws_secret_access_key = {_S['aws_secret_key']})",
            f"{_ERR} 401 Client Error: key {_S['aws_access_key_id']} Authorization: Bearer "
            f"{_S['bearer']} jwt {_S['jwt']} gh {_S['github_classic']}",
            f"{_ERR} 401 Client Error: {_S['github_oauth']} {_S['github_fine_grained']} "
            f"{_S['openai_key']} {_S['slack_bot']} {_S['gitlab']}",
            f"{_ERR} 401 Client Error: {_S['google_api']} {_S['stripe']} "
            f"'authorization': 'Basic {_S['basic_auth']}' blob {_S['high_entropy_bare']}",
            f'{_ERR} 401 Client Error: {{"password": "{_S["json_password"]}", '
            f'"private_key": "{_PEM_INLINE}"}} --api-key {_S["api_key_arg"]} '
            f"VLLM_API_KEY={_S['env_api_key']}",
            "Traceback (most recent call last):",
            '  File "/home/alice/venv/lib/python3.11/site-packages/huggingface_hub/utils/'
            '_errors.py", line 304, in hf_raise_for_status',
            "-----BEGIN RSA PRIVATE KEY-----",
            _S["pem_body"],
            "-----END RSA PRIVATE KEY-----",
            "requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: "
            f"https://huggingface.co/api/models token={_S['hf_token']}",
            "",
        ]
    )


SECRET_ARGV = [
    "--api-key",
    _S["api_key_arg"],
    f"--hf-token={_S['hf_token']}",
    "--model",
    f"https://u:{_S['url_password']}@mirror.example.com/m",
]
SECRET_ENV = {
    "HF_TOKEN": _S["hf_token"],
    "VLLM_API_KEY": _S["env_api_key"],
    "HF_ENDPOINT": f"https://mirror-user:{_S['url_password']}@hf-mirror.example.com",
    "AWS_SECRET_ACCESS_KEY": _S["aws_secret_key"],
}


# Kinds recognised by their shape alone, wherever they stand (a prefix, a JWT, a key id, a
# long high-entropy run); the others are secrets only by their place (see PLACES).
SELF_EVIDENT = frozenset(
    {
        "hf_token",
        "openai_key",
        "github_classic",
        "github_oauth",
        "github_fine_grained",
        "aws_access_key_id",
        "aws_secret_key",
        "slack_bot",
        "gitlab",
        "google_api",
        "jwt",
        "stripe",
        "pem_body",
        "high_entropy_bare",
    }
)

# Places that make any value a secret, as logs, configs and command lines write them.
# `{v}` is the value; every place masks it whatever it is.
PLACES = (
    "token={v}",
    "HF_TOKEN={v}",
    "VLLM_API_KEY='{v}'",
    "password: {v}",
    "aws_secret_access_key = {v}",
    '"api_key": "{v}"',
    '{{"password": "{v}", "user": "x"}}',
    "'api_key': ['{v}']",
    "'hf_token': '{v}',",
    "--api-key {v}",
    "--hf-token={v}",
    "https://user:{v}@mirror.example.com/models",
    "redis://:{v}@cache:6379/0",
    "Authorization: Bearer {v}",
    "'authorization': 'Basic {v}'",
    "Proxy-Authorization: {v}",
    "-H 'Authorization: token {v}'",
    "client_secret={v}&grant_type=x",
)


def planted_line(kind: str, place: str | None) -> str:
    """A secret of `kind` in `place` (None: bare, for SELF_EVIDENT kinds only)."""
    value = SECRETS[kind]
    if place is None:
        assert kind in SELF_EVIDENT, kind
        return value
    return place.format(v=value)


def leaks(text: str) -> list[str]:
    """The kinds of planted secret that appear in `text` (also JSON-escaped)."""
    text = text + "\n" + text.replace("\\/", "/")
    # The whole value, or its last 12 characters (a value masked only in part still leaks).
    return [kind for kind, value in SECRETS.items() if value in text or value[-12:] in text]


def assert_no_leak(text: str, where: str = "output") -> None:
    found = leaks(text)
    assert not found, f"{len(found)} secret kind(s) leaked in {where}: {', '.join(found)}"
