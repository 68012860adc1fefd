"""The report's GPU charts (docs/metrics.md#gpu): each run's power and SM activity over time per GPU, with its
levels' boundaries, from the GPU series in its run directory; and output tokens per joule against concurrency,
from the levels' figures.

A series is read twice, one reading at a time, and never held: once for its time span, once to fold the readings
into at most MAX_SERIES_POINTS buckets per GPU (each the mean of its readings), so an hours-long soak at 4 Hz
on eight GPUs draws as light a chart as a minute's. A level's boundaries are its first request's send and its
last request's end (the records' times are the series' clock, time.perf_counter_ns).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from servelab.compare.run_data import RunData
from servelab.records import GpuReading
from servelab.store.export_layout import iter_series, series_of

MAX_SERIES_POINTS = 600  # per GPU and chart: about one per pixel of a report's chart width
LEVEL_LINE = "rgba(0, 0, 0, 0.35)"
GPU_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]

Chart = dict[str, Any]


def downsample(readings: Iterable[GpuReading], t0_ns: int, t1_ns: int, points: int = MAX_SERIES_POINTS
               ) -> dict[int, dict[str, list[float | None]]]:
    """Per GPU: bucket start times (s since t0) and the mean power and SM activity of each bucket's readings (None
    where a bucket's readings had none), over at most `points` equal buckets of [t0, t1]."""
    span = max(t1_ns - t0_ns, 1)
    width = span / points
    sums: dict[int, dict[int, list[float]]] = {}  # gpu -> bucket -> [power sum, power n, sm sum, sm n]
    for r in readings:
        bucket = min(int((r.t_ns - t0_ns) / width), points - 1)
        if bucket < 0:
            continue
        cell = sums.setdefault(r.gpu, {}).setdefault(bucket, [0.0, 0, 0.0, 0])
        if r.power_w is not None:
            cell[0] += r.power_w
            cell[1] += 1
        if r.sm_active_pct is not None:
            cell[2] += r.sm_active_pct
            cell[3] += 1
    out: dict[int, dict[str, list[float | None]]] = {}
    for gpu, buckets in sorted(sums.items()):
        keys = sorted(buckets)
        out[gpu] = {"t": [(k + 0.5) * width / 1e9 for k in keys],
                    "power": [c[0] / c[1] if c[1] else None for c in (buckets[k] for k in keys)],
                    "sm": [c[2] / c[3] if c[3] else None for c in (buckets[k] for k in keys)]}
    return out


def _span(run: RunData) -> tuple[int, int] | None:
    low = high = None
    for r in iter_series(series_of(run.run_dir)):
        low = r.t_ns if low is None else min(low, r.t_ns)
        high = r.t_ns if high is None else max(high, r.t_ns)
    return (low, high) if low is not None and high is not None else None


def level_bounds(run: RunData, t0_ns: int) -> list[tuple[str, float, float]]:
    """(label, start s, end s) of each measured level, trial by trial, on the series' time axis."""
    spans: dict[tuple[int, str], list[int]] = {}
    for r in run.records:
        if r.warmup or r.t_end_ns is None:
            continue
        span = spans.setdefault((r.trial, r.tag), [r.t_send_ns, r.t_end_ns])
        span[0], span[1] = min(span[0], r.t_send_ns), max(span[1], r.t_end_ns)
    trials = {trial for trial, _ in spans}
    return [(tag if len(trials) == 1 else f"t{trial + 1} {tag}", (a - t0_ns) / 1e9, (b - t0_ns) / 1e9)
            for (trial, tag), (a, b) in sorted(spans.items(), key=lambda kv: kv[1][0])]


