"""Latency targets, goodput and SLO attainment on hand-made records whose answers are known; the SLO search's
bracketing and bisection against a fake capacity."""

from __future__ import annotations

import asyncio

import pytest

from servelab.bench.loads.search import SearchSpace, round_rate, search_max_load
from servelab.bench.metrics import goodput, summarize
from servelab.bench.slo import level_verdict, parse_slos, request_meets
from servelab.errors import UserError
from servelab.records import RequestRecord, TokenEvent, Usage

MS = 1_000_000


def rec(index: int, send_ms: float, ttft_ms: float, itl_ms: float = 10, tokens: int = 5, ok: bool = True,
        warmup: bool = False, **kw) -> RequestRecord:
    """A request with `tokens` one-token events: the first at ttft, then one every itl; ends at the last."""
    t0 = send_ms + ttft_ms
    events = [TokenEvent(t_ns=int((t0 + i * itl_ms) * MS), tokens=1, kind="answer") for i in range(tokens)] \
        if ok else []
    end = t0 + (tokens - 1) * itl_ms
    return RequestRecord(index=index, endpoint="/v1/chat/completions", t_send_ns=int(send_ms * MS),
                         t_end_ns=int(end * MS), events=events, ok=ok, warmup=warmup,
                         error_kind=None if ok else "http", count_method="server_per_chunk",
                         usage=Usage(completion_tokens=tokens) if ok else None, **kw)


def test_parse_slos() -> None:
    slos = parse_slos("ttft_p99_ms=500, itl_p50_ms=20.5,e2e_max_ms=9000")
    assert [(s.quantity, s.stat, s.limit_ms) for s in slos] == [("ttft", "p99", 500.0), ("itl", "p50", 20.5),
                                                                 ("e2e", "max", 9000.0)]
    assert parse_slos("") == [] and parse_slos(None) == []
    for bad in ("ttft_p99=500", "latency_p99_ms=5", "ttft_p99_ms=fast", "ttft_p99_ms=0", "ttft_p42_ms=5"):
        with pytest.raises(UserError):
            parse_slos(bad)


def test_request_meets_every_target_or_not() -> None:
    slos = parse_slos("ttft_p99_ms=100,itl_max_ms=15,e2e_p99_ms=200")
    assert request_meets(rec(0, 0, ttft_ms=50, itl_ms=10), slos)  # ttft 50, itl 10, e2e 90
    assert not request_meets(rec(0, 0, ttft_ms=150), slos)  # ttft over
    assert not request_meets(rec(0, 0, ttft_ms=50, itl_ms=20), slos)  # its own max gap over
    assert not request_meets(rec(0, 0, ttft_ms=50, itl_ms=14, tokens=12), slos)  # e2e 50 + 154 > 200
    assert not request_meets(rec(0, 0, ttft_ms=1, ok=False), slos)  # a failure meets nothing
    # One token: no gap can break an ITL target, and TTFT/E2E are still judged.
    assert request_meets(rec(0, 0, ttft_ms=50, tokens=1), parse_slos("itl_p99_ms=1,ttft_p99_ms=60"))


def test_goodput_counts_requests_that_met_every_target_and_ended_inside_the_window() -> None:
    slos = parse_slos("ttft_p99_ms=100")
    records = [
        rec(0, 0, ttft_ms=10, warmup=True),  # warm-up: never counted
        rec(1, 0, ttft_ms=50),  # good, ends at 90 ms
        rec(2, 100, ttft_ms=60),  # good, ends at 200 ms
        rec(3, 200, ttft_ms=150),  # too slow
        rec(4, 300, ttft_ms=20, ok=False),  # failed
        rec(5, 1900, ttft_ms=80),  # good but ends at 2020 ms, after the window
    ]
    rate, attainment = goodput(records, slos, window=(0, 2000 * MS))
    assert rate == pytest.approx(2 / 2.0)  # requests 1 and 2, over a 2 s window
    assert attainment == pytest.approx(3 / 5)  # 1, 2 and 5 of the five measured requests
    level = summarize(records, tag="r1", mode="rate", concurrency=0, window=(0, 2000 * MS), slos=slos)
    assert level.figures["goodput_req_s"].value == pytest.approx(1.0)
    assert level.figures["slo_attainment"].value == pytest.approx(0.6)
    assert level.figures["goodput_req_s"].definition == "goodput"
    assert level.figures["goodput_req_s"].note == "ttft_p99_ms=100"
    plain = summarize(records, tag="r1", mode="rate", concurrency=0, window=(0, 2000 * MS))
    assert "goodput_req_s" not in plain.figures  # only with targets
    assert plain.figures.keys() <= level.figures.keys()


