"""Open-loop send schedules: the right mean rate and burstiness, bounded, and reproducible from the seed."""

from __future__ import annotations

import statistics

import pytest

from servelab.bench.loads.arrivals import NS_PER_S, schedule_ns
from servelab.errors import UserError

N = 20_000


def intervals_s(offsets: list[int]) -> list[float]:
    return [(b - a) / NS_PER_S for a, b in zip(offsets, offsets[1:])]


def cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.fmean(xs)


@pytest.mark.parametrize("arrival,burstiness,want_cv", [
    ("poisson", 1.0, 1.0),
    ("gamma", 1.0, 1.0),  # burstiness 1 is Poisson
    ("gamma", 0.25, 2.0),  # CV = 1/sqrt(shape): burstier
    ("gamma", 4.0, 0.5),  # more regular
    ("constant", 1.0, 0.0),
])
def test_mean_rate_and_burstiness(arrival: str, burstiness: float, want_cv: float) -> None:
    rate = 40.0
    offsets = schedule_ns(rate=rate, arrival=arrival, burstiness=burstiness, seed=7, count=N)
    gaps = intervals_s(offsets)
    assert offsets[0] == 0 and len(offsets) == N
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.04)  # ~5 sigma at CV 2 over 20k samples
    assert cv(gaps) == pytest.approx(want_cv, abs=0.06)


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    a = schedule_ns(rate=10, arrival="poisson", seed=1, count=50)
    assert a == schedule_ns(rate=10, arrival="poisson", seed=1, count=50)
    assert a != schedule_ns(rate=10, arrival="poisson", seed=2, count=50)


def test_bounded_by_count_duration_or_whichever_comes_first() -> None:
    assert len(schedule_ns(rate=100, arrival="constant", count=7)) == 7
    by_time = schedule_ns(rate=100, arrival="constant", duration_s=0.5)
    assert len(by_time) == 50 and by_time[-1] < 0.5 * NS_PER_S  # offsets 0, 10 ms, ..., 490 ms
    assert len(schedule_ns(rate=100, arrival="constant", count=10, duration_s=0.5)) == 10
    assert len(schedule_ns(rate=100, arrival="constant", count=1000, duration_s=0.5)) == 50
    poisson = schedule_ns(rate=100, arrival="poisson", seed=3, duration_s=2.0)
    assert all(t < 2 * NS_PER_S for t in poisson) and 150 < len(poisson) < 250


@pytest.mark.parametrize("kwargs,needle", [
    ({"rate": 0, "count": 5}, "rate must be positive"),
    ({"rate": 5}, "request count, a duration"),
    ({"rate": 5, "count": 0}, "must be positive"),
    ({"rate": 5, "count": 5, "arrival": "gamma", "burstiness": 0}, "burstiness"),
    ({"rate": 5, "count": 5, "arrival": "uniform"}, "unknown arrival"),
])
def test_bad_schedules_are_user_errors(kwargs: dict, needle: str) -> None:
    with pytest.raises(UserError, match=needle):
        schedule_ns(**kwargs)