def gpu_timelines(run: RunData, label: str, index: int) -> list[Chart]:
    """Power and SM activity over time per GPU for one run, with its levels marked: [] without a GPU series."""
    span = _span(run)
    if span is None:
        return []
    t0, t1 = span
    series = downsample(iter_series(series_of(run.run_dir)), t0, t1)
    bounds = level_bounds(run, t0)
    shapes = [{"type": "rect", "xref": "x", "yref": "paper", "x0": a, "x1": b, "y0": 0, "y1": 1,
               "fillcolor": "rgba(0, 0, 0, 0.04)", "line": {"color": LEVEL_LINE, "width": 1, "dash": "dot"}}
              for _, a, b in bounds]
    annotations = [{"x": a, "y": 1, "xref": "x", "yref": "paper", "text": tag, "showarrow": False,
                    "xanchor": "left", "yanchor": "bottom", "font": {"size": 10}} for tag, a, _ in bounds]
    charts = []
    for key, title, unit in (("power", "GPU power over time", "power (W)"),
                             ("sm", "SM activity over time", "SM activity (%)")):
        data = [{"type": "scatter", "mode": "lines", "name": f"GPU {gpu}", "x": values["t"], "y": values[key],
                 "line": {"width": 1.2, "color": GPU_COLORS[gpu % len(GPU_COLORS)]}, "connectgaps": False,
                 "hovertemplate": f"GPU {gpu}: %{{y:,.1f}} at %{{x:,.1f}} s<extra></extra>"}
                for gpu, values in series.items() if any(v is not None for v in values[key])]
        if not data:
            continue
        charts.append({"id": f"gpu-{key}-{index}", "data": data,
                       "layout": {"title": {"text": f"{title}: {label} (each GPU; levels shaded)"},
                                  "xaxis": {"title": {"text": "seconds since the first GPU reading"},
                                            "automargin": True},
                                  "yaxis": {"title": {"text": unit}, "rangemode": "tozero", "automargin": True},
                                  "height": 360, "margin": {"l": 70, "r": 30, "t": 90, "b": 60},
                                  "shapes": shapes, "annotations": annotations,
                                  "legend": {"orientation": "h", "x": 0, "y": 1.08, "xanchor": "left",
                                             "yanchor": "bottom"}},
                       "note": f"means over buckets of {(t1 - t0) / 1e9 / MAX_SERIES_POINTS:.3g} s of the GPU "
                               f"sampler's readings (at most {MAX_SERIES_POINTS} points per GPU)"})
    return charts


def tokens_per_joule_vs_concurrency(runs: list[RunData], labels: dict[int, str], colors: list[str]) -> Chart:
    """Output tokens per joule at each concurrency level of each run's sweep (the levels pooled over its trials)."""
    data = []
    for i, run in enumerate(runs):
        levels = [s for s in (run.sweep.levels if run.sweep else []) if s.mode == "concurrency"
                  and s.figures.get("output_tokens_per_j") and s.figures["output_tokens_per_j"].value is not None]
        color = colors[i % len(colors)]
        data.append({"type": "scatter", "mode": "lines+markers", "name": labels[i], "marker": {"color": color},
                     "line": {"color": color}, "x": [s.concurrency for s in levels],
                     "y": [s.figures["output_tokens_per_j"].value for s in levels],
                     "hovertemplate": "c%{x}: %{y:,.3g} tok/J<extra>" + labels[i] + "</extra>"})
    concurrencies = sorted({c for trace in data for c in trace["x"]})
    return {"id": "tokens-per-joule", "data": data,
            "layout": {"title": {"text": "Output tokens per joule vs concurrency (the engine's GPUs)"},
                       "xaxis": {"title": {"text": "concurrent streams (log scale)"}, "type": "log",
                                 "tickvals": concurrencies, "ticktext": [str(c) for c in concurrencies],
                                 "automargin": True},
                       "yaxis": {"title": {"text": "output tokens per joule"}, "rangemode": "tozero",
                                 "automargin": True},
                       "height": 400, "margin": {"l": 70, "r": 30, "t": 90, "b": 60},
                       "legend": {"orientation": "h", "x": 0, "y": 1.02, "xanchor": "left", "yanchor": "bottom"}}}
