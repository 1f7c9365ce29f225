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

Recognised by structure first: every URL's userinfo (any scheme, raw or percent-encoded, with
or without a scheme), the value of any key, flag, variable, header, JSON/YAML/dict field or
query parameter whose name is of a secret family (pass, pwd, secret, token, key, auth,
credential, sig, signature, cookie, session, private, PAT) in any quoting (raw, backslash- or
HTML-escaped, bytes reprs), every value of a multi-valued `--api-key`, a k8s `name:`/`value:`
pair, PEM blocks of any type, webhook paths; then by shape: known token prefixes, JWTs, and
random runs of 20+ characters (an entropy and character-class test that flags none of the
labelled corpus's 2,512 such runs). Across lines, a token a line wrap split in two is masked
on both lines. Every pattern runs under RE2 (an
automaton: linear in the input whatever the input; no backtracking), on lines the reader has
already capped at 256 KiB. A line with more than MAX_PLACES matches of one pattern (a crafted
or junk line) keeps its first MAX_PLACES masked places and loses the rest to CROWDED: the
cost per line stays bounded and nothing after the cap can leak.

Compare (and anything that saves files) should pass every argv through `scrub_argv`, every
environment through `scrub_env`, every free text through `scrub_text`, every record through
`scrub_data`, and every saved server log through `scrub_file(path)` before it is kept.
"""

from __future__ import annotations

import functools
import itertools
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
    r"token|secret|secret[_-]?key|passw(?:or)?d|passphrase|passcode|pass|[_-]pwd|credentials?"
    r"|auth|authorization|(?:\b|_)key|(?:\b|_)sig|signature|cookies?|session(?:[_-]?id)?"
    r"|private(?:[_-]?key)?(?:[_-]?id)?|[_-]pat"
    r"|(?:api|access|private|signing|client|master|encryption|account|storage)[_-]?key"
    r"|apikey"
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
_QUOTE = r"(?:\\?[\"'`]|&quot;|&#3[49];|&apos;)"  # raw, backslash-escaped or HTML-escaped
# One pattern per place, applied in turn. Each is linear under RE2, and the parts that could
# keep a failing alternative alive for long are bounded, so that `sub` never re-scans far past
# a match: total cost stays linear in the line.
_SCHEME = r"\b[A-Za-z][A-Za-z0-9+.-]{1,20}://"
# user:password@host. The password runs to the last `@` before the host (a raw `@` or `/` in a
# password is common in pasted URLs), within one run of non-blanks.
_URL = re2.compile(rf"({_SCHEME})([^\s/@:'\"]{{0,256}}):([^\s'\"<>]{{1,256}})@([\w\[])")
# A lone userinfo (`https://<token>@github.com`): masked unless it reads as a plain user name.
_URL_USER = re2.compile(rf"({_SCHEME})([^\s/@:'\"]{{1,256}})@([\w\[])")
_PLAIN_USER = re2.compile(r"[a-z_][a-z0-9._-]{0,31}")
# Percent-encoded userinfo: `https://u%3Apw@h`, and a whole URL encoded (`https%3A%2F%2Fu%3Apw%40h`).
_URL_ENC = re2.compile(
    r"((?:\b[A-Za-z][A-Za-z0-9+.-]{1,20}://|(?i:%3A%2F%2F))[^\s/@:'\"%]{0,256}(?i:%3A|:))"
    r"([^\s/@'\"]{1,256}?)(@|(?i:%40))"
)
# No scheme (a file name, `alice:pw@host.log`): user:password@a.dotted.host.
_BARE_USERINFO = re2.compile(
    r"((?:^|[\s/=_(\[])[A-Za-z0-9._-]{1,64}:)([^\s/@:'\"]{3,256})@([A-Za-z0-9-]+\.[A-Za-z0-9.-])"
)
_CURL_USER = re2.compile(
    r"((?:^|\s)(?:-u|--user)(?:=|\s{1,3})[\"']?[^\s:'\"]{1,256}:)([^\s'\"]{1,256})"
)
_AUTH = re2.compile(
    r"((?i:\b(?:proxy-)?authorization)[\"']?\s{0,5}[:=]\s{0,5}[\"']?"
    r"(?i:(?:bearer|basic|token|digest|negotiate|apikey)\s{1,5})?)"
    rf"({_VALUE})"
)
_BEARER = re2.compile(r"((?i:\bbearer)\s{1,5})([A-Za-z0-9._~+/=-]{8,})")
# A value: a word, or one that starts with a single dash (`--api-key -k3J9...`); not `--next`.
_ARG = r"(?:-[^\s'\"-]|[^\s'\"-])[^\s'\"]*"
# `--api-key K1 K2 ...`: every value until the next option.
# Its values hold no `--`: a word like `x=--api-key` starts the next field, whose flag must
# stay for its own match.
_LATER_ARG = r"(?:-?[^\s'\"-])+"
_MULTI_OPT = re2.compile(
    rf"(--api[_-]keys?(?:=|\s{{1,3}}))({_LATER_ARG}(?:\s{{1,3}}{_LATER_ARG}){{0,32}})"
)
_OPT = re2.compile(rf"(--[A-Za-z0-9_-]{{0,40}}?(?i:{_SECRET_WORDS})(?:=|\s{{1,3}}))({_ARG})")
# A value: a list, a quoted string or a bare word.
_ONE_VALUE = rf"\[[^\]\n]*\]?|\"[^\"\n\\]*\"?|'[^'\n\\]*'?|`[^`\n]*`?|{_VALUE}"
_KEY = re2.compile(
    rf"((?i:{_KEY_WORDS}){_QUOTE}?\s{{0,5}}(?:[:=]|&#61;)\s{{0,5}}\\?(?:&quot;|&#3[49];|&apos;|[bB]['\"])?)"
    # One group for the value: fewer group look-ups per match, which is most of the cost on a
    # line crowded with `token=` pairs.
    rf"({_ONE_VALUE})"
)
# Where a value runs into the next field, glued to it (`Bearer <token>--api-key <key>`,
# `token=VLLM_API_KEY='x'`): a flag, or a secret's name and its operator (see _sub).
_EMBEDDED = re2.compile(rf"--[A-Za-z]|(?i:{_KEY_WORDS}){_QUOTE}?\s{{0,5}}(?:[:=]|&#61;)")
# An environment entry spelt as name and value (k8s YAML and JSON, docker inspect):
# `name: HF_TOKEN, value: X`, `{"name": "HF_TOKEN", "value": "X"}`.
_ENV_WORDS = rf"(?:{_SECRET_WORDS}|_PAT|_KEY|_PASS|_CREDS)"
_NAMED_VALUE = re2.compile(
    rf"((?i:\bname){_QUOTE}?\s{{0,5}}[:=]\s{{0,5}}{_QUOTE}?[A-Za-z0-9_.-]{{0,80}}(?i:{_ENV_WORDS})"
    rf"{_QUOTE}?\s{{0,5}},?\s{{0,5}}{_QUOTE}?(?i:value){_QUOTE}?\s{{0,5}}[:=]\s{{0,5}}{_QUOTE}?)"
    rf"({_VALUE})"
)
_NAME_ONLY = re2.compile(
    rf"^\s{{0,40}}-?\s{{0,5}}(?i:name){_QUOTE}?\s{{0,5}}:\s{{0,5}}{_QUOTE}?"
    rf"[A-Za-z0-9_.-]{{0,80}}(?i:{_ENV_WORDS}){_QUOTE}?\s{{0,5}},?\s{{0,5}}$"
)
_VALUE_ONLY = re2.compile(rf"^(\s{{0,40}}(?i:value){_QUOTE}?\s{{0,5}}:\s{{0,5}})(.+)$")
# A webhook's path holds its secret: `/webhooks/<id>/<token>`, Teams' `/webhookb2/...`.
_WEBHOOK = re2.compile(r"((?i:/(?:api/)?(?:webhooks?|webhookb2|hooks)/))([^\s'\"<>?#]{6,})")
_BLOB = re2.compile(r"[A-Za-z0-9+/_-]{20,}={0,2}")
# PEM blocks of any type (keys, certificates, parameters): masked whole.
_PEM_BEGIN = re2.compile(r"-----BEGIN [A-Z0-9 ]{1,60}-----")
_PEM_END = re2.compile(r"-----END [A-Z0-9 ]{1,60}-----")
_PEM_BODY = re2.compile(r"^(?P<pre>(?:.{0,200}[\s:|])?)(?P<body>[A-Za-z0-9+/]{1,}={0,2})\s{0,8}$")
_PEM_HEADER = re2.compile(r"(?:Proc-Type|DEK-Info|Comment):|^\s{0,200}$")
_B64_LINE = re2.compile(r"[A-Za-z0-9+/]+={0,2}")
MAX_PEM_LINES = 400  # a block longer than this (a 16 kbit key is ~190 lines) was not closed
# Partial tokens at the end of a line (cut or wrapped there): prefix and a few characters.
_TOKEN_PREFIX = (
    r"(?:\bhf_|\bgh[pousr]_|\bgithub_pat_|\bsk-|\b[sr]k_(?:live|test)_|\bxox[abeoprs]-|\bglpat-"
    r"|\bAIza|\beyJ)"
)
_TAIL_TOKEN = re2.compile(_TOKEN_PREFIX + r"[A-Za-z0-9_-]{0,19}$")
_KNOWN_TAIL = re2.compile(_TOKEN_PREFIX + r"[A-Za-z0-9_-]{0,256}$")  # a line ending in a token
_EDGE_TAIL = re2.compile(r"[A-Za-z0-9+/=_.~-]{1,256}$")
_EDGE_HEAD = re2.compile(r"^[A-Za-z0-9+/=_.~-]{1,256}")


@functools.lru_cache(maxsize=4096)  # a batch's records repeat the same few hundred keys
def is_secret_name(name: str) -> bool:
    """True for a variable, option or key name that may hold a credential."""
    return bool(_NAME.search(name.strip("'\" -").replace("-", "_")[-80:]))


def _harmless(value: str) -> bool:
    return value.strip().strip("'\"").lower() in _HARMLESS


def _entropy(text: str) -> float:
    n = len(text)
    return -sum(k / n * math.log2(k / n) for k in Counter(text).values())


def _random(run: str) -> bool:
    """A run of mixed upper, lower and digits with high character entropy: a key."""
    core = run.rstrip("=")
    if core.startswith(("_Z", "__Z")):
        return False  # a mangled C++ symbol
    if not (any(c.isupper() for c in core) and any(c.islower() for c in core)):
        return False
    if "/" in core and any(
        (len(s) >= 6 and s.lower() == s) or (len(s) >= 3 and s.isalpha() and s.islower())
        for s in core.split("/")
    ):
        return False  # a path: .../snapshots/<hex commit>/...
    n = len(core)
    # Random base64 of 32+ characters scores ~4.6-5.9; words, paths and hex stay below 4.4.
    if n >= 32 and _entropy(core) >= min(4.5, math.log2(n) - 0.5):
        return True
    return n <= 64 and _short_random(core)  # a longer run that failed the entropy test is no key


def _short_random(core: str) -> bool:
    """Random draws change character class at almost every other step and rarely repeat;
    names (`Qwen2VLForConditionalGeneration`, `Llama-3-8B-Instruct-GPTQ`) run in words."""
    piece = max(core.replace("-", "_").split("_"), key=len)
    strict = 0.0
    if len(piece) < 16:  # base64url: `-` and `_` fall anywhere; in a name, between words
        parts = core.replace("-", "_").split("_")
        words = sum(1 for p in parts if len(p) >= 3 and p.isalpha() and _capitals(p) * 3 <= len(p))
        if words * 3 >= len(parts):
            return False  # `DeepSeek-R1-Distill-Qwen-32B-Q4_K_M`
        piece, strict = "".join(parts), 0.1
    if len(piece) < 16 or piece.isdigit():
        return False
    if not (any(c.isupper() for c in piece) and any(c.islower() for c in piece)):
        return False
    classes = ["d" if c.isdigit() else "u" if c.isupper() else "l" for c in piece]
    changes = sum(a != b for a, b in itertools.pairwise(classes)) / len(piece)
    if changes < (0.35 if "d" in classes else 0.45) + strict:
        return False
    longest_word = max((len(w) for w in _WORDS.findall(piece)), default=0)
    return longest_word <= 7 and _entropy(piece) >= math.log2(len(piece)) - 0.9


def _capitals(word: str) -> int:
    return sum(1 for c in word if c.isupper())


_WORDS = re2.compile(r"[A-Z]?[a-z]+")


def _url(m: Any) -> str:
    scheme, user, host = str(m.group(1)), str(m.group(2)), str(m.group(4))
    return f"{scheme}{_TOKEN.sub(MASK, user)}:{MASK}@{host}"


def _url_user(m: Any) -> str:
    scheme, user, host = str(m.group(1)), str(m.group(2)), str(m.group(3))
    if _PLAIN_USER.fullmatch(user) and not _TOKEN.search(user):
        return str(m.group(0))
    return f"{scheme}{MASK}@{host}"


def _bare_userinfo(m: Any) -> str:
    return f"{m.group(1)}{MASK}@{m.group(3)}"


def _tail_token(m: Any) -> str:
    run = str(m.group(0))
    rest = run[run.find("_") + 1 :] if "_" in run[:12] else run[3:]
    if len(rest) >= 4 and any(c.isupper() or c.isdigit() for c in rest):
        return MASK
    return run


def _prefixed(m: Any) -> str:
    value = str(m.group(2))
    return str(m.group(1)) + (value if _harmless(value) else MASK)


# A later word of `--api-key K1 K2` that assigns a secret (`VLLM_API_KEY='x'`, `(HF_TOKEN=x`)
# starts the next field: its value is the key pass's to mask, which a mask over the name would
# hide from it. Only a secret's name is cut off, so what follows is masked by that pass.
_ASSIGNS = re2.compile(r"(?:^|[^A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]{0,80})=(?:[^\s=]|$)")


def _multi(m: Any) -> str:
    value = str(m.group(2))
    quoted = m.string[m.end() : m.end() + 1] in ("'", '"')
    cut = None
    for a in _ASSIGNS.finditer(value):
        if a.start() == 0 or not is_secret_name(str(a.group(1))):
            continue
        if a.end() == len(value) and not quoted:
            continue  # `K2=` at the end, unquoted: base64 padding, not a field's name
        cut = a.start(1)
        break
    if cut is None:
        return _prefixed(m)
    head = value[:cut].rstrip(" \t([{,;:|")
    rest = value[len(head) :]
    return str(m.group(1)) + (head if _harmless(head) else MASK) + rest


def _bearer(m: Any) -> str:
    value = str(m.group(2))
    keep = value.isalpha() and len(value) < 20  # "Bearer authentication failed"
    return str(m.group(1)) + (value if keep else MASK)


def _key(m: Any) -> str:
    return str(m.group(1)) + _masked_value(str(m.group(2)))


def _masked_value(value: str) -> str:
    """A value masked in its own shape: a list, a quoted string or a word (kept if harmless)."""
    first = value[0]
    if first == "[":
        inner = value[1:-1] if value[-1] == "]" else value[1:]
        return value if not inner.strip() else f"['{MASK}']"
    if first in "'\"`":
        close = first if len(value) > 1 and value[-1] == first else ""
        inner = value[1 : len(value) - len(close)]
        return value if _harmless(inner) else f"{first}{MASK}{close}"
    return value if _harmless(value) else MASK


def _blob(m: Any) -> str:
    run = str(m.group(0))
    return MASK if _random(run) else run


_PASSES: tuple[tuple[Any, Any], ...] = (
    (_URL, _url),
    (_URL_ENC, lambda m: f"{m.group(1)}{MASK}{m.group(3)}"),
    (_URL_USER, _url_user),
    (_BARE_USERINFO, _bare_userinfo),
    (_CURL_USER, _prefixed),
    (_WEBHOOK, lambda m: f"{m.group(1)}{MASK}"),
    (_AUTH, _prefixed),
    (_BEARER, _bearer),
    (_MULTI_OPT, _multi),
    (_OPT, _prefixed),
    (_NAMED_VALUE, _prefixed),
    (_KEY, _key),
    (_TOKEN, MASK),
    (_TAIL_TOKEN, _tail_token),
    (_BLOB, _blob),
)


# The passes whose match is a name (group 1) and its value (group 2).
# (`_multi` cuts its values at a later secret's name itself, and they hold no `--`.)
_VALUE_SECOND = frozenset({_prefixed, _bearer, _key})
_REACH = 16  # past a value's end, where the operator of a name glued inside it may be
MAX_GLUED = 4  # glued fields a pass searches on from in one line (see _sub)

# What every pass needs somewhere in the line (a superset: their words' stems, a URL, an `@`,
# a token prefix, a 20+ run): a line with none of it (most log lines) costs one scan instead
# of one per pass. One automaton of all the passes themselves would outgrow RE2's DFA memory.
_ANY = re2.compile(
    r"://|@|%3[Aa]|-----BEGIN|[A-Za-z0-9+/_-]{20,}|(?:^|\s)(?:-u|--user)\b"
    r"|(?i:tok|secret|pass|pwd|cred|auth|key|sig|cookie|session|private|[_-]pat|bearer|name|hook)"
    r"|hf_|gh[pousr]_|sk-|[sr]k_|xox|A(?:KIA|SIA|GPA|IDA|ROA|NPA|NVA|IPA)|glpat-|AIza|eyJ"
    r"|slack|discord"
)


MEMO_LINE = 1024  # lines up to this long are masked once a process: records repeat their texts


def _scrub_line(line: str) -> str:
    if not line:
        return line
    line = str.__str__(line)  # a plain str: re2 rebuilds results with type(text)()
    return _scrub_short(line) if len(line) <= MEMO_LINE else _scrub_long(line)


@functools.lru_cache(maxsize=8192)
def _scrub_short(line: str) -> str:
    return _scrub_long(line)


def _scrub_long(line: str) -> str:
    if _ANY.search(line) is None:
        return line
    begin = _PEM_BEGIN.search(line)
    while begin is not None:
        end = _PEM_END.search(line, begin.end())
        stop = end.start() if end else len(line)
        if line[begin.end() : stop].strip():
            line = line[: begin.end()] + MASK + line[stop:]
        begin = _PEM_BEGIN.search(line, begin.end() + len(MASK)) if end else None
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

    A name's value that runs into the next field glued to it (_EMBEDDED) is masked up to there,
    and the pass searches on from that field (its name would be lost in the mask). Each such
    restart costs a pass over the line (google-re2 converts a start position from characters to
    bytes from the text's start), so past MAX_GLUED of them the rest of the line is hidden too.
    """
    pieces: list[str] = []
    end = 0
    n = glued_fields = 0
    matches = pattern.finditer(line)
    while (m := next(matches, None)) is not None:
        if n == MAX_PLACES:
            pieces.append(CROWDED)
            return "".join(pieces)
        n += 1
        pieces.append(line[end : m.start()])
        if repl in _VALUE_SECOND:
            a, b = m.span(2)
            glued = _EMBEDDED.search(line[a : b + _REACH])  # a name's operator may follow
            if glued is not None and glued.start() < b - a:
                head = line[a : a + glued.start()]
                pieces.append(m.group(1) + (_masked_value(head) if head else ""))
                end = a + glued.start()
                glued_fields += 1
                if glued_fields > MAX_GLUED:
                    pieces.append(CROWDED)
                    return "".join(pieces)
                matches = pattern.finditer(line, end)
                continue
        pieces.append(repl(m) if callable(repl) else repl)
        end = m.end()
    if not pieces:
        return line
    pieces.append(line[end:])
    return "".join(pieces)


class _PemState:
    """Line state across a text: the body of a PEM block that spans lines, the value line
    under a YAML `- name: HF_TOKEN`, and a token that a line wrap split in two."""

    def __init__(self) -> None:
        self.inside = 0  # lines into an open PEM block; 0 outside one
        self.pem_prefix = ""  # what stands before the block's BEGIN line (a log prefix)
        self.named = False  # the previous line named a secret variable: `value:` is next
        self.prev_raw = ""  # the previous line, unmasked, for the wrap check
        self.wrapped = False  # this line continues a token: the previous line's tail is masked

    def line(self, raw: str) -> str:
        out = self._line(raw)
        self.wrapped = False
        out = self._wrapped(raw, out)
        self.prev_raw = raw
        return out

    def _line(self, raw: str) -> str:
        if self.inside:
            self.inside += 1
            end = _PEM_END.search(raw)
            if end is not None:
                self.inside = 0
                if raw[: end.start()].strip():
                    return MASK + _scrub_line(raw[end.start() :])
                return _scrub_line(raw)
            body = _PEM_BODY.search(raw)
            rest = raw[len(self.pem_prefix) :] if raw.startswith(self.pem_prefix) else ""
            if self.inside <= MAX_PEM_LINES and rest.strip() and _B64_LINE.fullmatch(rest.strip()):
                return self.pem_prefix + MASK  # a body line under the BEGIN line's prefix
            if body is not None and self.inside <= MAX_PEM_LINES and _key_material(body):
                return str(body.group("pre")) + MASK
            if _PEM_HEADER.search(raw):
                return _scrub_line(raw)
            self.inside = 0  # not a key body any more: a truncated block
        if self.named:
            self.named = False
            value = _VALUE_ONLY.search(raw)
            if value is not None and not _harmless(str(value.group(2))):
                return str(value.group(1)) + MASK
        out = _scrub_line(raw)
        begins = list(_PEM_BEGIN.finditer(raw))
        if begins and not _PEM_END.search(raw, begins[-1].end()):
            self.inside = 1
            self.pem_prefix = raw[: begins[-1].start()]
        self.named = bool(_NAME_ONLY.search(raw))
        return out

    def _wrapped(self, raw: str, out: str) -> str:
        """A token cut by a line wrap: the previous line's last run and this line's first, read
        as one, are a secret that neither half shows. This line's half is masked; the previous
        line's half is masked by its own end-of-line check (`_TAIL_TOKEN`, `_BLOB`)."""
        prev = self.prev_raw
        if len(prev) < 40 or not raw or raw[0].isspace() or raw.startswith("-----"):
            return out
        named = _VALUE_NEXT.search(prev[-96:])
        head = _EDGE_HEAD.search(raw)
        if named is not None and head is not None and not out.startswith(MASK):
            # Wrapped at the blank between a secret's name and its value (`Bearer` / `<token>`).
            joined = str(named.group(0)).rstrip() + " " + str(head.group(0))
            if not _scrub_line(joined).endswith(str(head.group(0))):
                return MASK + out[head.end() :]
        tail = _EDGE_TAIL.search(prev)
        if tail is None or head is None or len(tail.group(0)) + len(head.group(0)) < 16:
            return out
        first = str(head.group(0))
        # A word (`INFO`, `Traceback`, `while`) is not a token's end, unless the previous line
        # ends in a known token's prefix: then `Vdtdhz` is the token's random tail.
        known = _KNOWN_TAIL.search(prev) is not None and first not in _LINE_WORDS
        if not known and (
            first in _LINE_WORDS or (first.isalpha() and first.islower()) or _capitalised(first)
        ):
            return out
        start = max(0, tail.start() - 64)
        joined = prev[start:] + first
        cut = len(prev) - start
        if _scrub_line(joined).endswith(joined[cut - 1 :]):
            return out  # nothing masked across the break
        self.wrapped = True
        return out if out.startswith(MASK) else MASK + out[head.end() :]


# A line that ends with a secret's name, its value on the next line after a wrap.
_VALUE_NEXT = re2.compile(
    rf"(?:(?i:\bbearer|\bbasic|\bauthorization:)|(?i:{_KEY_WORDS}){_QUOTE}?\s{{0,3}}[:=]"
    rf"|--[A-Za-z0-9_-]{{0,40}}(?i:{_SECRET_WORDS}))\s{{0,3}}$"
)

# Words a log line starts with: after a line that ends in a token, not the token's rest.
_LINE_WORDS = frozenset({"INFO", "ERROR", "WARNING", "WARN", "DEBUG", "CRITICAL", "FATAL", "File"})


def _capitalised(word: str) -> bool:
    return word[:1].isupper() and word[1:].isalpha() and word[1:].islower()


def _mask_tail(out: str) -> str:
    """Mask the last run of a line whose token the next line continues."""
    if out.endswith(MASK):
        return out
    tail = _EDGE_TAIL.search(out)
    return out if tail is None else out[: tail.start()] + MASK


def _key_material(body: Any) -> bool:
    """A PEM body line: base64 alone on its line, or after a prefix a run no word looks like."""
    run = str(body.group("body"))
    if not body.group("pre").strip():
        return True
    return (
        len(run) >= 16
        or run.endswith("=")
        or _mixed(run)
        or any(c in "+/" or c.isdigit() for c in run)
    )


def _mixed(word: str) -> bool:
    """Upper and lower case out of a word's usual order (`AbCdE`, not `Error` or `INFO`)."""
    return any(c.isupper() for c in word[1:]) and any(c.islower() for c in word)


def line_scrubber() -> Callable[[str], str]:
    """Masks one line at a time, in order (PEM blocks spanning lines included): for a log read
    as it is written."""
    return _PemState().line


def scrub_lines(lines: Iterable[str]) -> list[str]:
    """Mask secrets in consecutive lines (PEM blocks spanning lines included)."""
    pem = _PemState()
    out: list[str] = []
    for line in lines:
        out.append(pem.line(line))
        if pem.wrapped:
            out[-2] = _mask_tail(out[-2])
    return out


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
    rf"(?i)(?:(?:{_SECRET_WORDS}){_QUOTE}?\s{{0,5}}[:=]|--[A-Za-z0-9_-]{{0,40}}(?:{_SECRET_WORDS})"
    r"|\bbearer|\bbasic)\s{0,5}$"
)


