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


# ---- chat with images ----------------------------------------------------------------------------------------


def _cells(table: str) -> list[list[str]]:
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]]


def _with_images(level_tag: str, rows) -> object:
    """A synthetic run whose level `level_tag` carried the image groups `rows` make (bench/image_figures.py)."""
    from servelab.bench.image_figures import image_figures

    run = from_summary(*synthetic_run("exp/vision", seed=3), "vision", "exp/vision")
    level = next(s for s in run.levels if s.tag == level_tag)
    level.images = image_figures(rows)[1]
    return run


def test_the_report_shows_a_levels_requests_by_image_count_and_size_as_the_terminal_does() -> None:
    from servelab.bench.image_figures import ImageRow

    wide, tall = 1024 * 768, 768 * 1024
    rows = [ImageRow(0, 0, 10.0, 30, ""), ImageRow(1, wide, 40.0, 300, "1024x768"),
            ImageRow(1, wide, None, None, "1024x768", ok=False), ImageRow(1, tall, 60.0, 1_320, "768x1024"),
            ImageRow(1, tall, 62.0, 1_320, "768x1024"), ImageRow(2, 2 * wide, 1_250.0, 2_570, "1024x768,1024x768")]
    vision = _with_images("c2", rows)
    text = from_summary(*synthetic_run("exp/text", seed=4), "text", "exp/text")
    page = render_report([vision, text], None)

    section = page[page.index("<h3>Chat with images</h3>"):]
    assert section.count("<h4") == 1 and "c2" in section[:section.index("</h4>")]  # the one level that sent images
    table = section[section.index("<table>"):section.index("</table>")]
    assert _cells(table) == [
        ["0", "–", "0.000", "1", "0", "30", "10", "10"],
        ["1", "1024x768", "0.786", "1", "1", "300", "40", "40"],  # the failed request is counted apart
        ["1", "768x1024", "0.786", "2", "0", "1,320", "61", "62"],  # equal pixels, another group
        ["2", "2 × 1024x768", "1.573", "1", "0", "2,570", "1,250", "1,250"]]
    # the text-only run adds no images section: only the vision run's section has one
    assert page.count("<h3>Chat with images</h3>") == 1
    assert page.index("<h3>Chat with images</h3>") < page.index("<h2>Run text")


def test_a_run_without_images_has_no_images_section() -> None:
    from servelab.report.html_sections import images_tables

    plain = from_summary(*synthetic_run("exp/text", seed=5), "text", "exp/text")
    assert images_tables(plain) == ""
    assert "Chat with images" not in render_report([plain], None)


def test_image_sizes_and_level_tags_from_a_file_are_escaped() -> None:
    from servelab.bench.image_figures import ImageRow
    from servelab.report.html_sections import images_tables

    run = _with_images("c1", [ImageRow(1, 4, 5.0, 9, EVIL)])
    next(s for s in run.levels if s.tag == "c1").tag = EVIL  # a run directory is a file anyone can edit: nothing in it becomes markup
    page = images_tables(run)
    assert EVIL not in page and page.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 2
