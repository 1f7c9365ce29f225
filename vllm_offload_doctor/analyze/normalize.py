"""Turn a raw log line from any vLLM era and any collector into (process, level, message).

Handles ANSI colour (real escapes and pasted caret text), CR and stray ^M,
docker-compose / Kubernetes / journald / timestamp prefixes, GitHub-table rows, vLLM's
`(Proc pid=N)` prefix in its Ray, worker and engine forms, the three logger
formats (`file.py:1]`, `[file.py:1]`, `[path/file.py:1]`), Ray's
`[repeated Nx across cluster]` suffix, and pastes whose line breaks were lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][A-Z0-9]|\^\[\[[0-9;]*[A-Za-z]")
_CR = re.compile(r"\^M$|\r")
# Attributes bounded: an unbounded `[^>]*` re-scans the rest of the line at every `</b`.
_HTML = re.compile(r"</?(?:font|b|i|u|span|strong|em|code|pre)\b[^>\n]{0,256}>")
_BOX_START = re.compile(r"\s*[│┃|]\s?")  # matched at the start only (see _strip_box)
_FASTCHAT = re.compile(r"^\|\s*(?:DEBUG|INFO|WARNING|ERROR)\s*\|\s*(?:stderr|stdout)\s*\|\s?")
# A log pasted into a GitHub table, one line per row: `| <line> |`. Stripped only when the cell
# holds a log line (a vLLM record, a process prefix, a traceback or an exception), so the tables of
# pasted reports (`| ok | Host memory | ... |`) stay as they are.
_LOG_CELL = re.compile(
    r"(?:\(\w[\w: ]{0,80}? pid=\d+|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d|"
    r"Traceback \(most recent|File \"|(?:\w+\.)*[A-Z]\w*(?:Error|Exception)(?::|$)|\[?\d{4}-\d\d-\d\d[T ])"
)

# Outer prefixes added by collectors, tried repeatedly (they stack).
_OUTER = re.compile(
    r"""^(?:
        \[?\d{4}-\d\d-\d\d[T\ ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?\s+   # ISO time
      | [A-Z]{3,8}\s+\d{4}-\d\d-\d\dT\S+\s+                                       # cloud logging
      | \[[\w.-]+:\s*[\w.-]+\]\s+                                                  # [label: value]
      | [A-Z][a-z]{2}\ [\ \d]\d\ \d\d:\d\d:\d\d\ \S+\ [\w./@-]+(?:\[\d+\])?:\s      # journald/syslog
      | [\w][\w.-]*\s+\|\ ?                                                        # docker compose
      | \[pod/[^\]]+\]\s+                                                          # kubectl --prefix
      | (?:stdout|stderr)\ [FP]\                                                   # CRI (containerd) file
      | >\ ?                                                                       # quoted paste
      | \d{1,4}:\                                                                 # srun --label task id
      | \[\d{1,5},\d{1,5}\]<(?:stdout|stderr)>:\ ?                                # mpirun --tag-output
      | \d+\.\d+\s+                                                                # seconds offset
    )""",
    re.VERBOSE,
)

_PROC = re.compile(
    r"^\(?(?P<proc>[A-Za-z_][\w:]*(?:[ _]rank=\d+)?|VLLM::\w+) pid=(?P<pid>\d+)(?:, ip=[\d.:a-f]+)?\)\s*"
)
_RAY_REPEAT = re.compile(r"\[repeated \d+x across cluster\]")  # at the end (see _strip_repeat)
_RECORD = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?|\d+)"
    r"\s+\[?(?P<file>[^\]\s]+?):(?P<lineno>\d+)\]\s?(?P<msg>.*)$"
)
_UVICORN = re.compile(r"^(?P<level>INFO|WARNING|ERROR|DEBUG|CRITICAL):\s+(?P<msg>.*)$")

# Where a new record starts inside a line whose breaks were lost.
_EMBEDDED_START = re.compile(
    # never between a '(Proc pid=N)' prefix and its own record
    r"(?<=\S)(?<!\d\))\s+(?=(?:\(\w[\w ]{0,80}? pid=\d+(?:, ip=[\d.]+)?\)\s*)?"
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d"
    r"|Traceback \(most recent call last\)"
    r"|\(\w[\w ]{0,80}? pid=\d+\) "
    r"|\[rank\d+\]: "
    # a traceback's frames and its final exception line
    r"|File \"[^\"\n]{1,400}\", line \d+"
    r"|(?:[a-z_]\w{0,40}\.){0,6}[A-Z]\w{0,60}(?:Error|Exception): )"
)
SPLIT_THRESHOLD = 2048
# A shorter line is split too when it holds two records, or a traceback with its frames (a short
# paste whose breaks were lost); one record whose message says 'Traceback' is left whole.
_RECORD_START = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d")
_TRACEBACK_WITH_FRAMES = re.compile(r"Traceback \(most recent call last\):?\s.{0,200}?\bFile \"")
SHORT_SPLIT = 120


@dataclass(frozen=True, slots=True)
class Line:
    no: int  # 1-based line number in the input
    proc: str | None  # APIServer, EngineCore_DP0, Worker_TP1, RayWorkerWrapper …
    pid: int | None
    level: str | None  # DEBUG/INFO/WARNING/ERROR/CRITICAL, or None for raw output
    msg: str  # message without any prefix
    text: str  # the cleaned line (collector prefixes removed, vLLM prefix kept)


def clean(raw: str) -> str:
    text = _ANSI.sub("", raw) if ("\x1b" in raw or "^[" in raw) else raw
    if "\r" in text or "^M" in text:
        text = _CR.sub("", text)
    if "</" in text:
        text = _HTML.sub("", text).replace("&gt;", ">").replace("&lt;", "<").replace("&amp;", "&")
    if "│" in text or "┃" in text:
        text = _strip_box(text)
    return text.rstrip()


def _strip_box(text: str) -> str:
    """Drop a box-drawing frame: `│ line │`. Plain string work: a `\\s*[│┃]\\s*$` pattern
    retries from every blank of a long run (quadratic)."""
    m = _BOX_START.match(text)
    if m:
        text = text[m.end() :]
    end = text.rstrip()
    if end.endswith(("│", "┃")):
        text = end[:-1].rstrip()
    return text


def _strip_repeat(text: str) -> str:
    """Drop Ray's `[repeated 3x across cluster]` suffix (looked for at the end only)."""
    end = text.rstrip()
    if not end.endswith("across cluster]"):
        return text
    m = _RAY_REPEAT.search(end, max(0, len(end) - 64))
    return end[: m.start()].rstrip() if m and m.end() == len(end) else text


def strip_outer(text: str) -> str:
    for _ in range(4):
        m = _OUTER.match(text)
        if not m or m.end() == 0:
            break
        rest = text[m.end() :]
        # A docker-compose-looking prefix must be followed by something log-like.
        if m.group(0).rstrip().endswith("|") and not rest:
            break
        text = rest
    if text.startswith("|"):
        fastchat = _FASTCHAT.match(text)
        if fastchat:
            return text[fastchat.end() :]
        cell = text[1:].rstrip()
        cell = (cell[:-1] if cell.endswith("|") else cell).strip()
        if _LOG_CELL.match(cell):
            return strip_outer(cell)
    return text


def parse(no: int, raw: str) -> Line:
    text = strip_outer(clean(raw))
    proc = None
    pid = None
    rest = text
    m = _PROC.match(rest)
    if m:
        proc, pid = m.group("proc"), int(m.group("pid"))
        rest = rest[m.end() :]
    if "repeated" in rest:
        rest = _strip_repeat(rest)
    level = None
    r = _RECORD.match(rest)
    if r:
        level = "WARNING" if r.group("level") == "WARN" else r.group("level")
        rest = r.group("msg")
    else:
        u = _UVICORN.match(rest)
        if u:
            level, rest = u.group("level"), u.group("msg")
    return Line(no, proc, pid, level, rest.strip(), text)


def split_long(raw: str) -> list[str]:
    """Split a line that holds several records (a paste with its line breaks lost)."""
    if len(raw) < SHORT_SPLIT or (
        len(raw) < SPLIT_THRESHOLD
        and len(_RECORD_START.findall(raw, 0, SPLIT_THRESHOLD)) < 2
        and not _TRACEBACK_WITH_FRAMES.search(raw)
    ):
        return [raw]
    parts = _EMBEDDED_START.split(raw)
    return [p for p in parts if p]
