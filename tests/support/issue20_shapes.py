"""The secret shapes issue 20's attack round named, one case each, as data.

Each case is (name, lines, secrets): the log lines that carry the secret as a user or a server
would write them, and the pieces of it that must not survive masking (8+ characters each, so a
hit is a leak, not a coincidence). Shared by tests/cli/test_issue20_shapes.py and
bench/bench_issue20.py (which counts the leaks of an older tree).
"""

from __future__ import annotations

HEX40 = "3f9a1c7e5b2d8f40a6c9e1b7d3f5a2c8e4b6d0f1"
OPAQUE = "Zq9fLw2pXyKd7Tn4Rb8M"
PW = "Sup3rS3cretPw"
HF = "hf_Q7vX2kLp9RtZ4mWb8NcYs3Hf6Jd1GqUe5A"
BEARER = "opaqueBearer7f3k9QzT2mW8xR4"
EC_ROWS = [
    "MHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oYJF1Ct5jW2eoAoGCCqGSM49",
    "AwEHoUQDQgAEZjQLlbXwYPvK0mrYyK5DNGh3F9wBcq2i1Az3LcTq0uJ8b7XkQd1b",
    "Yw3kU0f2Vn8P4oJxRt6Hs9LmQaZ1Cg==",
]
KEYS = [f"k{i:02d}-{OPAQUE[i % 7 :]}{i:03d}" for i in range(14)]  # a list past 200 characters

ERR = "(APIServer pid=1) ERROR 11-29 15:14:25 [api_server.py:1]"
WRAP = "ERROR 11-29 15:14:25 [hub.py:1]"  # a line that a terminal wrapped at 80 columns

CASES: list[tuple[str, list[str], list[str]]] = [
    ("URL userinfo, 40-hex token", [f"{ERR} GET https://user:{HEX40}@hub.example/x"], [HEX40]),
    ("URL userinfo, opaque token", [f"{ERR} GET https://user:{OPAQUE}@hub.example/x"], [OPAQUE]),
    ("URL userinfo, token only", [f"{ERR} GET https://{HEX40}@hub.example/x"], [HEX40]),
    (
        "URL-encoded userinfo",
        [f"{ERR} GET https://alice%3A{PW}%40hub.example/x"],
        [PW],
    ),
    (
        "URL-encoded URL in a query",
        [f"{ERR} next=https%3A%2F%2Falice%3A{PW}%40hub.example%2Fx"],
        [PW],
    ),
    ("DB_PASS= env line", [f"DB_PASS={PW}"], [PW]),
    ("MYSQL_PWD= env line", [f"MYSQL_PWD={PW}"], [PW]),
    ("pass=", [f"{ERR} connecting with pass={PW}"], [PW]),
    ("curl -u user:pass", [f"$ curl -u alice:{PW} https://hub.example/x"], [PW]),
    ("postgres URL", [f"{ERR} postgres://u:{PW}@db.internal:5432/app"], [PW]),
    ("URL with @ in the password", [f"{ERR} postgres://u:{PW}@x@db.internal/app"], [PW]),
    ("URL with / in the password", [f"{ERR} https://u:Ab/{PW}@hub.example/x"], [PW]),
    (
        "GCP private_key_id",
        [f'{ERR} {{"type": "service_account", "private_key_id": "{HEX40}"}}'],
        [HEX40],
    ),
    (
        "Slack webhook",
        [f"{ERR} POST https://hooks.slack.com/services/T0AB12CD3/B0EF45GH6/{OPAQUE}Xy12"],
        [OPAQUE],
    ),
    (
        "Discord webhook",
        [f"{ERR} POST https://discord.com/api/webhooks/1234567890123/{OPAQUE}-abc_DEF"],
        [OPAQUE],
    ),
    (
        "Azure SAS sig=",
        [
            f"{ERR} GET https://acct.blob.core.windows.net/c/b?sv=2022-11-02&se=2026-12-31"
            f"&sr=b&sp=r&sig={OPAQUE}%2Bab%3D"
        ],
        [OPAQUE],
    ),
    (
        "Azure DevOps password",
        [f"{ERR} git fetch https://org:{HEX40[:20]}{OPAQUE}@dev.azure.com/org/p/_git/r"],
        [OPAQUE],
    ),
    ("second --api-key value", [f"$ vllm serve m --api-key k1-{OPAQUE} k2-{PW}"], [OPAQUE, PW]),
    ("dashed --api-key value", [f"$ vllm serve m --api-key -{OPAQUE} --port 8000"], [OPAQUE]),
    ("key in a bytes repr", [f"{ERR} sent b'Authorization: Bearer {BEARER}'"], [BEARER]),
    ("token= in a bytes repr", [f"{ERR} body b'token={OPAQUE}&x=1'"], [OPAQUE]),
    ("JSON password", [f'{ERR} {{"user": "alice", "password": "{PW}"}}'], [PW]),
    ("JSON bare key", [f'{ERR} {{"key": "{OPAQUE}"}}'], [OPAQUE]),
    (
        "HTML-escaped JSON",
        [f"{ERR} <pre>{{&quot;password&quot;: &quot;{PW}&quot;}}</pre>"],
        [PW],
    ),
    (
        "JSON inside a JSON string",
        [f'{ERR} {{"body": "{{\\"api_key\\": \\"{OPAQUE}\\"}}"}}'],
        [OPAQUE],
    ),
    (
        "key list over 200 characters",
        [f"{ERR} non-default args: {{'api_key': {KEYS!r}}}"],
        [k for k in KEYS if len(k) >= 8],
    ),
    (
        "HF token wrapped at 80 columns",
        [
            (f"{WRAP} 401 with " + " " * 80)[: 80 - 17] + HF[:17],
            HF[17:] + " while loading the model",
        ],
        [HF[3:17], HF[17:]],
    ),
    (
        "Bearer wrapped at 80 columns",
        [
            (f"{WRAP} request with " + " " * 80)[: 80 - 21] + "Authorization: Bearer",
            BEARER + " was refused",
        ],
        [BEARER],
    ),
    (
        "k8s env YAML",
        ["env:", "  - name: HF_TOKEN", f"    value: {OPAQUE}", "  - name: HF_HOME"],
        [OPAQUE],
    ),
    (
        "multi-line EC PEM",
        ["-----BEGIN EC PRIVATE KEY-----", *EC_ROWS, "-----END EC PRIVATE KEY-----"],
        [r.rstrip("=")[:24] for r in EC_ROWS],
    ),
]

# File names that hold a secret (analyze shows the file it read).
FILE_NAMES: list[tuple[str, str]] = [
    (f"password={PW}.log", PW),
    (f"alice:{PW}@gpu.example.com.log", PW),
    (f"run-token={OPAQUE}.log.gz", OPAQUE),
]
