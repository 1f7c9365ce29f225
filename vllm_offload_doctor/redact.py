"""Keep secrets out of every report and saved artifact, by their shapes and their places.

API for the commands (all pure, all linear-time):

- `scrub_text(text)`: mask secrets in any text, one line or many (PEM blocks span lines).
- `scrub_lines(lines)`: the same over a sequence of lines, same count out (evidence lists).
- `scrub_argv(argv)`: a command line; values of secret-named options are masked too
  (`--api-key X`, `--hf-token=X`, every value of the multi-valued `--api-key K1 K2`).
- `scrub_env(env)`: an environment; values of secret-named variables become `***`, and
  secrets inside the others are masked (`HF_ENDPOINT=https://u:***@mirror`).
- `scrub_file(src, dst=None)`: stream a log file through the masking, into `dst` or in place
  (a temporary file beside `src`, renamed over it); memory stays bounded by MAX_PIECE.
- `scrub_data(record)`: a JSON-like record: every string, and whole values under secret keys.
- `redact(text, hosts=, home=)`: `scrub_text` plus, on request, host names and home paths.
- `is_secret_name(name)`: a variable or key name that holds a credential.
- `is_secret_env(name)`: the same for environment variables, a wider net (`*_KEY`, `*_PASS`).

Recognised: URL userinfo passwords, PEM private-key blocks, `key=value` / `key: value` /
JSON / Python-repr pairs and `--option value` pairs whose key names a secret, `Authorization:`
and `Bearer` values, known token prefixes (Hugging Face, GitHub, OpenAI, Slack, AWS, GitLab,
Google, Stripe), JWTs, and long high-entropy base64 runs. Every pattern runs under RE2 (an
automaton: linear in the input whatever the input; no backtracking), on lines the reader has
already capped at 256 KiB. A line with more than MAX_PLACES matches of one pattern (a crafted
or junk line) keeps its first MAX_PLACES masked places and loses the rest to CROWDED: the
cost per line stays bounded and nothing after the cap can leak.

Compare (and anything that saves files) should pass every argv through `scrub_argv`, every
environment through `scrub_env`, every free text through `scrub_text`, every record through
`scrub_data`, and every saved server log through `scrub_file(path)` before it is kept.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

import re2

MASK = "***"

# Names a key or variable ends with when it holds a credential (`tokens`, `tokenizer` do not).
_SECRET_WORDS = (
    r"token|secret|secret[_-]?key|passw(?:or)?d|passphrase|pass|[_-]pwd|credentials?|auth|authorization"
    r"|(?:api|access|private|signing|client|master|encryption|account|storage)[_-]?key"
    r"|apikey|cookie|signature"
)
_NAME = re2.compile(rf"(?i)(?:{_SECRET_WORDS})$")
# Values that say nothing secret (`'hf_token': True` means "use the cached token").
_HARMLESS = frozenset({"", "none", "null", "true", "false", "nil", "***", "<redacted>", "[]"})

_TOKENS = (
    r"\bhf_[A-Za-z0-9]{20,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}"
    r"|\bgithub_pat_[A-Za-z0-9_]{22,}"
    r"|\bsk-(?:proj-|ant-|live-|test-|svcacct-)?[A-Za-z0-9_-]{16,}"
    r"|\b[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|\bxox[abeoprs]-[A-Za-z0-9-]{10,}"
    r"|\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b"
    r"|\bglpat-[A-Za-z0-9_-]{16,}"
    r"|\bAIza[0-9A-Za-z_-]{35}"
    r"|\bhooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_-]{8,}"
    r"|\bdiscord(?:app)?\.com/api/webhooks/[0-9]{5,}/[A-Za-z0-9_-]{8,}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"
)
_TOKEN = re2.compile(_TOKENS)
_KEY_WORDS = _SECRET_WORDS.replace("|authorization", "")  # Authorization has its own pass
_VALUE = r"[^\s'\",;})\]\\]+"
# One pattern per place, applied in turn. Each is linear under RE2, and the parts that could
# keep a failing alternative alive for long (the `[...]` list) are bounded, so that `sub`
# never re-scans far past a match: total cost stays linear in the line.
_URL = re2.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]{1,20}://)([^\s/@:'\"]{0,256}):([^\s/@'\"]{1,256})@")
_CURL_USER = re2.compile(r"((?:^|\s)(?:-u|--user)(?:=|\s{1,3})[\"']?[^\s:'\"]{1,256}:)([^\s'\"]{1,256})")
_URL_ENC = re2.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]{1,20}://[^\s/@:'\"%]{0,256}%3[Aa])([^\s/@'\"]{1,256})@")
_AUTH = re2.compile(
    r"((?i:\b(?:proxy-)?authorization)[\"']?\s{0,5}[:=]\s{0,5}[\"']?"
    r"(?i:(?:bearer|basic|token|digest|negotiate|apikey)\s{1,5})?)"
    rf"({_VALUE})"
)
_BEARER = re2.compile(r"((?i:\bbearer)\s{1,5})([A-Za-z0-9._~+/=-]{8,})")
_OPT = re2.compile(
    rf"(--[A-Za-z0-9_-]{{0,40}}?(?i:{_SECRET_WORDS})(?:=|\s{{1,3}}))([^\s'\"-][^\s'\"]*)"
)
_KEY = re2.compile(
    rf"((?i:{_KEY_WORDS})\\?[\"']?\s{{0,5}}[:=]\s{{0,5}}\\?)"
    # One group for the value (a list, a quoted string or a bare word): fewer group look-ups per
    # match, which is most of the cost on a line crowded with `token=` pairs.
    r"(\[[^\]\n]{0,200}\]|\"[^\"\n\\]*\"?|'[^'\n\\]*'?"
    rf"|{_VALUE})"
)
# Last, so that a long harmless run never hides a key=value inside it.
_BLOB = re2.compile(r"[A-Za-z0-9+/_-]{32,}={0,2}")
_PEM_BEGIN = re2.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re2.compile(r"-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_PEM_BODY = re2.compile(
    r"^(?P<pre>(?:.{0,200}[\s:|])?)(?P<body>[A-Za-z0-9+/]{16,}={0,2}|[A-Za-z0-9+/]+=)\s{0,8}$"
)
_PEM_HEADER = re2.compile(r"(?:Proc-Type|DEK-Info|Comment):|^\s{0,200}$")

_HOME = re2.compile(r"(/home/|/Users/)[^/\s'\"]+")
_ROOT_HOME = re2.compile(r"(^|[^\w/])/root/")


def is_secret_name(name: str) -> bool:
    """True for a variable, option or key name that may hold a credential."""
    return bool(_NAME.search(name.strip("'\" -").replace("-", "_")[-80:]))


def _base64ish(run: str) -> bool:
    return (
        run.endswith("=")
        or any(c.isdigit() or c in "+/" for c in run)
        or not (run.isupper() or run.islower())
    )


def _harmless(value: str) -> bool:
    return value.strip().strip("'\"").lower() in _HARMLESS


def _random(run: str) -> bool:
    """A long run of mixed upper, lower and digits with high character entropy: a key."""
    core = run.rstrip("=")
    if core.startswith(("_Z", "__Z")):
        return False  # a mangled C++ symbol
    if not (any(c.isupper() for c in core) and any(c.islower() for c in core)):
        return False
    if not any(c.isdigit() for c in core) and "+" not in core and "/" not in core:
        return False
    if "/" in core and any(len(s) >= 6 and s.lower() == s for s in core.split("/")):
        return False  # a path: .../snapshots/<hex commit>/...
    counts = Counter(core)
    n = len(core)
    entropy = -sum(k / n * math.log2(k / n) for k in counts.values())
    # Random base64 of 32+ characters scores ~4.6-5.9; words, paths and hex stay below 4.4.
    return entropy >= min(4.5, math.log2(n) - 0.5)


def _url(m: Any) -> str:
    scheme, user = str(m.group(1)), str(m.group(2))
    return f"{scheme}{_TOKEN.sub(MASK, user)}:{MASK}@"


def _prefixed(m: Any) -> str:
    value = str(m.group(2))
    return str(m.group(1)) + (value if _harmless(value) else MASK)


def _bearer(m: Any) -> str:
    value = str(m.group(2))
    keep = value.isalpha() and len(value) < 20  # "Bearer authentication failed"
    return str(m.group(1)) + (value if keep else MASK)


def _key(m: Any) -> str:
    key: str = str(m.group(1))
    value: str = str(m.group(2))
    first = value[0]
    if first == "[" and value[-1] == "]":
        return key + (value if not value[1:-1].strip() else f"['{MASK}']")
    if first in "'\"":
        close = first if len(value) > 1 and value[-1] == first else ""
        inner = value[1 : len(value) - len(close)]
        return key + (value if _harmless(inner) else f"{first}{MASK}{close}")
    return key + (value if _harmless(value) else MASK)


def _blob(m: Any) -> str:
    run = str(m.group(0))
    return MASK if _random(run) else run


_PASSES: tuple[tuple[Any, Any], ...] = (
    (_URL, _url),
    (_URL_ENC, lambda m: f"{m.group(1)}{MASK}@"),
    (_CURL_USER, _prefixed),
    (_AUTH, _prefixed),
    (_BEARER, _bearer),
    (_OPT, _prefixed),
    (_KEY, _key),
    (_TOKEN, MASK),
    (_BLOB, _blob),
)


def _scrub_line(line: str) -> str:
    if not line:
        return line
    line = str.__str__(line)  # a plain str: re2 rebuilds results with type(text)()
    begin = _PEM_BEGIN.search(line)
    if begin is not None:
        end = _PEM_END.search(line, begin.end())
        stop = end.start() if end else len(line)
        if line[begin.end() : stop].strip():
            line = line[: begin.end()] + MASK + line[stop:]
    for pattern, repl in _PASSES:
        line = _sub(pattern, repl, line)
    return line


MAX_PLACES = 256  # matches of one pattern in one line; past it the rest of the line is hidden
CROWDED = f" {MASK} (rest of line hidden: over {MAX_PLACES} secret-like places)"


def _sub(pattern: Any, repl: Any, line: str) -> str:
    """`pattern.sub(repl, line)` with at most MAX_PLACES replacements, then the rest hidden.

    Each match costs a few microseconds of Python; a crafted line of 256 KiB holds ~40 000
    `token=` pairs. Hiding what follows the cap keeps the work per line bounded, and a line that
    crowded is junk or an attack: nothing a reader needs.
    """
    pieces: list[str] = []
    end = 0
    for n, m in enumerate(pattern.finditer(line)):
        if n == MAX_PLACES:
            pieces.append(CROWDED)
            return "".join(pieces)
        pieces.append(line[end : m.start()])
        pieces.append(repl(m) if callable(repl) else repl)
        end = m.end()
    if not pieces:
        return line
    pieces.append(line[end:])
    return "".join(pieces)


class _PemState:
    """Masks the body lines of a PEM private-key block that spans lines."""

    def __init__(self) -> None:
        self.inside = False

    def line(self, raw: str) -> str:
        if self.inside:
            if _PEM_END.search(raw):
                self.inside = False
                return _scrub_line(raw)
            body = _PEM_BODY.search(raw)
            if body is not None and _base64ish(str(body.group("body"))):
                return str(body.group("pre")) + MASK
            if _PEM_HEADER.search(raw):
                return _scrub_line(raw)
            self.inside = False  # not a key body any more: a truncated block
        out = _scrub_line(raw)
        if _PEM_BEGIN.search(raw) and not _PEM_END.search(raw):
            self.inside = True
        return out


def line_scrubber() -> Callable[[str], str]:
    """Masks one line at a time, in order (PEM blocks spanning lines included): for a log read
    as it is written."""
    return _PemState().line


def scrub_lines(lines: Iterable[str]) -> list[str]:
    """Mask secrets in consecutive lines (PEM blocks spanning lines included)."""
    pem = _PemState()
    return [pem.line(line) for line in lines]


def scrub_text(text: str) -> str:
    """Mask every secret in `text` (one line or many); the line structure is kept."""
    if "\n" not in text:
        return _scrub_line(text)  # a begin marker alone hides the rest of its line
    return "\n".join(scrub_lines(text.split("\n")))


# Options that take several values (`vllm serve --api-key K1 K2`): every value until the next
# option is a secret.
_MULTI_VALUED = frozenset({"api_key", "api_keys"})
_SCHEMES = frozenset({"bearer", "basic", "token", "digest", "negotiate", "apikey"})
_ARG_KEY = re2.compile(
    rf"(?i)(?:(?:{_SECRET_WORDS})[\"']?\s{{0,5}}[:=]|--[A-Za-z0-9_-]{{0,40}}(?:{_SECRET_WORDS})"
    r"|\bbearer|\bbasic)\s{0,5}$"
)


def scrub_argv(argv: Sequence[str]) -> list[str]:
    """Mask a command line: values of secret-named options, and secrets anywhere."""
    out: list[str] = []
    hide = 0  # values still to hide: 1 after `--token`, "all until the next option" = -1
    named = False  # the previous argument was a secret's name
    for arg in argv:
        if hide and not (hide < 0 and arg.startswith("-")):
            if hide > 0 and arg.strip("'\"").lower() in _SCHEMES:
                out.append(arg)  # `Authorization:` `Bearer` `<token>`: the token is next
                continue
            out.append(arg if _harmless(arg) else MASK)
            hide = hide if hide < 0 else hide - 1
            continue
        hide = 0
        flag, eq, value = arg.partition("=")
        if flag.startswith("-") and is_secret_name(flag):
            if eq:
                out.append(f"{flag}={value if _harmless(value) else MASK}")
            else:
                out.append(arg)
                multi = flag.strip("-").replace("-", "_").lower() in _MULTI_VALUED
                hide = -1 if multi else 1
            continue
        out.append(scrub_text(arg))
        if _ARG_KEY.search(arg) or (arg in ("=", ":") and named):
            hide = 1  # `password:`, `password =`, `Bearer`, `(--token`: the value comes next
        named = is_secret_name(arg)
    return out


# Environment names are shouted and terse: `AZURE_OPENAI_KEY`, `SMTP_PASS`, `GITLAB_PAT`.
_ENV_NAME = re2.compile(r"(?:^|_)(?:[A-Z0-9]*KEY|PASS|PAT|CREDS)$")


def is_secret_env(name: str) -> bool:
    """True for an environment variable that holds a credential (a wider net than keys)."""
    return is_secret_name(name) or bool(_ENV_NAME.search(name.upper()))


def scrub_env(env: Mapping[str, str]) -> dict[str, str]:
    """Mask an environment: secret-named variables wholly, secrets in the others."""
    return {k: (MASK if is_secret_env(k) and v else scrub_text(v)) for k, v in env.items()}


MAX_PIECE = 256 << 10  # characters of one line masked at a time by scrub_file
_CUT_ZONE = 4096  # a longer line is cut at a space within this many characters of the limit


def _pieces(fin: Any) -> Iterable[str]:
    """Lines of a text stream, a line longer than MAX_PIECE in pieces cut at a space.

    Cutting at a space keeps a secret whole in one piece (secrets hold no spaces); a line of
    4 KiB without any space is cut where it must be.
    """
    carry = ""
    while True:
        chunk = fin.readline(MAX_PIECE - len(carry))
        if not chunk:
            if carry:
                yield carry
            return
        piece = carry + chunk
        carry = ""
        if piece.endswith("\n") or len(piece) < MAX_PIECE:
            yield piece
            continue
        space = max(
            piece.rfind(" ", len(piece) - _CUT_ZONE), piece.rfind("\t", len(piece) - _CUT_ZONE)
        )
        if space > 0:
            piece, carry = piece[: space + 1], piece[space + 1 :]
        yield piece


def scrub_file(src: Path | str, dst: Path | str | None = None) -> None:
    """Mask the secrets of a log file into `dst`, or in place when `dst` is None.

    Streams line by line (a long line in pieces), so memory stays bounded whatever the size.
    In place, the masked copy is written beside `src` and renamed over it: a reader never sees
    a half-masked file, and a failure leaves `src` as it was. Undecodable bytes become U+FFFD.
    """
    src = Path(src)
    target = Path(dst) if dst is not None else src
    tmp = target.with_name(f".{target.name}.{os.getpid()}.scrub") if dst is None else target
    pem = _PemState()
    try:
        with (
            open(src, encoding="utf-8", errors="replace", newline="") as fin,
            open(tmp, "w", encoding="utf-8", newline="") as fout,
        ):
            for line in _pieces(fin):
                body = line.rstrip("\r\n")
                fout.write(pem.line(body) + line[len(body) :])
        if dst is None:
            os.chmod(tmp, src.stat().st_mode & 0o7777)
            os.replace(tmp, src)
    except BaseException:
        if dst is None:
            tmp.unlink(missing_ok=True)
        raise


def scrub_data(value: Any) -> Any:
    """Mask secrets in a JSON-like record: strings, and whole values under secret-named keys."""
    if isinstance(value, Enum):
        return value  # a fixed vocabulary (categories, statuses)
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {
            k: (MASK if is_secret_name(str(k)) and value_is_set(v) else scrub_data(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, dict) and isinstance(v.get("text"), str) for v in value):
            texts = scrub_lines(v["text"] for v in value)  # consecutive evidence lines
            return [{**scrub_data(v), "text": t} for v, t in zip(value, texts, strict=True)]
        return [scrub_data(v) for v in value]
    return value


def value_is_set(value: Any) -> bool:
    return value not in (None, "", False, True) and not (
        isinstance(value, str) and _harmless(value)
    )


def redact(text: str, *, hosts: bool = False, home: bool = False) -> str:
    """Mask secrets; optionally also host names and home-directory user names."""
    text = scrub_text(text)
    if home:
        text = str(_HOME.sub(r"\1<user>", text))
        text = str(_ROOT_HOME.sub(r"\1~/", text))
    if hosts:
        for name in _host_names():
            text = text.replace(name, "<host>")
    return text


def scrub_cut(text: str, limit: int) -> str:
    """Mask, then cut to `limit`: a secret cut first loses the shape the masker needs."""
    return scrub_text(text[: limit * 4])[:limit]


def redact_argv(argv: list[str]) -> list[str]:
    """Former name of `scrub_argv`, kept for callers."""
    return scrub_argv(argv)


def _host_names() -> list[str]:
    import socket

    names = {socket.gethostname(), os.uname().nodename}
    return sorted(
        (n for n in names if n and n != "localhost" and len(n) > 2), key=len, reverse=True
    )
