"""The HTML pages: compare's report.html and analyze --format html (escaped, masked, drawn).

The browser tests render each page in headless Chromium (Debian's `chromium`, which .ci/run
installs) and skip, saying why, where it is absent.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from planted_secrets import assert_no_leak, secret_log

from vllm_offload_doctor.cli import cli
from vllm_offload_doctor.compare.html import render_compare_html
from vllm_offload_doctor.compare.model import CompareReport

ROOT = Path(__file__).resolve().parents[2]
RUNS = sorted(p.parent for p in (ROOT / "fixtures" / "h200-compare").glob("*/report.json"))
LOGS = ROOT / "fixtures" / "logs"
HOSTILE = '<script>alert(1)</script><img src=x onerror="alert(2)">'


def _invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args)


def _report(run: Path) -> CompareReport:
    return CompareReport.from_dict(json.loads((run / "report.json").read_text()))


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_compare_page_has_verdict_first_charts_and_commands(run: Path) -> None:
    report = _report(run)
    page = render_compare_html(report)
    verdict = page.index("Verdict:")
    measured = any(m.latency and m.latency.median_s for m in report.modes)
    chart = page.find('id="latency-chart"') if measured else page.find("No latency was measured")
    assert verdict < chart < page.index('id="memory-chart"')
    assert page.index('id="memory-chart"') < page.index("<h2>Commands</h2>")
    assert report.modes[0].command[0] in page.split("<h2>Commands</h2>")[1]
    # one stacked bar segment at least per mode that loaded or whose host memory was sampled
    drawn = sum(
        1
        for m in report.modes
        if (m.log_facts and (m.log_facts.model_loading_gib or m.log_facts.kv_cache_gib))
        or (m.served and m.served.host_rss.total_mib)
        or (m.host_memory and m.host_memory.peak_rss_gib)
    )
    assert drawn and page.count('class="mem"') >= drawn
    # nothing is fetched at view time
    assert "<link" not in page and "src=" not in page


def test_compare_chart_draws_measurement_and_link_model() -> None:
    run = next(r for r in RUNS if r.name == "v1-runner")
    page = render_compare_html(_report(run))
    assert 'data-name="measured"' in page
    assert 'data-name="link model (lower bound)"' in page


def test_compare_page_escapes_and_masks_hostile_text() -> None:
    report = _report(RUNS[0])
    from dataclasses import replace

    hf = "hf_QpWoEiRuTyAlSkDjFhGzXmCnVb3141592653"
    mode = replace(report.modes[0], last_error_line=HOSTILE, command=("vllm", "--hf-token", hf))
    page = render_compare_html(replace(report, modes=(mode, *report.modes[1:])))
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)" in page
    assert hf not in page


def test_triage_page_counts_rows_escaping_and_secrets(tmp_path: Path) -> None:
    (tmp_path / "secret.log").write_text(secret_log() + HOSTILE + "\n")
    for p in LOGS.glob("*.log"):
        shutil.copy(p, tmp_path / p.name)
    result = _invoke(["analyze", "--format", "html", str(tmp_path)])
    page = result.output
    assert page.startswith("<!doctype html>"), page[:200]
    n = len(list(tmp_path.glob("*.log")))
    assert f"{n} log(s)" in page
    assert page.count("<tr class=") == n
    assert 'id="counts"' in page and 'th class="sort"' in page
    assert "<script>alert" not in page and "<img src=x" not in page
    assert_no_leak(page, "analyze --format html")


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (apt-get install chromium): browser test skipped")
    return exe


def _browse(page: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    profile = tempfile.mkdtemp()
    try:
        return subprocess.run(
            [
                _chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--enable-logging=stderr",
                "--v=0",
                *extra,
                page.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def _pages(tmp: Path) -> list[Path]:
    pages = []
    for run in RUNS:
        p = tmp / f"{run.name}.html"
        p.write_text(render_compare_html(_report(run)))
        pages.append(p)
    result = _invoke(["analyze", "--format", "html", str(LOGS)])
    triage = tmp / "triage.html"
    triage.write_text(result.output)
    return [*pages, triage]


def test_pages_render_in_chromium_without_console_errors(tmp_path: Path) -> None:
    _chromium()
    for page in _pages(tmp_path):
        png = page.with_suffix(".png")
        shot = _browse(page, f"--screenshot={png}", "--window-size=1200,1600")
        assert png.exists() and png.stat().st_size > 10_000, (page.name, shot.stderr[-2000:])
        console = [ln for ln in shot.stderr.splitlines() if "CONSOLE" in ln]
        assert not console, (page.name, console)
        dom = _browse(page, "--dump-dom").stdout
        if page.name == "triage.html":
            assert 'data-sortable="yes"' in dom, "the sorting script did not run"
        else:
            if 'id="latency-chart"' in page.read_text():
                assert re.search(r'<svg id="latency-chart".*?<circle', dom, re.S), page
            assert '<rect class="mem"' in dom, page