def scrub_argv(argv: Sequence[str]) -> list[str]:
    """Mask a command line: values of secret-named options, and secrets anywhere."""
    out: list[str] = []
    hide = 0  # values still to hide: 1 after `--token`, "all until the next option" = -1
    named = False  # the previous argument was a secret's name
    for arg in argv:
        if out and out[-1] in ("-u", "--user") and ":" in arg:
            user = arg.partition(":")[0]
            out.append(f"{user}:{MASK}")  # curl's user:password
            continue
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
            held = ""  # one line held back: the next may show its tail is a wrapped token's
            for line in _pieces(fin):
                body = line.rstrip("\r\n")
                masked = pem.line(body) + line[len(body) :]
                if pem.wrapped:
                    end = held.rstrip("\r\n")
                    held = _mask_tail(end) + held[len(end) :]
                fout.write(held)
                held = masked
            fout.write(held)
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


# -- places: who and where (`--redact`) -----------------------------------------------------

# Hosts everybody reaches: naming them says nothing about the user (and a reader needs them).
_PUBLIC_HOSTS = (
    "huggingface.co",
    "hf.co",
    "github.com",
    "githubusercontent.com",
    "pypi.org",
    "pythonhosted.org",
    "pytorch.org",
    "nvidia.com",
    "vllm.ai",
    "python.org",
    "modelscope.cn",
    "docker.io",
    "docker.com",
    "ghcr.io",
    "nvcr.io",
    "ngc.nvidia.com",
    "ubuntu.com",
    "example.com",
    "example.org",
    "readthedocs.io",
)
_PUBLIC_LABELS = frozenset(h.split(".")[0] for h in _PUBLIC_HOSTS)
_KEEP_IPS = frozenset({"0.0.0.0", "127.0.0.1", "255.255.255.255", "::1", "::"})
# Endings of host names (not file suffixes: `.py`, `.pt`, `.md`, `.sh` are ccTLDs too).
_TLDS = (
    "com|net|org|io|ai|dev|app|cloud|internal|local|localdomain|lan|corp|intra|intranet|home"
    "|arpa|edu|gov|mil|int|biz|info|co|uk|de|fr|nl|eu|cn|jp|kr|us|ca|au|ru|br|ch|se|no|es|it"
    "|pl|tech|xyz|site|online|svc|cluster"
)
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_EMAIL = re2.compile(rf"\b[A-Za-z0-9._%+-]{{1,64}}@((?:{_LABEL}\.){{1,8}}{_LABEL})\b")
_URL_HOST = re2.compile(
    r"(\b[A-Za-z][A-Za-z0-9+.-]{1,20}://(?:[^\s/@'\"]{0,256}@)?)([A-Za-z0-9._-]{1,253})"
)
_FQDN = re2.compile(rf"\b(?:{_LABEL}\.){{1,8}}(?i:{_TLDS})\b")
_IPV4 = re2.compile(r"\b(?:25[0-5]|2[0-4]\d|1?\d?\d)(?:\.(?:25[0-5]|2[0-4]\d|1?\d?\d)){3}\b")
_IPV6 = re2.compile(
    r"\b[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{0,4}){2,7}\b|\b[0-9A-Fa-f]{1,4}::[0-9A-Fa-f]{1,4}\b"
)
_AWS_HOST = re2.compile(r"\bip-\d{1,3}-\d{1,3}-\d{1,3}-\d{1,3}\b")
# Places that hold a bare host name: `host=gpu07`, `--host gpu07`, `hostname: gpu07`,
# `node gpu07`, a shell prompt `alice@gpu07:~$`.
_NAMED_HOST = re2.compile(
    r"(?:(?i:\b(?:host|hostname|host_name|node|node_name|nodename|master_addr|head_node)"
    r"[\"']?\s{0,3}[=:]\s{0,3}[\"']?)|(?i:--(?:host|master-addr|node-ip-address)[= ]))"
    r"([A-Za-z][A-Za-z0-9-]{2,62})\b"
)
# NCCL's own prefix: `gpu07:1234:1234 [0] NCCL INFO ...`.
_NCCL_HOST = re2.compile(r"(?:^|[\s|)\]])([A-Za-z][A-Za-z0-9.-]{1,62}):\d+:\d+ \[\d+\] NCCL")
# A shell prompt: `alice@gpu07:~$`, `[alice@gpu07 ~]$`.
_PROMPT = re2.compile(r"\b([a-z_][a-z0-9_-]{1,31})@([A-Za-z][A-Za-z0-9-]{1,62})(:[~/]|\s~)")
_HOME_USER = re2.compile(r"(/home/|/Users/|(?i:[A-Z]:\\\\?Users\\\\?))([^/\\\s'\"]+)")
_ROOT_HOME = re2.compile(r"(^|[^\w/])/root/")
# Words the named-host places also hold in vLLM's own messages.
_NOT_HOSTS = frozenset(
    {
        "localhost",
        "none",
        "null",
        "true",
        "false",
        "the",
        "and",
        "not",
        "any",
        "all",
        "auto",
        "default",
        "unknown",
        "main",
        "local",
        "remote",
        "port",
        "address",
        "name",
        "list",
    }
)


