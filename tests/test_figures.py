"""The figures of a level are declared once (bench/figures.py): summarize makes exactly the figures of the table,
every window rate pools across trials to a number, and the table's anchors, CSV and terminal columns hold.

The trap this guards: a rate figure that the trial pooling did not know of pooled to None across trials.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

from servelab.bench import metrics
from servelab.bench.figures import (AGGREGATE_KEYS, FIGURES, GPU_FIGURES, LEVEL_FIGURES, WITHHELD_KEYS, Pooling,
                                    lookup)
from servelab.bench.metrics import summarize
from servelab.bench.slo import parse_slos
from servelab.bench.steady import SteadyRule, apply, judge
from servelab.bench.tally import LevelTally
from servelab.bench.trials import pool_level
from servelab.records import RequestRecord, TokenEvent, ToolCall, Usage
from servelab.report.terminal import LEVEL_COLUMNS as TERMINAL_COLUMNS
from servelab.store.export import LEVEL_COLUMNS as CSV_COLUMNS
from servelab.store.export import STATS
from tests.test_import_graph import import_graph, strongly_connected

ROOT = Path(__file__).resolve().parent.parent
MS = 1_000_000
T0 = 10_000_000_000
SLOS = parse_slos("ttft_p99_ms=500,itl_p99_ms=50")


def records(trial: int, n: int = 12) -> list[RequestRecord]:
    """`n` requests 100 ms apart, each with every kind of figure in it: reasoning then answer tokens, a schedule
    (client lag), cached prompt tokens, a conversation turn, 0, 1 or 2 images, tool calls (every other request)
    and an answer judged against a schema."""
    out = []
    for i in range(n):
        send = T0 + i * 100 * MS
        kinds = ["reasoning", "reasoning", "answer", "answer", "answer"]
        events = [TokenEvent(t_ns=send + (20 + 5 * j) * MS, kind=kind, tokens=1, text="x")
                  for j, kind in enumerate(kinds)]
        out.append(RequestRecord(
            index=i, trial=trial, tag="c2", endpoint="/v1/chat/completions", t_send_ns=send,
            scheduled_ns=send - MS, t_end_ns=events[-1].t_ns + MS, events=events, count_method="server_per_chunk",
            chunks=len(events), saw_done=True, ok=True, finish_reason="stop", input_tokens=100,
            conversation=i // 3, turn=i % 3 + 1, images=i % 3, image_pixels=i % 3 * 224 * 224,
            tool_calls=[ToolCall(index=0, name="f", arguments="{}")] if i % 2 else [], tools_declared=True,
            t_first_tool_ns=send + 25 * MS if i % 2 else None, t_tool_done_ns=send + 40 * MS if i % 2 else None,
            tool_calls_parse=True if i % 2 else None, tool_calls_valid=i % 4 == 1 if i % 2 else None,
            schema_valid=i % 3 == 0,
            usage=Usage(prompt_tokens=100, completion_tokens=len(events), cached_tokens=80 if i % 2 else 10)))
    return out


def level(trial: int):
    rs = records(trial)
    window = (T0, max(r.t_end_ns for r in rs))
    return summarize(rs, tag="c2", mode="concurrency", concurrency=2, window=window, slos=SLOS), rs


def test_summarize_makes_the_figures_of_the_table_in_its_order_each_with_its_unit_and_anchor() -> None:
    summary, _ = level(0)
    # a streamed level: every figure but those of non-streamed requests (tests/test_bench_unary.py has those)
    assert list(summary.figures) == [f.key for f in LEVEL_FIGURES if f.applies != "unary"]
    for key, fig in summary.figures.items():
        spec = FIGURES[key]
        assert (fig.unit, fig.definition) == (spec.unit, spec.definition)
        if spec.headline is not None and fig.dist is not None:
            assert fig.value == getattr(fig.dist, spec.headline)
        if not spec.counts_tokens:
            assert fig.counted_by is None


def test_a_plain_level_makes_only_figures_of_the_table() -> None:
    rs = [r.model_copy(update={"scheduled_ns": None, "usage": None, "turn": None, "conversation": None})
          for r in records(0)]
    summary = summarize(rs, tag="c1", mode="concurrency", concurrency=1, window=(T0, T0 + 2_000 * MS))
    assert set(summary.figures) <= set(FIGURES)
    assert not {"client_lag_ms", "goodput_req_s", "slo_attainment", "cache_hit_ratio"} & set(summary.figures)


def test_every_figure_of_the_table_has_its_function_and_no_function_lacks_a_figure() -> None:
    assert metrics.MEASURES.keys() == FIGURES.keys()


def test_every_window_rate_pools_across_trials_to_a_number() -> None:
    levels, tally = [], LevelTally(keep=False, count_window=False)
    for trial in (0, 1):
        summary, rs = level(trial)
        apply(summary, judge(rs, (T0, max(r.t_end_ns for r in rs)), SteadyRule(min_completed=5),
                             ended_by="steady"))
        assert summary.steady.measured
        levels.append(summary)
        tally.extend(rs)
    pooled = pool_level(levels, tally, [0, 1])
    rates = [f.key for f in LEVEL_FIGURES if f.pooling is Pooling.WINDOW_RATE and f.applies != "unary"]
    assert rates and set(rates) == set(AGGREGATE_KEYS) - {f.key for f in LEVEL_FIGURES if f.applies == "unary"}
    for key in rates:
        value = pooled.figures[key].value
        assert isinstance(value, float) and math.isfinite(value), key
        assert value == sum(s.figures[key].value * s.window_s for s in levels) / sum(s.window_s for s in levels)
    # what pools from the requests is recomputed over both trials together
    for key in ("ttft_ms", "itl_ms", "reasoning_share", "cache_hit_ratio"):
        assert pooled.figures[key].value is not None, key
    assert pooled.figures["ttft_ms"].dist.n == sum(s.figures["ttft_ms"].dist.n for s in levels)


def test_a_level_not_measured_withholds_exactly_the_window_rates() -> None:
    summary, rs = level(0)
    before = {k: f.value for k, f in summary.figures.items()}
    apply(summary, judge(rs, (T0, max(r.t_end_ns for r in rs)), SteadyRule(), ended_by="cap"))
    assert not summary.steady.measured
    assert set(WITHHELD_KEYS) == {f.key for f in LEVEL_FIGURES if f.pooling is Pooling.WINDOW_RATE}
    for key, fig in summary.figures.items():
        assert (fig.value is None) == (key in WITHHELD_KEYS), key
        if key not in WITHHELD_KEYS:
            assert fig.value == before[key]


def test_every_definition_anchor_is_on_the_metrics_page() -> None:
    page = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    missing = [f.key for f in LEVEL_FIGURES if f'<a id="{f.definition}"></a>' not in page]
    assert not missing


def test_levels_csv_has_each_figure_s_columns_at_a_position_of_its_own() -> None:
    positions = [f.csv.position for f in LEVEL_FIGURES + GPU_FIGURES if f.csv is not None]
    assert sorted(positions) == list(range(1, len(positions) + 1))
    for f in LEVEL_FIGURES:
        if f.csv is None:
            continue
        columns = [f"{f.key}_{stat}" for stat in STATS] if f.csv.stats else [f.key]
        at = CSV_COLUMNS.index(columns[0])
        assert CSV_COLUMNS[at:at + len(columns)] == columns
    # a later figure's columns come after an earlier one's
    firsts = [CSV_COLUMNS.index(f.key if not f.csv.stats else f"{f.key}_n")
              for f in sorted((f for f in LEVEL_FIGURES if f.csv), key=lambda f: f.csv.position)]
    assert firsts == sorted(firsts)


def test_the_terminal_level_table_keeps_its_columns() -> None:
    assert [c.header for c in TERMINAL_COLUMNS] == [
        "level", "ok/sent", "output\ntok/s", "req/s", "decode\ntok/s p50", "TTFT\nms p50", "TTFT\nms p99",
        "ITL\nms p50", "ITL\nms p99", "E2E\nms p50"]


def test_compare_can_read_a_headline_figure_s_unit_and_direction() -> None:
    assert (lookup("single.ttft_ms").unit, lookup("single.ttft_ms").higher_is_better) == ("ms", False)
    assert (lookup("peak.output_tok_s").unit, lookup("peak.output_tok_s").higher_is_better) == ("tok/s", True)
    assert lookup("slo.goodput_req_s").key == "goodput_req_s"
    assert lookup("reasoning_share").higher_is_better is None
    assert lookup("peak.concurrency") is None and lookup("multiturn.late_ttft_ms") is None


FIGURE_MODULES = {f"servelab.bench.{m}" for m in ("figures", "request_figures", "sketch", "tally", "metrics", "slo",
                                                   "failures", "cache_figures", "steady")}


def test_the_figure_modules_import_each_other_without_a_circle() -> None:
    graph = import_graph()
    inside = {m: graph[m] & FIGURE_MODULES for m in FIGURE_MODULES}
    assert not strongly_connected(inside)
    below = {"servelab.bench.request_figures": {"servelab.bench.sketch"}, "servelab.bench.figures": set()}
    for module, allowed in below.items():
        assert inside[module] <= allowed, module  # the bottom of the figures: below the tally and metrics


def test_no_figure_module_imports_another_s_private_names() -> None:
    found = []
    for module in FIGURE_MODULES:
        path = ROOT / (module.replace(".", "/") + ".py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("servelab"):
                found += [f"{module}: {node.module}.{a.name}" for a in node.names
                          if re.match(r"_[a-z]", a.name)]
    assert not found