def test_level_verdict_counts_failures_as_infinitely_slow() -> None:
    slos = parse_slos("ttft_p50_ms=100")
    fast = [rec(i, 0, ttft_ms=10) for i in range(3)]
    failed = [rec(10 + i, 0, ttft_ms=10, ok=False) for i in range(3)]
    assert level_verdict(fast, slos)["passed"]
    # Half the requests failed: the ok ones alone have p50 10 ms, but counted as infinite the failures push the
    # median past any limit. Leaving failures out of the distribution would make this level look fine.
    verdict = level_verdict(fast + failed, slos)
    assert not verdict["passed"] and verdict["targets"]["ttft_p50_ms"]["observed_ms"] is None
    assert level_verdict(fast + failed[:1], slos)["passed"]  # 1 of 4 failed: p50 is still 10 ms
    assert not level_verdict([], slos)["passed"]  # no requests: nothing shows the targets were met
    one = level_verdict([rec(0, 0, ttft_ms=10, itl_ms=30)], parse_slos("itl_p99_ms=20"))
    assert one["targets"]["itl_p99_ms"]["observed_ms"] == pytest.approx(30) and not one["passed"]


# ---- the search, with a fake capacity ---------------------------------------------------------------------

def run_search(capacity: float, space: SearchSpace, seen: list[float] | None = None):
    """Search against a server whose levels pass exactly up to `capacity`."""
    seen = [] if seen is None else seen

    async def probe(load: float) -> bool:
        seen.append(load)
        return load <= capacity

    return asyncio.run(search_max_load(probe, space))


@pytest.mark.parametrize("capacity", [3, 7, 13, 40])
def test_concurrency_search_finds_the_exact_capacity(capacity: int) -> None:
    seen: list[float] = []
    out = run_search(capacity, SearchSpace("concurrency", start=1, maximum=64, max_probes=12), seen)
    assert out.best == capacity and out.lowest_failing == capacity + 1
    assert len(seen) == len(set(seen)) <= 12  # never the same level twice
    assert "bracketed" in out.stop_reason


@pytest.mark.parametrize("capacity", [0.7, 20.0, 55.0])
def test_rate_search_brackets_the_capacity_within_tolerance(capacity: float) -> None:
    out = run_search(capacity, SearchSpace("rate", start=4, maximum=512, tolerance=0.1, max_probes=12))
    assert out.best <= capacity < out.lowest_failing
    assert out.lowest_failing / out.best <= 1.1 + 0.01  # within tolerance (plus rounding to 3 figures)


def test_search_stops_at_the_budget_and_at_the_edges() -> None:
    out = run_search(1e9, SearchSpace("rate", start=1, maximum=16))
    assert out.best == 16 and out.lowest_failing is None and "highest load allowed" in out.stop_reason
    out = run_search(0, SearchSpace("concurrency", start=8, maximum=64))
    assert out.best is None and out.lowest_failing == 1 and "lowest load" in out.stop_reason
    out = run_search(1e9, SearchSpace("rate", start=1, maximum=1e6, max_probes=3))
    assert [p for p, _ in out.probes] == [1, 2, 4] and "budget" in out.stop_reason


def test_round_rate_keeps_three_significant_figures() -> None:
    assert round_rate(13.4567) == 13.5 and round_rate(0.012345) == 0.0123 and round_rate(1234.5) == 1230
