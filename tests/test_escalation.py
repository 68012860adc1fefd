"""The one stop rule of the concurrency sweep and the rate ramp (bench/modes/escalation.py): run levels until
throughput stops growing, with a stated patience."""

from __future__ import annotations

from types import SimpleNamespace

from servelab.bench.modes.escalation import Escalation


def level(tput: float, *, concurrency: int = 1, rate: float | None = None, ok: int = 10, failed: int = 0):
    return SimpleNamespace(figures={"output_tok_s": SimpleNamespace(value=tput)}, concurrency=concurrency, rate=rate,
                           ok=ok, failed=failed, steady=None, slo=None)


def ladder(**kw) -> Escalation:
    return Escalation(min_gain=0.03, patience=2, where=lambda s: f"{s.rate:g} req/s",
                      higher="a higher rate would not be either", **kw)


def test_one_flat_level_is_not_a_plateau_two_are() -> None:
    rule = ladder()
    assert rule.stop_reason(level(100, rate=1)) is None
    assert rule.stop_reason(level(101, rate=2)) is None  # flat once: patience 2 waits
    assert rule.stop_reason(level(150, rate=4)) is None  # growth resets the count
    assert rule.stop_reason(level(151, rate=8)) is None  # flat again (but the best so far)
    reason = rule.stop_reason(level(149, rate=16))
    assert reason == "output tok/s stopped growing: 2 level(s) up to 16 req/s were not 3% above 151.0 at 8 req/s"


def test_patience_one_stops_at_the_first_flat_level() -> None:
    rule = Escalation(min_gain=0.03, patience=1, where=lambda s: f"concurrency {s.concurrency}",
                      higher="a higher concurrency would be slower still")
    assert rule.stop_reason(level(100, concurrency=1)) is None
    assert rule.stop_reason(level(100, concurrency=2)).startswith("output tok/s stopped growing: 1 level(s)")


def test_failures_stop_even_a_listed_ladder_and_nothing_else_does() -> None:
    rule = ladder(fixed=True)
    assert rule.stop_reason(level(100, rate=1)) is None
    assert rule.stop_reason(level(50, rate=2)) is None and rule.stop_reason(level(40, rate=4)) is None
    assert rule.stop_reason(level(0, rate=8, ok=1, failed=3)) == "more than half the requests failed at 8 req/s"


def unary(items_s: float, *, concurrency: int):
    """A non-streamed level (embeddings, rerank): items/s and no output tok/s figure at all."""
    return SimpleNamespace(figures={"items_s": SimpleNamespace(value=items_s)}, concurrency=concurrency, rate=None,
                           ok=10, failed=0, steady=None, slo=None)


def test_a_non_streamed_ladder_climbs_on_items_per_second() -> None:
    rule = Escalation(min_gain=0.03, patience=1, where=lambda s: f"concurrency {s.concurrency}",
                      higher="a higher concurrency would be slower still")
    assert rule.stop_reason(unary(40, concurrency=1)) is None
    assert rule.stop_reason(unary(70, concurrency=2)) is None  # growth: the best is now c2
    assert rule.stop_reason(unary(71, concurrency=4)) == \
        "items/s stopped growing: 1 level(s) up to concurrency 4 were not 3% above 70.0 at concurrency 2"
