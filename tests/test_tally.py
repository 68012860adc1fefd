"""Issue 14: a level's figures in bounded memory give the numbers the all-in-memory code gave.

The oracle is tests/reference_metrics.py, bench/metrics.py as it was before the tally (every record and every
event in memory). Records are drawn with a known gap distribution (log-normal ITL, events of 1-3 tokens,
reasoning then answer, failures, cancellations, open-loop schedules, usage that disagrees) and summarised
both ways: from a list, and folded one at a time while the window is still open, as a running level does.
"""

from __future__ import annotations

import math
import random

import pytest

from servelab.bench import metrics
from servelab.bench.sketch import RELATIVE_ACCURACY, Samples, percentile
from servelab.bench.slo import level_verdict, parse_slos
from servelab.bench.steady import SteadyRule, judge
from servelab.bench.tally import LevelTally
from servelab.records import RequestRecord, TokenEvent, Usage
from tests import reference_metrics as reference

MS = 1_000_000


def draw_records(n: int, seed: int, start_ns: int = 10**12) -> list[RequestRecord]:
    rng = random.Random(seed)
    records = []
    for i in range(n):
        send = start_ns + int(rng.uniform(0, 20_000) * MS)
        t = send + int(rng.lognormvariate(math.log(40), 0.5) * MS)
        events = []
        reasoning = rng.random() < 0.3
        for k in range(rng.randint(0, 40)):
            kind = "reasoning" if reasoning and k < 8 else "answer"
            events.append(TokenEvent(t_ns=t, kind=kind, tokens=rng.choice([1, 1, 1, 2, 3]), text=f"w{k} "))
            t += int(rng.lognormvariate(math.log(12), 0.6) * MS)
        fate = rng.random()
        ok = fate > 0.12
        cancelled = 0.06 < fate <= 0.12
        output = sum(e.tokens for e in events)
        usage = Usage(prompt_tokens=rng.choice([100, 100, 99]), completion_tokens=output + rng.choice([0, 0, 0, 1]))
        records.append(RequestRecord(
            index=i, tag="c8", endpoint="/v1/chat/completions", t_send_ns=send,
            scheduled_ns=send - int(rng.uniform(0, 3) * MS) if i % 2 else None,
            t_end_ns=(t if events else send + 5 * MS) if not cancelled else None,
            events=events, count_method=rng.choice(["server_per_chunk"] * 5 + ["client_tokenizer"]),
            ok=ok, error_kind=None if ok else ("cancelled" if cancelled else rng.choice(["http", "timeout_idle"])),
            error_detail=None if ok else f"HTTP {rng.choice([500, 503])}: boom", input_tokens=100,
            usage=usage if ok else None, max_tokens=40, finish_reason="length",
            sampling={"temperature": 0.0, "ignore_eos": bool(i % 3), "min_tokens": 5}))
    records.sort(key=lambda r: r.t_end_ns or r.t_send_ns)  # folded in the order they finish
    return records


def same_figures(new, old) -> None:
    assert (new.requests, new.ok, new.failed, new.cancelled, new.errors) == \
        (old.requests, old.ok, old.failed, old.cancelled, old.errors)
    assert new.window_s == old.window_s
    assert new.warnings == old.warnings
    for key, fig in old.figures.items():
        assert new.figures[key].model_dump() == fig.model_dump(), key


WINDOWS = [(10**12, 10**12 + 30_000 * MS), (10**12 + 2_000 * MS, 10**12 + 9_000 * MS), (0, 0)]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("window", WINDOWS)
def test_figures_from_a_list_equal_the_all_in_memory_code(seed, window) -> None:
    records = draw_records(300, seed)
    slos = parse_slos("ttft_p90_ms=80,itl_p99_ms=40")
    old = reference.summarize(records, tag="c8", mode="concurrency", concurrency=8, window=window, slos=slos)
    new = metrics.summarize(records, tag="c8", mode="concurrency", concurrency=8, window=window, slos=slos)
    same_figures(new, old)


@pytest.mark.parametrize("seed", [4, 5])
def test_a_level_folded_as_it_runs_gives_the_same_figures(seed) -> None:
    """Records folded one at a time while the window is open, with the floor a LevelControl gives (the latest
    send so far: the window never ends before it), and the window's end decided only at the end."""
    records = draw_records(400, seed)
    start = 10**12
    window = (start, start + 14_000 * MS)  # cuts through requests still streaming
    latest_send = [start]
    tally = LevelTally(window_start_ns=start, floor=lambda: latest_send[0], keep=False,
                       slos=parse_slos("e2e_p99_ms=900"))
    for r in records:
        # by the time a record finishes, every request sent before its end has been sent; the floor never
        # passes the window's end (sends stop by then)
        latest_send[0] = min(max(latest_send[0], max(x.t_send_ns for x in records
                                                       if x.t_send_ns <= (r.t_end_ns or r.t_send_ns))),
                             window[1])
        tally.append(r)
    assert tally.folded_events > 0 and len(tally._pending_t) < sum(len(r.events) for r in records)
    old = reference.summarize(records, tag="c8", mode="concurrency", concurrency=8, window=window,
                              slos=parse_slos("e2e_p99_ms=900"))
    new = metrics.summarize(tally, tag="c8", mode="concurrency", concurrency=8, window=window,
                            slos=parse_slos("e2e_p99_ms=900"))
    same_figures(new, old)
    # the steady-state judgement and the SLO verdict read the same tally
    rule = SteadyRule()
    assert judge(tally, window, rule, ended_by="steady") == judge(records, window, rule, ended_by="steady")
    assert level_verdict(tally, parse_slos("e2e_p99_ms=900")) == level_verdict(records, parse_slos("e2e_p99_ms=900"))


