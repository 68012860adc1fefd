"""The report's charts as plotly.js figure specs (plain dicts: data + layout), built from runs' records only.

Every point is a figure servelab already computed (a level's output tok/s, its p50 ITL, …) or a per-request
quantity from bench/metrics.py, the same functions the figures use, so a chart never shows a number that the
run's summary or records.jsonl cannot reproduce.
"""

from __future__ import annotations

import html
from typing import Any

from servelab.bench import metrics as m
from servelab.compare.metrics import peak_level, single_level
from servelab.compare.sources import RunData
from servelab.records import Summary

MAX_POINTS = 5000  # per distribution trace: enough for its shape, small enough for a light report
PHASE_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#eeca3b", "#9d755d"]

Chart = dict[str, Any]


def _label(run: RunData) -> str:
    """plotly.js reads trace names and text as a small subset of HTML: a name typed in an experiment file is
    escaped so that it shows as typed."""
    return html.escape(run.name)


def _layout(title: str, x: str, y: str, **extra: Any) -> dict[str, Any]:
    return {"title": {"text": title}, "xaxis": {"title": {"text": x}},
            "yaxis": {"title": {"text": y}, "automargin": True},  # long run names as y labels (start-up chart)
            "height": 360, "margin": {"l": 70, "r": 20, "t": 50, "b": 60}, "legend": {"orientation": "h"}, **extra}


def _concurrency_levels(run: RunData) -> list[Summary]:
    return [s for s in (run.sweep.levels if run.sweep else []) if s.mode == "concurrency"]


def _value(level: Summary, name: str, stat: str = "value") -> float | None:
    fig = level.figures.get(name)
    if fig is None:
        return None
    if stat == "value":
        return fig.value
    return getattr(fig.dist, stat) if fig.dist else None


def throughput_vs_concurrency(runs: list[RunData]) -> Chart:
    data = []
    for run in runs:
        levels = _concurrency_levels(run)
        data.append({"type": "scatter", "mode": "lines+markers", "name": _label(run),
                     "x": [s.concurrency for s in levels], "y": [_value(s, "output_tok_s") for s in levels]})
    return {"id": "throughput", "data": data,
            "layout": _layout("Output tok/s vs concurrency", "concurrent streams", "output tok/s",
                              xaxis={"title": {"text": "concurrent streams"}, "type": "log", "dtick": 0.30103})}


def latency_vs_throughput(runs: list[RunData]) -> Chart:
    data = []
    for run in runs:
        levels = _concurrency_levels(run)
        data.append({"type": "scatter", "mode": "lines+markers+text", "name": f"{_label(run)} ITL p50",
                     "x": [_value(s, "output_tok_s") for s in levels], "y": [_value(s, "itl_ms", "p50") for s in levels],
                     "text": [f"c{s.concurrency}" for s in levels], "textposition": "top center"})
        data.append({"type": "scatter", "mode": "lines+markers", "name": f"{_label(run)} TTFT p50",
                     "line": {"dash": "dot"}, "yaxis": "y2",
                     "x": [_value(s, "output_tok_s") for s in levels], "y": [_value(s, "ttft_ms", "p50") for s in levels]})
    layout = _layout("Latency vs throughput (one point per concurrency level)", "output tok/s", "ITL p50 (ms)")
    layout["yaxis2"] = {"title": {"text": "TTFT p50 (ms, dotted)"}, "overlaying": "y", "side": "right"}
    layout["margin"]["r"] = 70
    return {"id": "latency", "data": data, "layout": layout}


def _thin(values: list[float]) -> list[float]:
    """At most MAX_POINTS, by an even stride (deterministic: the same report from the same run)."""
    if len(values) <= MAX_POINTS:
        return values
    step = len(values) / MAX_POINTS
    return [values[int(i * step)] for i in range(MAX_POINTS)]


def ttft_distribution(runs: list[RunData]) -> Chart:
    data = []
    for run in runs:
        for level in (single_level(run), peak_level(run)):
            if level is None:
                continue
            values = [m.ttft_ns(r) / m.NS_PER_MS for r in run.records_of(level.tag) if m.ttft_ns(r) is not None]
            if values:
                data.append({"type": "box", "name": f"{_label(run)} · {level.tag}", "y": _thin(values),
                             "boxpoints": "all", "jitter": 0.4, "pointpos": 0, "marker": {"size": 3}})
    return {"id": "ttft", "data": data,
            # log scale: queueing at peak can make TTFT 100x the single-stream one, which would flatten it
            "layout": _layout("TTFT per request: single-stream and at peak", "", "TTFT (ms, log scale)",
                              showlegend=False, yaxis={"title": {"text": "TTFT (ms, log scale)"}, "type": "log",
                                                       "automargin": True})}


def itl_distribution(runs: list[RunData]) -> Chart:
    data = []
    for run in runs:
        level = single_level(run)
        if level is None:
            continue
        gaps = [g for r in run.records_of(level.tag) for g in m.token_gaps_ms(r)]
        if gaps:
            data.append({"type": "histogram", "name": _label(run), "x": _thin(gaps), "opacity": 0.6,
                         "histnorm": "percent", "nbinsx": 60})
    return {"id": "itl", "data": data,
            "layout": _layout("Inter-token latency, single-stream (every token of every request)", "ITL (ms)",
                              "% of tokens", barmode="overlay")}


def startup_timeline(runs: list[RunData]) -> Chart:
    colors: dict[str, str] = {}
    data = []
    for run in runs:
        if run.launch is None:
            continue
        end_default = run.launch.ready_s
        for phase in run.launch.phases:
            end = phase.end_s if phase.end_s is not None else end_default
            if end is None or phase.name == "ready":
                continue
            color = colors.setdefault(phase.name, PHASE_COLORS[len(colors) % len(PHASE_COLORS)])
            data.append({"type": "bar", "orientation": "h", "y": [_label(run)], "x": [max(end - phase.start_s, 0.0)],
                         "base": [phase.start_s], "name": phase.name, "legendgroup": phase.name,
                         "showlegend": phase.name not in {d.get("name") for d in data},
                         "marker": {"color": color},
                         "hovertemplate": f"{phase.name}: {phase.start_s:.2f}–{end:.2f} s<extra></extra>"})
        if run.launch.ready_s is not None:
            data.append({"type": "scatter", "mode": "markers+text", "y": [_label(run)], "x": [run.launch.ready_s],
                         "text": [f"ready {run.launch.ready_s:.1f} s"], "textposition": "middle right",
                         "marker": {"symbol": "line-ns-open", "size": 18, "color": "black"}, "showlegend": False})
    height = max(200, 80 + 50 * len({d["y"][0] for d in data}))
    return {"id": "startup", "data": data,
            "layout": _layout("Start-up timeline by phase", "seconds since launch", "", barmode="overlay",
                              height=height)}


def all_charts(runs: list[RunData]) -> list[Chart]:
    charts = [throughput_vs_concurrency(runs), latency_vs_throughput(runs), ttft_distribution(runs),
              itl_distribution(runs), startup_timeline(runs)]
    return [c for c in charts if any((t.get("x") or t.get("y")) for t in c["data"])]
