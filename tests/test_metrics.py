"""Figures computed from hand-made RequestRecords whose true values are known."""

from __future__ import annotations

import math

import pytest

from servelab.bench.metrics import (chunk_gaps_ms, decode_tok_s, distribution, percentile, summarize,
                                    token_gaps_ms, tpot_ms, ttfo_ns, ttft_ns)
from servelab.records import RequestRecord, TokenEvent, Usage

MS = 1_000_000


def record(index: int, send_ms: float, events: list[tuple[float, int, str]], end_ms: float | None = None,
           ok: bool = True, usage: int | None = None, **kw) -> RequestRecord:
    evs = [TokenEvent(t_ns=int(t * MS), tokens=k, kind=kind, text="x" * k) for t, k, kind in events]
    return RequestRecord(index=index, endpoint="/v1/chat/completions", t_send_ns=int(send_ms * MS),
                         t_end_ns=int((end_ms if end_ms is not None else events[-1][0]) * MS), events=evs, ok=ok,
                         count_method="server_per_chunk",
                         usage=Usage(completion_tokens=usage) if usage is not None else None, **kw)


def test_percentile_matches_linear_interpolation() -> None:
    v = [1.0, 2.0, 3.0, 4.0]
    assert percentile(v, 0) == 1.0 and percentile(v, 100) == 4.0
    assert percentile(v, 50) == pytest.approx(2.5)
    assert percentile(v, 90) == pytest.approx(3.7)
    assert math.isnan(percentile([], 50))
    d = distribution(range(1, 101))
    assert d.n == 100 and d.p50 == pytest.approx(50.5) and d.p99 == pytest.approx(99.01) and d.max == 100


def test_single_request_latencies() -> None:
    # Sent at 0; first token at 100 ms; then one token every 10 ms: 11 tokens in all, last at 200 ms.
    r = record(0, 0, [(100 + 10 * i, 1, "answer") for i in range(11)], end_ms=201)
    assert ttft_ns(r) == 100 * MS
    assert ttfo_ns(r) == 100 * MS
    assert decode_tok_s(r) == pytest.approx(100.0)  # 10 tokens after the first, over 100 ms
    assert tpot_ms(r) == pytest.approx(10.0)
    assert token_gaps_ms(r) == pytest.approx([10.0] * 10)


def test_multi_token_events_give_per_token_gaps_not_per_chunk() -> None:
    # Events of 4 tokens every 40 ms: the token ITL is 10 ms (4 samples per event), the chunk ITL 40 ms.
    r = record(0, 0, [(50, 4, "answer"), (90, 4, "answer"), (130, 4, "answer")])
    assert token_gaps_ms(r) == pytest.approx([10.0] * 8)
    assert chunk_gaps_ms(r) == pytest.approx([40.0, 40.0])
    assert decode_tok_s(r) == pytest.approx(8 / 0.080)


def test_reasoning_tokens_count_for_ttft_but_not_ttfo() -> None:
    r = record(0, 0, [(30, 1, "reasoning"), (40, 1, "reasoning"), (55, 1, "answer"), (60, 1, "answer")])
    assert ttft_ns(r) == 30 * MS
    assert ttfo_ns(r) == 55 * MS
    assert r.reasoning_tokens == 2 and r.answer_tokens == 2 and r.output_tokens == 4


def test_empty_events_do_not_move_ttft() -> None:
    r = record(0, 0, [(20, 0, "answer"), (35, 1, "answer"), (45, 1, "answer")])
    assert ttft_ns(r) == 35 * MS
    assert chunk_gaps_ms(r) == pytest.approx([10.0])


def test_aggregate_throughput_counts_only_tokens_inside_the_window() -> None:
    # Two streams, 10 tokens each, 1 token per 100 ms starting at 100 ms (tokens at 100..1000 ms).
    a = record(0, 0, [(100 * (i + 1), 1, "answer") for i in range(10)])
    b = record(1, 0, [(100 * (i + 1), 1, "answer") for i in range(10)])
    s = summarize([a, b], tag="c2", mode="concurrency", concurrency=2, window=(0, 500 * MS))
    # 5 tokens per stream fall inside [0, 500 ms]: 10 tokens / 0.5 s.
    assert s.figures["output_tok_s"].value == pytest.approx(20.0)
    assert s.figures["request_s"].value == 0  # neither finished inside the window
    assert s.window_s == pytest.approx(0.5)
    full = summarize([a, b], tag="c2", mode="concurrency", concurrency=2, window=(0, 1000 * MS))
    assert full.figures["output_tok_s"].value == pytest.approx(20.0)
    assert full.figures["request_s"].value == pytest.approx(2.0)


def test_failed_and_warmup_requests_are_excluded_and_counted() -> None:
    good = record(0, 0, [(10, 1, "answer"), (20, 1, "answer")])
    warm = record(1, 0, [(10, 1, "answer"), (20, 1, "answer")], warmup=True)
    bad = record(2, 0, [(10, 1, "answer")], ok=False, error_kind="timeout_idle")
    s = summarize([good, warm, bad], tag="x", mode="single", concurrency=1, window=(0, 20 * MS))
    assert (s.requests, s.ok, s.failed) == (2, 1, 1)
    assert s.errors == {"timeout_idle": 1}
    assert s.figures["ttft_ms"].dist.n == 1
    assert any("failed" in w for w in s.warnings)


def test_itl_distribution_is_over_all_gaps_not_per_request_means() -> None:
    # One request with a single 500 ms stall among 99 gaps of 10 ms: p99 of all gaps must show the stall's
    # neighbourhood, whereas a mean of per-request means would report ~15 ms.
    times = [0.0]
    for i in range(99):
        times.append(times[-1] + (500 if i == 50 else 10))
    r = record(0, 0, [(100 + t, 1, "answer") for t in times])
    s = summarize([r], tag="single", mode="single", concurrency=1, window=(0, int(times[-1] + 200) * MS))
    itl = s.figures["itl_ms"].dist
    assert itl.n == 99 and itl.max == pytest.approx(500) and itl.p50 == pytest.approx(10)


def test_usage_mismatch_and_ignored_length_are_flagged() -> None:
    r1 = record(0, 0, [(10, 1, "answer"), (20, 1, "answer")], usage=3)
    r2 = record(1, 0, [(10, 1, "answer"), (20, 1, "answer")], usage=2, max_tokens=5,
                sampling={"ignore_eos": True})
    s = summarize([r1, r2], tag="x", mode="single", concurrency=1, window=(0, 20 * MS))
    text = " ".join(s.warnings)
    assert "differs from the server's usage" in text and "request 0" in text
    assert "did not produce the requested max_tokens" in text and "request 1" in text


def test_counting_method_is_labelled() -> None:
    r = record(0, 0, [(10, 1, "answer"), (20, 1, "answer")])
    r2 = r.model_copy(update={"count_method": "chunk_count", "index": 1})
    s = summarize([r, r2], tag="x", mode="single", concurrency=1, window=(0, 20 * MS))
    assert s.figures["output_tok_s"].counted_by == "mixed"
    s = summarize([r2], tag="x", mode="single", concurrency=1, window=(0, 20 * MS))
    assert s.figures["output_tok_s"].counted_by == "chunk_count"
    assert any("one per SSE chunk" in w for w in s.warnings)
