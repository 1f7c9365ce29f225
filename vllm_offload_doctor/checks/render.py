"""Render a `check` Report as text (flutter doctor style), JSON or a paste-ready Markdown block."""

from __future__ import annotations

import json
from typing import Protocol

from vllm_offload_doctor.checks import CheckResult, Report, Status
from vllm_offload_doctor.output.color import paint
from vllm_offload_doctor.output.formats import OutputFormat
from vllm_offload_doctor.redact import redact

# A crashed check is flutter doctor's [☠]: ours to fix, not the machine's.
GLYPHS = {
    Status.OK: "[✓]",
    Status.WARN: "[!]",
    Status.FAIL: "[✗]",
    Status.SKIP: "[-]",
    Status.BUG: "[☠]",
}
_COLORS = {
    Status.OK: "green",
    Status.WARN: "yellow",
    Status.FAIL: "red",
    Status.SKIP: "dim",
    Status.BUG: "red",
}
_MD_STATUS = {
    Status.OK: "✅ ok",
    Status.WARN: "⚠️ warn",
    Status.FAIL: "❌ fail",
    Status.SKIP: "➖ skip",
    Status.BUG: "☠️ bug",
}


def _paint(text: str, status: Status, color: bool) -> str:
    return paint(text, _COLORS[status], color=color)


def summary_line(report: Report) -> str:
    counts = report.summary()
    tail = f"{counts['ok']} ok, {counts['skip']} skipped"
    if counts["bug"]:
        tail += f", {counts['bug']} crashed"
    if counts["fail"] or counts["warn"]:
        issues = counts["fail"] + counts["warn"]
        return (
            f"! Doctor found issues in {issues} check{'s' if issues != 1 else ''}: "
            f"{counts['fail']} failed, {counts['warn']} warning{'s' if counts['warn'] != 1 else ''}"
            f" ({tail})."
        )
    if counts["bug"]:
        return f"☠ No issues found, but a check crashed: a bug of offload-doctor ({tail})."
    return f"• No issues found! ({tail})"


def render_text(report: Report, *, verbose: bool = False, color: bool = False) -> str:
    """One line per check; remedies for problems always, details and links with -v."""
    if verbose:
        lines = [f"offload-doctor {report.tool_version} check:"]
    else:
        lines = ["Doctor summary (to see all details, run offload-doctor check -v):"]
    for c in report.checks:
        lines.append(f"{_paint(GLYPHS[c.status], c.status, color)} {c.title}: {c.message}")
        if verbose:
            lines.extend(f"    • {d}" for d in c.details)
        if c.remedy and c.status in (Status.WARN, Status.FAIL, Status.BUG):
            lines.append(f"    → {c.remedy}")
        if verbose:
            lines.extend(f"    • {link}" for link in c.links)
    lines.append("")
    lines.append(summary_line(report))
    return "\n".join(lines)


def render_json(report: Report, *, verbose: bool = False, color: bool = False) -> str:
    """The stable schema: schema_version, tool_version, checks, summary, facts."""
    return json.dumps(report.to_dict(), indent=2, sort_keys=False)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Report, *, verbose: bool = False, color: bool = False) -> str:
    """A block for a bug report: no secrets, user names or host names."""
    lines = [
        f"#### offload-doctor {report.tool_version} check",
        "",
        "| Status | Check | Result |",
        "|---|---|---|",
    ]
    lines.extend(
        f"| {_MD_STATUS[c.status]} | {_cell(c.title)} | {_cell(c.message)} |" for c in report.checks
    )
    lines.extend(["", summary_line(report), "", "<details><summary>Details</summary>", ""])
    for c in report.checks:
        lines.extend(_md_details(c))
    lines.append("</details>")
    return redact("\n".join(lines), hosts=True, home=True)


def _md_details(c: CheckResult) -> list[str]:
    if not (c.details or c.remedy or c.links):
        return []
    out = [f"**{c.title}** (`{c.id}`, {c.status.value})", ""]
    out.extend(f"- {d}" for d in c.details)
    if c.remedy:
        out.append(f"- Remedy: {c.remedy}")
    out.extend(f"- <{link}>" for link in c.links)
    out.append("")
    return out


class CheckRenderer(Protocol):
    """A `check` format: the report; -v adds each check's details and links."""

    def __call__(self, report: Report, *, verbose: bool = False, color: bool = False) -> str: ...


# One per format of output.formats.FORMATS["check"] (tests/cli/test_formats.py).
RENDERERS: dict[OutputFormat, CheckRenderer] = {
    OutputFormat.TEXT: render_text,
    OutputFormat.JSON: render_json,
    OutputFormat.MARKDOWN: render_markdown,
}


def render(report: Report, fmt: OutputFormat, *, verbose: bool = False, color: bool = False) -> str:
    """`report` in format `fmt`; KeyError for a format check has no renderer for."""
    return RENDERERS[fmt](report, verbose=verbose, color=color)
