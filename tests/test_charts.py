"""The report's charts read at a glance (issue 13): shared ITL bins clipped at the pooled p99.5 with the tail
counted, one latency chart per figure in throughput order, plain log-axis ticks, distinct run names, start-up
labels clear of the bars, and human labels in the report's tables. What they look like in Chromium:
tests/test_report.py."""

from __future__ import annotations

import re

from servelab.compare.compare import compare_runs
from servelab.compare.sources import from_summary
from servelab.records import TokenEvent
from servelab.report.charts import (all_charts, itl_distribution, itl_vs_throughput, log_ticks, run_labels,
                                    startup_timeline, ttft_distribution, ttft_vs_throughput)
from servelab.report.html import render_report
from synthetic_runs import NS, synthetic_run


def run(name: str, ref: str | None = None, experiment: str | None = None, **kw):
    summary, records = synthetic_run(ref or name, **kw)
    return from_summary(summary, records, name, ref or name, experiment)


def with_long_gaps(data, n: int, gap_ms: float):
    """`n` single-stream requests of the run get one extra token `gap_ms` after their last."""
    singles = [r for r in data.records if r.tag == "single"][:n]
    for r in singles:
        r.events.append(TokenEvent(t_ns=r.events[-1].t_ns + int(gap_ms * NS), kind="answer", tokens=1, text="x"))
    return data


def test_itl_bins_are_shared_and_clipped_at_the_pooled_p99_5_with_the_tail_counted():
    quiet = run("quiet", itl_ms=10.0, seed=1)
    tail = with_long_gaps(run("tail", itl_ms=12.0, seed=2), n=2, gap_ms=1400.0)
    chart = itl_distribution([quiet, tail])
    xs = [trace["x"] for trace in chart["data"]]
    assert xs[0] == xs[1]  # the same bins for both runs
    end = xs[0][-1]
    assert 12.0 < end < 100.0  # the range ends near the bulk, not at the 1,400 ms gaps
    assert chart["layout"]["xaxis"]["range"][1] == end
    note = chart["note"]
    assert "shared by every run" in note and "p99.5" in note
    gaps = sum(len(r.events) - 1 for r in tail.records if r.tag == "single")
    assert f"tail: 2 of {gaps:,} tokens" in note and "the largest 1,4" in note
    assert "quiet" not in note.split(";", 1)[1]  # nothing of the quiet run lies beyond
    for trace in chart["data"]:  # the bulk is spread over several bins, not all in the first
        assert sum(1 for y in trace["y"] if y > 1.0) >= 3


def test_itl_bins_go_log_when_one_run_is_20_times_slower():
    fast, slow = run("fast", itl_ms=2.0, seed=1), run("slow", itl_ms=80.0, seed=2)
    chart = itl_distribution([fast, slow])
    assert chart["layout"]["xaxis"]["type"] == "log"
    assert chart["data"][0]["x"] == chart["data"][1]["x"]
    for trace in chart["data"]:
        assert sum(1 for y in trace["y"] if y > 1.0) >= 3


def test_one_latency_chart_per_figure_with_points_labelled_and_in_throughput_order():
    runs = [run("one-slot", slots=1, seed=1, ttft_ms=400.0), run("eight", slots=8, seed=2)]
    for chart in (ttft_vs_throughput(runs), itl_vs_throughput(runs)):
        assert "yaxis2" not in chart["layout"]
        for trace in chart["data"]:
            assert trace["x"] == sorted(trace["x"])
            assert all(re.fullmatch(r"c\d+", t) for t in trace["text"]) and len(trace["text"]) == len(trace["x"])
    ids = [c["id"] for c in all_charts(runs)]
    assert ids == ["throughput", "latency-ttft", "latency-itl", "ttft", "itl", "startup"]


def test_log_axes_are_ticked_with_plain_numbers():
    ticks = log_ticks([3.2, 1690.0])
    assert ticks["ticktext"] == ["2", "5", "10", "20", "50", "100", "200", "500", "1,000", "2,000"]
    assert all(t in ticks["tickvals"] for t in (10, 100, 1000))
    chart = ttft_distribution([run("a", seed=1), run("b", slots=1, seed=2, ttft_ms=900.0)])
    assert chart["layout"]["yaxis"]["type"] == "log"
    assert all(re.fullmatch(r"[\d,.]+", t) for t in chart["layout"]["yaxis"]["ticktext"])


def test_runs_that_share_a_name_get_distinct_labels():
    a = run("well-configured", ref="20261130-101010-default/well-configured", experiment="20261130-101010-default")
    b = run("well-configured", ref="20261130-121212-default/well-configured", experiment="20261130-121212-default")
    labels = run_labels([a, b])
    assert labels[0] != labels[1]
    assert "20261130-101010-default" in labels[0] and "20261130-121212-default" in labels[1]
    boxes = [t["name"] for t in ttft_distribution([a, b])["data"]]
    assert len(set(boxes)) == len(boxes) == 4
    same = [run("x", seed=1), run("x", seed=2)]
    assert len(set(run_labels(same).values())) == 2


def test_start_up_labels_sit_right_of_the_bars_in_room_the_axis_keeps():
    runs = [run("a", seed=1), run("b", seed=2)]
    chart = startup_timeline(runs)
    ready = [t for t in chart["data"] if t["type"] == "scatter"]
    assert ready and all(t["textposition"] == "middle right" and t["cliponaxis"] is False for t in ready)
    latest = max(t["x"][0] for t in ready)
    assert chart["layout"]["xaxis"]["range"][1] >= 1.2 * latest
    assert chart["layout"]["legend"]["yanchor"] == "bottom"  # above the plot, clear of the tick labels


def test_the_report_tables_speak_words_not_keys():
    summary, records = synthetic_run("exp/a")
    summary.provenance.model_size_bytes = 98_362_432
    a = from_summary(summary, records, "a", "exp/a")
    b = run("b", seed=2)
    page = render_report([a, b], compare_runs([a, b]))
    assert "single-stream decode tok/s (p50)</span>" in page
    assert "<td>single.decode_tok_s</td>" not in page and ">peak.concurrency<" not in page
    assert "<td>98 MB</td>" in page and "98362432" not in page
    assert "the server&#x27;s count on every chunk" in page