class Places:
    """Placeholders for one report's hosts, addresses, e-mail addresses and user names: the
    same value gets the same placeholder (`<host-1>`) wherever it appears in the report."""

    def __init__(self) -> None:
        self._names: dict[tuple[str, str], str] = {}
        self._counts: Counter[str] = Counter()
        self._hosts: dict[str, str] = {}  # learned bare host names -> placeholder
        self._users: set[str] = set()
        for name in _host_names():
            self._learn_host(name)

    def _name(self, kind: str, value: str) -> str:
        key = (kind, value.lower())
        if key not in self._names:
            self._counts[kind] += 1
            self._names[key] = f"<{kind}-{self._counts[kind]}>"
        return self._names[key]

    def _learn_host(self, host: str) -> str:
        short = host.split(".", 1)[0]
        # `gpu07` and `gpu07.acme.internal` are one machine: one placeholder.
        key = ("host", short.lower()) if not _IPV4.fullmatch(host) else ("host", host)
        place = self._names.get(key) or self._name("host", host)
        self._names.setdefault(("host", host.lower()), place)
        self._names.setdefault(key, place)
        if len(host) > 2 and host.lower() not in _NOT_HOSTS:
            self._hosts.setdefault(host, place)
            if short != host and len(short) > 2 and short.lower() not in _NOT_HOSTS:
                self._hosts.setdefault(short, place)
        return place

    def learn(self, text: str) -> None:
        """Note the host and user names `text` shows, so every later mention is hidden too."""
        for m in _URL_HOST.finditer(text):
            host = str(m.group(2))
            if _private_host(host) and not _IPV4.fullmatch(host):
                self._learn_host(host)
        for m in _NAMED_HOST.finditer(text):
            host = str(m.group(1))
            # A machine's name has a digit or a dash (`gpu07`, `node-3`); a bare word after
            # `host:` in prose (`host memory`) is no name.
            if host.lower() not in _NOT_HOSTS and any(c.isdigit() or c == "-" for c in host):
                self._learn_host(host)
        for m in _NCCL_HOST.finditer(text):
            if _private_host(str(m.group(1))):
                self._learn_host(str(m.group(1)))
        for m in _PROMPT.finditer(text):
            self._users.add(str(m.group(1)))
            if str(m.group(2)).lower() not in _NOT_HOSTS:
                self._learn_host(str(m.group(2)))
        for m in _HOME_USER.finditer(text):
            self._users.add(str(m.group(2)))

    def hide(self, text: str) -> str:
        text = str.__str__(text)  # a plain str: re2 rebuilds results with type(text)()
        self.learn(text)
        text = _sub(_EMAIL, self._email, text)
        text = _sub(
            _HOME_USER, lambda m: f"{m.group(1)}{self._name('user', str(m.group(2)))}", text
        )
        text = str(_ROOT_HOME.sub(r"\1~/", text))
        text = _sub(_PROMPT, self._prompt, text)
        text = _sub(_FQDN, self._fqdn, text)
        text = _sub(_URL_HOST, self._url_host, text)
        text = _sub(_IPV6, self._ip, text)
        text = _sub(_IPV4, self._ip, text)
        text = _sub(_AWS_HOST, lambda m: self._name("host", str(m.group(0))), text)
        for host in sorted(self._hosts, key=len, reverse=True):
            if host in text:
                text = _replace_word(text, host, self._hosts[host])
        return text

    def _email(self, m: Any) -> str:
        whole = str(m.group(0))
        return whole if not _private_host(str(m.group(1))) else self._name("email", whole)

    def _prompt(self, m: Any) -> str:
        user, host = str(m.group(1)), str(m.group(2))
        rest = str(m.group(0))[len(user) + 1 + len(host) :]
        if host.lower() in _NOT_HOSTS:
            return str(m.group(0))
        return f"{self._name('user', user)}@{self._learn_host(host)}{rest}"

    def _fqdn(self, m: Any) -> str:
        host = str(m.group(0))
        return self._learn_host(host) if _private_host(host) else host

    def _url_host(self, m: Any) -> str:
        host = str(m.group(2))
        if not _private_host(host) or host.startswith("<"):
            return str(m.group(0))
        if _IPV4.fullmatch(host):
            return f"{m.group(1)}{self._name('ip', host)}"
        return f"{m.group(1)}{self._learn_host(host)}"

    def _ip(self, m: Any) -> str:
        ip = str(m.group(0))
        if ":" in ip and (
            ip.endswith(":") or ip.startswith(":") or (ip.count(":") < 3 and "::" not in ip)
        ):
            return ip  # `c10::Error`, `std::`: C++ scopes, not addresses
        if ip in _KEEP_IPS or ip.startswith("127.") or not _is_ip(ip):
            return ip
        return self._name("ip", ip)


