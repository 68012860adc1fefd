"""The report's charts as plotly.js figure specs (plain dicts: data + layout), built from runs' records only.

Every point is a figure servelab already computed (a level's output tok/s, its p50 ITL, …) or a per-request
quantity from bench/metrics.py, the same functions the figures use, so a chart never shows a number that the
run's summary or records.jsonl cannot reproduce.

Made to be read at a glance: one latency figure per chart (TTFT and ITL against throughput, each point labelled
with its concurrency and joined in throughput order); log axes ticked at 1, 2, 5 × 10ⁿ with plain numbers; the
ITL histogram's bins shared by every run and clipped at the pooled p99.5, the tokens beyond counted in a note;
a run's name made distinct where two runs share one (two experiments' "well-configured"); the start-up timeline's
labels outside its bars.
"""

from __future__ import annotations

import bisect
import html
import math
from typing import Any

from servelab.bench import metrics as m
from servelab.compare.metrics import peak_level, single_level
from servelab.compare.run_data import RunData
from servelab.quantiles import percentile
from servelab.records import Summary

MAX_POINTS = 5000  # per distribution trace: enough for its shape, small enough for a light report
# One colour per run, the same in every chart (plotly's default colourway, in run order).
RUN_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
              "#17becf"]
PHASE_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#eeca3b", "#9d755d"]
ITL_CLIP_PERCENTILE = 99.5  # the ITL histogram's range ends here (pooled over runs); the tail is counted
ITL_BINS = 60
LABEL_MAX = 28  # characters of a run name on one line of an axis label; longer names wrap

Chart = dict[str, Any]


def run_labels(runs: list[RunData], escaped: bool = True) -> dict[int, str]:
    """A label per run (by position), distinct even where names are not: a name two runs share gets the
    experiment (or directory) its run came from, then a number if that is shared too. Escaped: plotly.js reads
    trace names and text as a small subset of HTML, and a name typed in an experiment file must show as typed."""
    names = [r.name for r in runs]
    labels = []
    for run in runs:
        label = run.name
        if names.count(run.name) > 1:
            origin = run.experiment_id or (run.ref.split("/")[0] if "/" in run.ref else run.ref)
            label = f"{run.name} ({origin})" if origin and origin != run.name else run.name
        labels.append(label)
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):
        if labels.count(label) > 1:
            seen[label] = seen.get(label, 0) + 1
            labels[i] = f"{label} #{seen[label]}"
    return {i: html.escape(label) if escaped else label for i, label in enumerate(labels)}


def _color(i: int) -> str:
    return RUN_COLORS[i % len(RUN_COLORS)]


def _wrap(label: str, width: int = LABEL_MAX) -> str:
    """An axis label broken into lines (plotly's <br>) at spaces, dots or dashes, never cut."""
    if len(label) <= width:
        return label
    lines, line = [], ""
    for word in label.replace("(", " (").split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    lines.append(line)
    return "<br>".join(lines)


def _layout(title: str, x: str, y: str, **extra: Any) -> dict[str, Any]:
    layout = {"title": {"text": title}, "xaxis": {"title": {"text": x}, "automargin": True},
              "yaxis": {"title": {"text": y}, "automargin": True},  # long run names as y labels (start-up chart)
              "height": 400, "margin": {"l": 70, "r": 30, "t": 90, "b": 60},
              # above the plot: below it, the legend would cover the x axis' tick labels
              "legend": {"orientation": "h", "x": 0, "y": 1.02, "xanchor": "left", "yanchor": "bottom"}}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(layout.get(key), dict):
            layout[key] = {**layout[key], **value}
        else:
            layout[key] = value
    return layout


def _concurrency_levels(run: RunData) -> list[Summary]:
    return [s for s in (run.sweep.levels if run.sweep else []) if s.mode == "concurrency"]


def _value(level: Summary, name: str, stat: str = "value") -> float | None:
    fig = level.figures.get(name)
    if fig is None:
        return None
    if stat == "value":
        return fig.value
    return getattr(fig.dist, stat) if fig.dist else None


