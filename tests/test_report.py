"""The HTML report: self-contained, its charts render in a real browser, and model output is shown as text.

The browser test opens the report in headless Chromium (Debian's `chromium`, installed by ./dev.sh test when
missing) twice: --dump-dom for the DOM after plotly.js ran, --screenshot for what a person would see.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from png import read_png
from servelab.compare.compare import compare_runs
from servelab.compare.sources import from_summary
from servelab.report.html import render_report, write_report
from synthetic_runs import synthetic_run

EVIL = "<script>alert(1)</script>"
CHART_IDS = ["throughput", "latency-ttft", "latency-itl", "ttft", "itl", "startup"]


def runs():
    # two trials each: the verdict sentences need them
    bad = from_summary(*synthetic_run("exp/misconfigured", slots=1, seed=1, serious=True, text=EVIL, trials=2),
                       "misconfigured", "exp/misconfigured")
    good = from_summary(*synthetic_run("exp/well", slots=8, seed=2, trials=2), "well <i>configured</i>", "exp/well")
    return [bad, good]


def test_the_report_is_self_contained_and_escapes_what_it_did_not_write() -> None:
    data = runs()
    page = render_report(data, compare_runs(data))
    assert "<script src" not in page
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=\"https?://", page)  # nothing fetched to open it
    assert page.count("<script>") == 2  # plotly.js and the charts' data: nothing else can run
    assert EVIL not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "well &lt;i&gt;configured&lt;/i&gt;" in page and "<i>configured</i>" not in page
    for chart in CHART_IDS:
        assert f'id="chart-{chart}"' in page
    assert "NOT REPRESENTATIVE" in page and "faster than misconfigured at peak" in page


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed (./dev.sh test installs Debian's package when run as root)")
    return path


def _browser(chromium: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp / 'profile'}", "--virtual-time-budget=10000"]
    return subprocess.run([chromium, *flags, *args], capture_output=True, text=True, timeout=120)


def test_the_report_renders_its_charts_in_chromium(tmp_path: Path) -> None:
    chromium = _chromium()
    data = runs()
    report = write_report(data, compare_runs(data), tmp_path / "report.html")

    dom = _browser(chromium, tmp_path, "--dump-dom", report.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    # every chart container got plotly's SVG with at least one drawn trace
    for i, chart in enumerate(CHART_IDS):
        start = html.index(f'id="chart-{chart}"')
        end = html.index(f'id="chart-{CHART_IDS[i + 1]}"') if i + 1 < len(CHART_IDS) else len(html)
        part = html[start:end]
        assert 'class="main-svg"' in part, f"chart {chart} has no SVG"
        assert re.search(r'class="trace[ "]', part) and re.search(r' d="M[0-9]', part), f"chart {chart} is empty"
    # readable axes: the TTFT box plot's log axis is ticked with plain numbers (never "2, 5, 1000, 2, 5"), the
    # ITL histogram's note counts its tail, and each latency chart has one y axis
    ttft = html[html.index('id="chart-ttft"'):html.index('id="chart-itl"')]
    ticks = re.findall(r'class="ytick"><text[^>]*>([^<]*)</text>', ttft)
    assert len(ticks) >= 3 and all(re.fullmatch(r"[\d,.]+", t) for t in ticks), ticks
    assert 'id="note-itl"' in html and "shared by every run" in html
    latency = html[html.index('id="chart-latency-ttft"'):html.index('id="chart-latency-itl"')]
    assert "y2" not in re.findall(r'class="(y\d?)tick"', latency)
    # the model's output is text in the page, and no script element carries it
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert EVIL not in html
    assert not re.search(r"<script[^>]*>\s*alert\(1\)", html)

    shot = tmp_path / "report.png"
    # Half the device pixels: a smaller PNG to decode, still every chart's strokes and fills.
    result = _browser(chromium, tmp_path, f"--screenshot={shot}", "--window-size=1280,3200",
                      "--force-device-scale-factor=0.5", "--hide-scrollbars", report.as_uri())
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    width, height, rows = read_png(shot)
    blue = orange = 0  # plotly's first two trace colours: only charts draw them (text is black, grey, red, green)
    for row in rows:
        for x in range(0, width * 3, 3):
            r, g, b = row[x], row[x + 1], row[x + 2]
            if b > 140 and b > r + 50 and b > g + 20:
                blue += 1
            elif r > 200 and 90 < g < 180 and b < 80:
                orange += 1
    assert blue > 500 and orange > 500, (blue, orange)