def _is_ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _private_host(host: str) -> bool:
    """A host that names the user's site: not loopback, not a public service everybody uses."""
    low = host.lower()
    if not low or low == "localhost" or low in _KEEP_IPS or low.startswith("127."):
        return False
    if low.endswith(".") or low in _PUBLIC_LABELS:
        return (
            False  # a name cut short (a URL whose host ends in a dot where an evidence line is cut)
        )
    return not any(low == h or low.endswith("." + h) for h in _PUBLIC_HOSTS)


def _replace_word(text: str, word: str, place: str) -> str:
    """Replace `word` where it stands alone (not inside a longer name)."""
    out: list[str] = []
    start = 0
    while True:
        i = text.find(word, start)
        if i < 0:
            break
        before = text[i - 1] if i else " "
        after = text[i + len(word)] if i + len(word) < len(text) else " "
        if not (before.isalnum() or before in "_-") and not (after.isalnum() or after in "_-"):
            out += (text[start:i], place)
        else:
            out.append(text[start : i + len(word)])
        start = i + len(word)
    out.append(text[start:])
    return "".join(out)


def redact(
    text: str, *, hosts: bool = False, home: bool = False, places: Places | None = None
) -> str:
    """Mask secrets; with `hosts`/`home` also host names, IP and e-mail addresses and the user
    names in paths, each replaced by its placeholder in `places` (one per report)."""
    text = scrub_text(text)
    if hosts or home:
        text = (places or Places()).hide(text)
    return text


def scrub_cut(text: str, limit: int) -> str:
    """Mask, then cut to `limit`: a secret cut first loses the shape the masker needs."""
    return scrub_text(text[: limit * 4])[:limit]


def _host_names() -> list[str]:
    import socket

    names = {socket.gethostname(), os.uname().nodename}
    return sorted(
        (n for n in names if n and n != "localhost" and len(n) > 2), key=len, reverse=True
    )
