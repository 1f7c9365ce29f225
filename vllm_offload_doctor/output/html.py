"""What every HTML page shares: the inline style, the one escape, the page frame.

Pages are self-contained (inline CSS, SVG, a few lines of JS), so they open offline and can be
attached to a ticket. Every piece of text passes through `html.escape` after redact.py's masking:
log text is hostile. compare's report.html is drawn in `compare/html.py`, analyze's triage page in
`analyze/html.py`.
"""

from __future__ import annotations

import html

from vllm_offload_doctor.redact import scrub_text

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.4em} h2{font-size:1.15em;margin-top:1.6em}
.verdict{padding:.8em 1em;border-radius:6px;border-left:6px solid #888;background:#f4f4f4}
.effective,.healthy{border-color:#2a7}.ignored,.failed{border-color:#c33}
.inconclusive,.unknown{border-color:#d90}
table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #ddd;padding:3px 6px;
text-align:left;vertical-align:top} th{background:#f0f0f0}
th.sort{cursor:pointer} td.v{min-width:22em} pre{background:#f7f7f7;padding:.6em;overflow-x:auto;white-space:pre-wrap}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}
"""
MEMORY_COLOURS = (
    ("GPU weights", "#4878d0"),
    ("KV cache", "#6acc64"),
    ("offloaded to host", "#ee854a"),
    ("host RSS", "#8c613c"),
)


def esc(text: object) -> str:
    """Mask secrets, then escape: the only way text reaches a page."""
    return html.escape(scrub_text(str(text)), quote=True)


def page(title: str, body: list[str], script: str = "") -> str:
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        *body,
    ]
    if script:
        out.append(f"<script>{script}</script>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
