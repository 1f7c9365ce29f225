"""compare's report.html: the verdict first, latency per token against offloaded GiB beside the
link model's prediction, a memory bar per mode, the evidence and the commands.

The charts are drawn as plain SVG by the standard library: no chart library is among the doctor's
allowed runtime dependencies, and a report must draw without one.
"""

from __future__ import annotations

from vllm_offload_doctor.compare.model import CompareReport, ModeResult
from vllm_offload_doctor.compare.render import column, rows
from vllm_offload_doctor.output.html import MEMORY_COLOURS, esc, page


def _ms_per_token(m: ModeResult) -> float | None:
    la = m.latency
    if la is None or la.median_s is None or not la.completion_tokens_median:
        return None
    return la.median_s * 1e3 / la.completion_tokens_median


def latency_chart(report: CompareReport) -> str:
    """ms per output token against offloaded GiB: measured, and the link model's prediction."""
    base = report.modes[0] if report.modes else None
    base_ms = _ms_per_token(base) if base else None
    measured: list[tuple[float, float]] = []
    predicted: list[tuple[float, float]] = []
    if base is not None and base_ms is not None:
        measured.append((base.offload_gb, base_ms))
        predicted.append((base.offload_gb, base_ms))
    for m in report.modes[1:]:
        y = _ms_per_token(m)
        if y is not None:  # the verified fix too: it is the offload mode, working
            got = (m.log_facts.offloaded_gib if m.log_facts else None) or m.offload_gb
            measured.append((got, y))
    for c in report.comparisons:
        p = c.performance
        if p and p.link_bound_ms_per_token is not None and base_ms is not None:
            predicted.append(
                (
                    (c.figures.offloaded_gib if c.figures else None) or c.offload_gb or 0.0,
                    base_ms + p.link_bound_ms_per_token,
                )
            )
    if not measured:
        return "<p>No latency was measured: no chart.</p>"
    w, h, pad = 680, 320, 64
    xs = [x for x, _ in measured + predicted]
    ys = [y for _, y in measured + predicted]
    xmax = max(xs) or 1.0
    ymax = max(ys) * 1.15 or 1.0

    def px(x: float) -> float:
        return pad + (w - 2 * pad) * x / xmax

    def py(y: float) -> float:
        return h - pad - (h - 2 * pad) * y / ymax

    def series(points: list[tuple[float, float]], colour: str, dash: str, name: str, r: int) -> str:
        pts = sorted(points)
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        dots = "".join(
            f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="{r}" fill="{colour}">'
            f"<title>{esc(name)}: {x:g} GiB, {y:.2f} ms/token</title></circle>"
            for x, y in pts
        )
        return (
            f'<polyline class="series" data-name="{esc(name)}" points="{line}" fill="none" '
            f'stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/>{dots}'
        )

    ticks = "".join(
        f'<text x="{px(xmax * i / 4):.1f}" y="{h - pad + 18}" text-anchor="middle">'
        f"{xmax * i / 4:.2g}</text>"
        f'<text x="{pad - 6}" y="{py(ymax * i / 4) + 4:.1f}" text-anchor="end">'
        f"{ymax * i / 4:.1f}</text>"
        for i in range(5)
    )
    parts = [
        f'<svg id="latency-chart" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'font-size="11" role="img" aria-label="latency per token against offloaded GiB">',
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#444"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#444"/>',
        ticks,
        f'<text x="{w / 2}" y="{h - 10}" text-anchor="middle">offloaded GiB per GPU</text>',
        f'<text x="12" y="{h / 2}" transform="rotate(-90 12 {h / 2})" text-anchor="middle">'
        "ms per output token</text>",
    ]
    # The prediction first, the measurement on top: where the model is right they coincide.
    if len(predicted) > 1:
        parts.append(series(predicted, "#4878d0", "6 4", "link model (lower bound)", 7))
    parts += [series(measured, "#c33", "", "measured", 4), "</svg>"]
    legend = (
        '<div class="legend"><span style="background:#c33"></span>measured'
        '<span style="background:#4878d0"></span>link model: baseline + offloaded bytes / '
        "usable link bandwidth</div>"
    )
    return "".join(parts) + legend


