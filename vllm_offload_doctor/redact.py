"""Keep secrets (HF tokens, API keys, bearer tokens) out of reports and saved artifacts."""

from __future__ import annotations

import os
import re

_SECRET_NAME = re.compile(r"(?i)(token|secret|api[_-]?key|password|passwd|access[_-]?key|auth)")

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), "hf_***"),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}\b"), "sk-***"),
    (re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._\-~+/=]{8,}"), r"\1***"),
    (
        re.compile(
            r"(?i)(['\"]?(?:api_key|hf_token|token|password|secret)['\"]?\s*[:=]\s*['\"]?)"
            r"(?!None\b|none\b|\*\*\*)([^'\",\s}]+)"
        ),
        r"\1***",
    ),
    (re.compile(r"(?i)(--(?:api-key|hf-token)[= ])(\S+)"), r"\1***"),
    (
        re.compile(r"(?i)\b([A-Z0-9_]*(?:TOKEN|SECRET|API_KEY|PASSWORD)[A-Z0-9_]*=)(\S+)"),
        r"\1***",
    ),
)

_HOME = re.compile(r"(/home/|/Users/)[^/\s'\"]+")
_ROOT_HOME = re.compile(r"(?<![\w/])/root(?=/)")


def is_secret_name(name: str) -> bool:
    """True for environment variable names that may hold a credential."""
    return bool(_SECRET_NAME.search(name))


def redact(text: str, *, hosts: bool = False, home: bool = False) -> str:
    """Mask secrets; optionally also host names and home-directory user names."""
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    if home:
        text = _HOME.sub(r"\1<user>", text)
        text = _ROOT_HOME.sub("~", text)
    if hosts:
        for name in _host_names():
            text = text.replace(name, "<host>")
    return text


def redact_argv(argv: list[str]) -> list[str]:
    """Mask the values of secret-bearing command-line options."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and is_secret_name(flag):
            if "=" in arg:
                out.append(f"{flag}=***")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact(arg))
    return out


def _host_names() -> list[str]:
    import socket

    names = {socket.gethostname(), os.uname().nodename}
    return sorted(
        (n for n in names if n and n != "localhost" and len(n) > 2), key=len, reverse=True
    )