def log_ticks(values: list[float]) -> dict[str, Any]:
    """Tick values and labels for a log axis over `values`: 1, 2, 5 × 10ⁿ written out ("20", "500", "1,000",
    "0.5"), so the axis never reads "2, 5, 1000, 2, 5"; every integer mantissa where that leaves fewer than three
    ticks in the range."""
    positive = [v for v in values if v and v > 0]
    if not positive:
        return {}
    lo, hi = min(positive), max(positive)
    for mantissas in ((1, 2, 5), tuple(range(1, 10))):  # a narrow range (45-110 ms) gets every integer mantissa
        ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 2)
                 for m in mantissas if lo / 2.5 <= m * 10.0 ** e <= hi * 2.5]
        if sum(1 for t in ticks if lo <= t <= hi) >= 3:
            break
    return {"tickvals": ticks, "ticktext": [_plain(t) for t in ticks]}


def _plain(value: float) -> str:
    """1,000 / 640 / 10.8 / 2 / 0.05: no more digits than the value has to say."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def throughput_vs_concurrency(runs: list[RunData]) -> Chart:
    labels = run_labels(runs)
    data = []
    for i, run in enumerate(runs):
        levels = _concurrency_levels(run)
        data.append({"type": "scatter", "mode": "lines+markers", "name": labels[i], "marker": {"color": _color(i)},
                     "line": {"color": _color(i)}, "x": [s.concurrency for s in levels],
                     "y": [_value(s, "output_tok_s") for s in levels],
                     "hovertemplate": "c%{x}: %{y:,.1f} tok/s<extra>" + labels[i] + "</extra>"})
    concurrencies = sorted({s.concurrency for run in runs for s in _concurrency_levels(run)})
    return {"id": "throughput", "data": data,
            "layout": _layout("Output tok/s vs concurrency", "concurrent streams (log scale)", "output tok/s",
                              xaxis={"type": "log", "tickvals": concurrencies,
                                     "ticktext": [str(c) for c in concurrencies]},
                              yaxis={"rangemode": "tozero"})}


def _latency_chart(runs: list[RunData], chart_id: str, figure: str, stat: str, title: str, y_title: str) -> Chart:
    """One latency figure against output tok/s: a point per concurrency level, labelled with it (c1, c2, …), the
    points of a run joined in order of throughput (a level that did not add throughput does not fold the line
    back)."""
    labels = run_labels(runs)
    data = []
    for i, run in enumerate(runs):
        points = [(s.concurrency, _value(s, "output_tok_s"), _value(s, figure, stat)) for s in _concurrency_levels(run)]
        points = sorted((p for p in points if p[1] is not None and p[2] is not None), key=lambda p: p[1])
        data.append({"type": "scatter", "mode": "lines+markers+text", "name": labels[i],
                     "marker": {"color": _color(i)}, "line": {"color": _color(i)},
                     "x": [p[1] for p in points], "y": [p[2] for p in points],
                     "text": [f"c{p[0]}" for p in points], "textposition": "top center", "cliponaxis": False,
                     "hovertemplate": "%{text}: %{x:,.1f} tok/s, %{y:,.1f} ms<extra>" + labels[i] + "</extra>"})
    values = [v for trace in data for v in trace["y"]]
    spread = max(values) / min(values) if values and min(values) > 0 else 1.0
    # Log scale when the levels differ by more than 20× (queueing TTFT), with plain ticks; linear otherwise.
    yaxis: dict[str, Any] = ({"type": "log", **log_ticks(values)} if spread > 20 else {"rangemode": "tozero"})
    yaxis["title"] = {"text": y_title.replace(" (ms)", ", ms") + (" (log scale)" if spread > 20 else "")}
    return {"id": chart_id, "data": data,
            "layout": _layout(title, "output tok/s (each point one concurrency level, cN)", y_title, yaxis=yaxis)}


def ttft_vs_throughput(runs: list[RunData]) -> Chart:
    return _latency_chart(runs, "latency-ttft", "ttft_ms", "p50", "TTFT p50 vs throughput", "TTFT p50 (ms)")


def itl_vs_throughput(runs: list[RunData]) -> Chart:
    return _latency_chart(runs, "latency-itl", "itl_ms", "p50", "ITL p50 vs throughput", "ITL p50 (ms)")


def _thin(values: list[float]) -> list[float]:
    """At most MAX_POINTS, by an even stride (deterministic: the same report from the same run)."""
    if len(values) <= MAX_POINTS:
        return values
    step = len(values) / MAX_POINTS
    return [values[int(i * step)] for i in range(MAX_POINTS)]


def ttft_distribution(runs: list[RunData]) -> Chart:
    labels = run_labels(runs)
    data = []
    values_all: list[float] = []
    for i, run in enumerate(runs):
        for level in (single_level(run), peak_level(run)):
            if level is None:
                continue
            values = [m.ttft_ns(r) / m.NS_PER_MS for r in run.records_of(level.tag) if m.ttft_ns(r) is not None]
            if values:
                values_all += values
                data.append({"type": "box", "name": _wrap(f"{labels[i]} · {level.tag}"), "y": _thin(values),
                             "boxpoints": "all", "jitter": 0.4, "pointpos": 0,
                             "marker": {"size": 3, "color": _color(i)}, "line": {"color": _color(i)},
                             "hovertemplate": "%{y:,.1f} ms<extra></extra>"})
    # log scale: queueing at peak can make TTFT 100x the single-stream one, which would flatten it
    return {"id": "ttft", "data": data,
            "layout": _layout("TTFT per request: single-stream and at peak", "", "TTFT (ms, log scale)",
                              showlegend=False, xaxis={"tickangle": 0},
                              yaxis={"type": "log", **log_ticks(values_all)})}


def _nice_step(span: float, bins: int) -> float:
    """A bin width of 1, 2 or 5 × 10ⁿ giving about `bins` bins over `span`."""
    raw = span / bins if span > 0 else 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    return next(k * power for k in (1, 2, 5, 10) if k * power >= raw)


def itl_distribution(runs: list[RunData]) -> Chart:
    """Every token gap of every single-stream request, one histogram per run on the same bins: the range ends at
    the p99.5 of all runs' gaps together, and the gaps beyond it are counted in the chart's note (with each run's
    largest), so one run's long tail cannot squeeze every other run into the first bin. Where the gaps shown still
    span more than 20x (a contended run beside a quiet one), the bins are spaced evenly on a log axis."""
    labels, words = run_labels(runs), run_labels(runs, escaped=False)
    gaps_by_run = []
    for i, run in enumerate(runs):
        level = single_level(run)
        gaps = [g for r in run.records_of(level.tag) for g in m.token_gaps_ms(r)] if level is not None else []
        if gaps:
            gaps_by_run.append((i, words[i], gaps))
    pooled = sorted(g for _, _, gaps in gaps_by_run for g in gaps)
    if not pooled:
        return {"id": "itl", "data": [], "layout": _layout("Inter-token latency, single-stream", "ITL (ms)", "")}
    top = percentile(pooled, ITL_CLIP_PERCENTILE)
    low = percentile(pooled, 100 - ITL_CLIP_PERCENTILE)
    log_bins = low > 0 and top / low > 20
    if log_bins:
        ratio = (top / low) ** (1 / ITL_BINS)
        edges = [low * ratio ** k for k in range(ITL_BINS + 1)]
        edges[0] = 0.0  # the first bin takes every gap below the p0.5 too
    else:  # from a round number below the p0.5: a chart of 10-16 ms gaps does not start at 0
        step = _nice_step(top - low, ITL_BINS)
        first = math.floor(low / step) * step
        end = max(math.ceil(top / step) * step, first + step)
        edges = [first + k * step for k in range(round((end - first) / step) + 1)]
    end = edges[-1]
    xs = [low / ratio] + edges[1:] if log_bins else list(edges)  # a log axis cannot show 0
    data, tails = [], []
    for i, word, gaps in gaps_by_run:
        label = labels[i]
        counts = [0] * (len(edges) - 1)
        beyond = 0
        for g in gaps:  # below the first edge: in the first bin (the note says so)
            if g > end:
                beyond += 1
                continue
            counts[max(0, min(len(counts) - 1, bisect.bisect_right(edges, g) - 1))] += 1
        total = len(gaps)
        pct = [100.0 * c / total for c in counts]
        # A filled step line: bins of unequal width (log axis) read as well as equal ones.
        data.append({"type": "scatter", "mode": "lines", "line": {"shape": "hv", "width": 1.5, "color": _color(i)},
                     "fill": "tozeroy", "opacity": 0.6, "name": label, "x": xs, "y": pct + [pct[-1]],
                     "hovertemplate": "from %{x:,.1f} ms: %{y:.1f} % of tokens<extra>" + label + "</extra>"})
        if beyond:
            tails.append(f"{word}: {beyond:,} of {total:,} tokens ({100 * beyond / total:.1f} %) beyond, "
                         f"the largest {max(gaps):,.1f} ms")
    spacing = ("bins evenly spaced on a log axis" if log_bins else f"bins of {_plain(edges[1] - edges[0])} ms")
    spacing += f" from {_plain(xs[0])} ms (the first also holds any gap below)" if xs[0] > 0 else ""
    note = (f"{spacing}, shared by every run, up to {_plain(end)} ms (the p{ITL_CLIP_PERCENTILE:g} of all runs' "
            f"gaps); " + ("; ".join(tails) if tails else "no gap beyond it"))
    xaxis: dict[str, Any] = ({"type": "log", **log_ticks([xs[0], end])} if log_bins else {"range": [xs[0], end]})
    xaxis["title"] = {"text": "ITL (ms" + (", log scale)" if log_bins else ")")}
    layout = _layout("Inter-token latency, single-stream (every token of every request)", "ITL (ms)",
                     "% of the run's tokens", xaxis=xaxis, yaxis={"rangemode": "tozero"})
    # The note is printed under the chart (report/html.py), where it can be as long as it needs.
    return {"id": "itl", "data": data, "layout": layout, "note": note}


def startup_timeline(runs: list[RunData]) -> Chart:
    labels = run_labels(runs)
    colors: dict[str, str] = {}
    data = []
    ends = []
    for i, run in enumerate(runs):
        if run.launch is None:
            continue
        label = _wrap(labels[i])
        end_default = run.launch.ready_s
        for phase in run.launch.phases:
            end = phase.end_s if phase.end_s is not None else end_default
            if end is None or phase.name == "ready":
                continue
            ends.append(end)
            color = colors.setdefault(phase.name, PHASE_COLORS[len(colors) % len(PHASE_COLORS)])
            data.append({"type": "bar", "orientation": "h", "y": [label], "x": [max(end - phase.start_s, 0.0)],
                         "base": [phase.start_s], "name": phase.name, "legendgroup": phase.name,
                         "showlegend": phase.name not in {d.get("name") for d in data},
                         "marker": {"color": color},
                         "hovertemplate": f"{phase.name}: {phase.start_s:.2f}–{end:.2f} s<extra></extra>"})
        if run.launch.ready_s is not None:
            ends.append(run.launch.ready_s)
            # The label sits right of the bar's end, in room the axis keeps for it: never under a bar.
            data.append({"type": "scatter", "mode": "markers+text", "y": [label], "x": [run.launch.ready_s],
                         "text": [f"ready {run.launch.ready_s:.1f} s"], "textposition": "middle right",
                         "cliponaxis": False, "marker": {"symbol": "line-ns-open", "size": 18, "color": "black"},
                         "showlegend": False, "hoverinfo": "skip"})
    height = max(220, 120 + 60 * len({d["y"][0] for d in data}))
    right = max(ends) * 1.25 if ends else 1.0
    return {"id": "startup", "data": data,
            "layout": _layout("Start-up timeline by phase", "seconds since launch", "", barmode="overlay",
                              height=height, xaxis={"range": [0, right]}, margin={"r": 90})}


def ttft_by_turn(runs: list[RunData]) -> Chart:
    """Multi-turn levels (issue 16): TTFT p50 against the turn index, one line per run, each point's hover with the
    share of that turn's prompt the engine served from its cache (what explains the line's slope)."""
    from servelab.compare.metrics import multiturn_level

    labels = run_labels(runs)
    data = []
    for i, run in enumerate(runs):
        level = multiturn_level(run)
        turns = [t for t in (level.turns if level else []) if t.ttft_ms is not None]
        shares = ["–" if t.cached_share is None else f"{t.cached_share * 100:.0f} %" for t in turns]
        data.append({"type": "scatter", "mode": "lines+markers", "name": labels[i], "marker": {"color": _color(i)},
                     "line": {"color": _color(i)}, "x": [t.turn for t in turns], "y": [t.ttft_ms.p50 for t in turns],
                     "text": shares,
                     "hovertemplate": "turn %{x}: TTFT p50 %{y:,.0f} ms, %{text} of the prompt from cache<extra>"
                                      + labels[i] + "</extra>"})
    return {"id": "ttft-by-turn", "data": data,
            "layout": _layout("TTFT p50 by turn (multi-turn conversations)", "turn of the conversation",
                              "TTFT p50 (ms)", xaxis={"dtick": 1}, yaxis={"rangemode": "tozero"})}


def goodput_vs_rate(runs: list[RunData]) -> Chart:
    """An SLO search's probes (pooled over the trials that count): goodput against the offered rate, one line per
    run, each point's hover saying whether that level met the targets; where goodput leaves the diagonal, requests
    stopped meeting them."""
    from servelab.compare.metrics import step_of_mode

    labels = run_labels(runs)
    data = []
    for i, run in enumerate(runs):
        step = step_of_mode(run, "slo-search")
        levels = sorted((s for s in (step.result.levels if step else []) if s.rate is not None
                         and _value(s, "goodput_req_s") is not None), key=lambda s: s.rate or 0.0)
        met = ["met the targets" if s.slo and s.slo.get("passed") else "missed the targets" for s in levels]
        data.append({"type": "scatter", "mode": "lines+markers", "name": labels[i], "marker": {"color": _color(i)},
                     "line": {"color": _color(i)}, "x": [s.rate for s in levels],
                     "y": [_value(s, "goodput_req_s") for s in levels], "text": met,
                     "hovertemplate": "%{x:g} req/s offered: goodput %{y:,.2f} req/s, %{text}<extra>" + labels[i]
                                      + "</extra>"})
    return {"id": "goodput", "data": data,
            "layout": _layout("Goodput vs offered rate (SLO search)", "offered rate (req/s)", "goodput (req/s)",
                              yaxis={"rangemode": "tozero"})}


def all_charts(runs: list[RunData]) -> list[Chart]:
    from servelab.report.gpu_charts import gpu_timelines, tokens_per_joule_vs_concurrency

    labels = run_labels(runs)
    charts = [throughput_vs_concurrency(runs), ttft_vs_throughput(runs), itl_vs_throughput(runs),
              ttft_distribution(runs), itl_distribution(runs), ttft_by_turn(runs), goodput_vs_rate(runs),
              tokens_per_joule_vs_concurrency(runs, labels, RUN_COLORS), startup_timeline(runs)]
    for i, run in enumerate(runs):  # what the GPUs did over time, run by run (docs/metrics.md#gpu)
        charts += gpu_timelines(run, labels[i], i)
    return [c for c in charts if any((t.get("x") or t.get("y")) for t in c["data"])]