def test_the_tally_keeps_no_record_and_no_event_object() -> None:
    records = draw_records(200, 6)
    tally = LevelTally(window_start_ns=10**12, floor=lambda: 2**62, keep=False)
    for r in records:
        tally.append(r)
    assert tally.records is None and not tally._pending_t  # everything folded: nothing waits for the window
    with pytest.raises(TypeError):
        list(tally)
    assert len(tally) == 200


def test_past_the_exact_limit_percentiles_are_within_the_stated_error() -> None:
    """A known distribution (log-normal gaps, events of 1-3 tokens) through the exact path and the sketch."""
    rng = random.Random(7)
    exact = Samples()
    sketched = Samples(exact_limit=1000)
    values = []
    for _ in range(60_000):
        gap, k = rng.lognormvariate(math.log(10), 0.8), rng.choice([1, 1, 2, 3])
        exact.add(gap / k, k)
        sketched.add(gap / k, k)
        values.extend([gap / k] * k)
    assert not exact.sketched and sketched.sketched
    values.sort()
    d_exact, d_sketch = exact.distribution(), sketched.distribution()
    assert (d_sketch.n, d_sketch.min, d_sketch.max) == (d_exact.n, d_exact.min, d_exact.max)
    assert d_sketch.mean == pytest.approx(d_exact.mean, rel=1e-9)
    for q in (50, 90, 95, 99):
        lower = values[math.floor((len(values) - 1) * q / 100)]  # the sample at the quantile's rank
        got = getattr(d_sketch, f"p{q}")
        assert abs(got - lower) <= RELATIVE_ACCURACY * lower * 1.0001, (q, got, lower)
        assert getattr(d_exact, f"p{q}") == percentile(values, q)
    # infinite samples (failed requests against an ITL target) sort last, in both
    assert exact.quantile(99.5, extra_infinite=2000) == math.inf == sketched.quantile(99.5, extra_infinite=2000)
    with_failures = sorted(values + [math.inf] * 2000)
    assert exact.quantile(50, extra_infinite=2000) == percentile(with_failures, 50)
    assert sketched.quantile(50, extra_infinite=2000) == pytest.approx(percentile(with_failures, 50),
                                                                        rel=RELATIVE_ACCURACY * 1.01)


def test_a_sketched_level_says_so_on_its_figure() -> None:
    records = draw_records(50, 8)
    tally = LevelTally.from_records([])
    tally.itl = Samples(exact_limit=10)
    for r in records:
        tally.append(r)
    s = metrics.summarize(tally, tag="c8", mode="concurrency", concurrency=8, window=(0, 0))
    assert "DDSketch" in s.figures["itl_ms"].note and "exact" in s.figures["itl_ms"].note
    assert s.figures["ttft_ms"].note is None  # per-request figures stay exact


@pytest.mark.parametrize("limit", [10**6, 50])  # exact, and past the limit (the sketch)
def test_adding_samples_in_bulk_equals_adding_them_one_by_one(limit: int) -> None:
    import math
    import random

    from servelab.bench.sketch import Samples

    rng = random.Random(3)
    one, bulk = Samples(exact_limit=limit), Samples(exact_limit=limit)
    for _ in range(40):
        values = [rng.lognormvariate(2, 1) for _ in range(rng.randint(0, 9))]
        counts = [rng.choice([1, 1, 2, 3]) for _ in values]
        if rng.random() < 0.1 and values:
            values[0] = math.inf  # a failed request counted against a target
        if rng.random() < 0.1 and counts:
            counts[-1] = 0
        plain = rng.random() < 0.5
        for v, c in zip(values, counts):
            one.add(v, 1 if plain else c)
        bulk.add_all(values, None if plain else counts)
    assert (bulk.n, bulk.infinite, bulk.sketched) == (one.n, one.infinite, one.sketched)
    assert bulk.distribution().model_dump() == pytest.approx(one.distribution().model_dump())
    for q in (0, 50, 90, 99, 100):
        assert bulk.quantile(q) == pytest.approx(one.quantile(q))
