"""analyze's batch triage page: counts per category, one row per log, sortable without a server."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from vllm_offload_doctor.analyze.model import Analysis
from vllm_offload_doctor.analyze.render import run_lines
from vllm_offload_doctor.output.html import esc, page

SORT_JS = """
document.querySelectorAll('th.sort').forEach(function(th){th.addEventListener('click',function(){
var t=th.closest('table'),i=Array.prototype.indexOf.call(th.parentNode.children,th),
rs=Array.from(t.querySelectorAll('tbody tr')),d=th.dataset.dir==='asc'?'desc':'asc';
th.dataset.dir=d;rs.sort(function(a,b){var x=a.children[i].textContent,y=b.children[i].textContent;
return (d==='asc'?1:-1)*x.localeCompare(y,undefined,{numeric:true});});
rs.forEach(function(r){t.tBodies[0].appendChild(r);});});});
document.body.dataset.sortable='yes';
"""


def render_triage_html(
    analyses: Sequence[Analysis], errors: Sequence[str], redact: object = None
) -> str:
    """One row per log (verdict, offload, evidence), counts per category; sortable by column.

    `redact` is the analyze Renderer: its `_r` masks hosts and homes when --redact was given.
    """
    hide = getattr(redact, "_r", None) or (lambda s: s)

    def e(text: object) -> str:
        return esc(hide(str(text)))

    counts = Counter(a.verdict.category.value for a in analyses)
    body = [f"<h1>offload-doctor analyze: {len(analyses)} log(s)</h1>", "<h2>Counts</h2>"]
    body.append('<table id="counts"><tr><th>category</th><th>logs</th></tr>')
    body += [f"<tr><td>{e(c)}</td><td>{n}</td></tr>" for c, n in counts.most_common()]
    body.append("</table>")
    if errors:
        body.append(
            f"<p>{len(errors)} input(s) could not be read:</p><pre>"
            + e("\n".join(errors))
            + "</pre>"
        )
    body.append('<h2>Logs</h2><table id="triage"><thead><tr>')
    body += [
        f'<th class="sort">{h}</th>'
        for h in ("file", "category", "rule", "offload", "verdict", "evidence")
    ]
    body.append("</tr></thead><tbody>")
    for a in analyses:
        v = a.verdict
        ev = a.findings[0].evidence if a.findings else a.notable
        evidence = "\n".join(f"{x.line}: {x.text}" for x in ev[:5])
        starts = "".join(f"<br><small>{e(line)}</small>" for line in run_lines(a))
        body.append(
            f'<tr class="{e(v.category.value)}"><td>{e(a.file)}</td><td>{e(v.category.value)}</td>'
            f"<td>{e(v.rule_id or '')}</td><td>{e(a.offload.status.value)}</td>"
            f'<td class="v"><strong>{e(v.title)}</strong><br>{e(v.summary)}{starts}</td>'
            f"<td>{f'<pre>{e(evidence)}</pre>' if evidence else ''}</td></tr>"
        )
    body.append("</tbody></table>")
    return page("offload-doctor analyze", body, SORT_JS)
