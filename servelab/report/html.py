"""The HTML report: one self-contained file (plotly.js inlined, no network needed to open it).

Sections: the comparison and its verdicts, charts (report/charts.py), then per run its headline figures, levels,
verify checks with response excerpts, lint findings, provenance and a sample of the model's answers.

Everything that comes from outside servelab (model output, server responses, cell names, command lines) is
escaped with `html.escape` on its way into the page, and the chart data is JSON with `<`, `>` and `&` escaped, so
no text a model writes can become markup or script. Nothing else is ever interpolated raw.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import servelab
from servelab.compare.compare import Comparison
from servelab.compare.metrics import single_level
from servelab.compare.run_data import RunData
from servelab.errors import UserError
from servelab.provenance import utc_now_iso
from servelab.report.charts import all_charts
from servelab.report.html_sections import comparison_section, e, run_section

SAMPLE_ANSWERS = 2  # answers shown per run
STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 2em; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.better { color: #1a7f37; font-weight: bold; } .worse { color: #cf222e; font-weight: bold; }
.noise, .dim { color: #777; } .serious, .fail { color: #cf222e; font-weight: bold; } .warn { color: #9a6700; }
.pass { color: #1a7f37; } .banner { background: #cf222e; color: white; padding: 6px 10px; font-weight: bold; }
.chart { width: 100%; min-height: 200px; margin-bottom: 24px; }
.chart-note { margin: -16px 0 24px 70px; font-size: 0.9em; }
pre { white-space: pre-wrap; word-break: break-word; background: #f6f8fa; padding: 8px; max-height: 240px;
      overflow: auto; }
"""


def script_json(value: Any) -> str:
    """JSON safe inside <script>: `</script>` or `<!--` in a string cannot end or change the script."""
    return (json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def plotly_js() -> str:
    try:
        js = resources.files("plotly").joinpath("package_data/plotly.min.js").read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise UserError(f"the HTML report needs plotly's bundled plotly.js ({exc})", hint="pip install plotly") \
            from None
    return js.replace("</script", "<\\/script")  # cannot occur in plotly.js today; would end the element


def sample_answers(run: RunData) -> list[str]:
    level = single_level(run)
    records = run.records_of(level.tag) if level else [r for r in run.records if r.ok]
    return [r.text for r in records[:SAMPLE_ANSWERS]]


def render_report(runs: list[RunData], comparison: Comparison | None, title: str = "servelab report") -> str:
    charts = all_charts(runs)
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{e(title)}</title>",
             f"<style>{STYLE}</style>", f"<script>{plotly_js()}</script></head><body>",
             f"<h1>{e(title)}</h1>",
             f"<p class=\"dim\">generated {e(utc_now_iso())} by servelab {e(servelab.__version__)}; every figure is "
             f"defined in docs/metrics.md and computed from the runs' per-request records</p>"]
    if comparison is not None:
        parts.append(comparison_section(comparison))
    if charts:
        parts.append("<h2>Charts</h2>")
        for c in charts:
            parts.append(f"<div class=\"chart\" id=\"chart-{e(c['id'])}\"></div>")
            if c.get("note"):
                parts.append(f"<p class=\"dim chart-note\" id=\"note-{e(c['id'])}\">{e(c['note'])}</p>")
    for run in runs:
        parts.append(run_section(run, sample_answers(run)))
    parts.append(f"<script>const CHARTS = {script_json(charts)};\n"
                 "for (const c of CHARTS) {\n"
                 "  Plotly.newPlot('chart-' + c.id, c.data, c.layout, {displaylogo: false, responsive: true});\n"
                 "}\n</script></body></html>\n")
    return "\n".join(parts)


def write_report(runs: list[RunData], comparison: Comparison | None, path: Path,
                 title: str = "servelab report") -> Path:
    from servelab.store.files import write_output

    return write_output(path, render_report(runs, comparison, title), "report")