def memory_bars(report: CompareReport) -> str:
    """One stacked bar per mode: GPU weights, KV cache, offloaded to host, host RSS (GiB)."""
    data = []
    for m in report.modes:
        f = m.log_facts
        rss = m.served.host_rss.total_mib / 1024 if m.served else None
        if rss is None and m.host_memory is not None:
            rss = m.host_memory.peak_rss_gib  # a mode that died: the peak the sampler saw
        parts = (
            f.model_loading_gib if f else None,
            f.kv_cache_gib if f else None,
            f.offloaded_gib if f else None,
            rss,
        )
        data.append((column(m), parts))
    total = max((sum(p or 0 for p in parts) for _, parts in data), default=0) or 1.0
    w, bar, gap, left = 860, 22, 12, 230
    h = len(data) * (bar + gap) + 10
    out = [
        f'<svg id="memory-chart" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        'font-size="11">'
    ]
    for i, (name, parts) in enumerate(data):
        y = 5 + i * (bar + gap)
        out.append(f'<text x="0" y="{y + 15}">{esc(name)}</text>')
        x = float(left)
        for (label, colour), value in zip(MEMORY_COLOURS, parts, strict=True):
            if not value:
                continue
            width = (w - left - 10) * value / total
            out.append(
                f'<rect class="mem" x="{x:.1f}" y="{y}" width="{width:.1f}" height="{bar}" '
                f'fill="{colour}"><title>{esc(label)}: {value:.2f} GiB</title></rect>'
            )
            x += width
    out.append("</svg>")
    legend = '<div class="legend">' + "".join(
        f'<span style="background:{c}"></span>{esc(n)}' for n, c in MEMORY_COLOURS
    )
    return "".join(out) + legend + "</div>"


def _evidence(report: CompareReport) -> list[str]:
    lines = []
    for m in report.modes:
        bits = []
        if m.analysis is not None:
            bits.append(f"analysis: {m.analysis.title}: {m.analysis.summary}")
        if m.log_facts and m.log_facts.model_runner_evidence:
            bits.append(f"runner evidence: {m.log_facts.model_runner_evidence}")
        if m.last_error_line:
            bits.append(f"last error: {m.last_error_line}")
        if m.reason:
            bits.append(f"reason: {m.reason}")
        lines.append(f"<h3>{esc(column(m))} (log {esc(m.log)})</h3>")
        lines.append("<pre>" + esc("\n".join(bits) or "nothing notable") + "</pre>")
    return lines


def render_compare_html(report: CompareReport) -> str:
    v = report.verdict.finding
    header, table = rows(report)
    body = [f"<h1>offload-doctor compare: {esc(report.config.model)}</h1>"]
    if report.interrupted or not report.complete:
        body.append("<p><strong>Partial report</strong>: the run did not finish.</p>")
    body.append(
        f'<div class="verdict {esc(v.status)}"><strong>Verdict: {esc(v.status)}</strong>'
        f" — {esc(v.title)}<p>{esc(v.summary)}</p>"
    )
    if v.remedy:
        body.append(f"<p><strong>Fix:</strong> {esc(v.remedy)}</p>")
    body += [f'<p><a href="{esc(link)}">{esc(link)}</a></p>' for link in v.links]
    body += [f"<p><em>Note:</em> {esc(n)}</p>" for n in v.notes]
    body.append("</div>")
    pre = (report.preflight or {}).get("lines", [])
    if pre:
        body += ["<h2>Preflight</h2><ul>", *(f"<li>{esc(ln)}</li>" for ln in pre), "</ul>"]
    body += ["<h2>Latency per output token</h2>", latency_chart(report)]
    body += ["<h2>Memory per mode (GiB)</h2>", memory_bars(report)]
    body.append("<h2>Side by side</h2><table>")
    body.append("<tr>" + "".join(f"<th>{esc(c)}</th>" for c in header) + "</tr>")
    body += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in table]
    body.append("</table><h2>Evidence</h2>")
    body += _evidence(report)
    body.append("<h2>Commands</h2>")
    cmds = [
        "".join(f"{k}={val} " for k, val in (m.env or {}).items()) + " ".join(m.command)
        for m in report.modes
    ]
    body.append("<pre>" + esc("\n".join(cmds)) + "</pre>")
    return page("offload-doctor compare", body)
