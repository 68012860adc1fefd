"""When an open-loop load sends each request: the whole schedule, computed before the first send.

Precomputing the schedule from a seeded RNG makes a run reproducible (same seed, same send times) and keeps the
sender's loop down to "sleep until the next absolute target, hand the request to a task". Intervals are never
rescaled to hit an exact total duration (vLLM does that); the schedule is the process it claims to be.

Arrival processes, all with mean interval 1/rate:
- poisson: exponential intervals (coefficient of variation 1).
- gamma: intervals Gamma(shape=burstiness, scale=1/(rate*burstiness)); CV = 1/sqrt(burstiness). burstiness 1.0 is
  Poisson, < 1 burstier, > 1 more regular. Same parametrisation as vLLM's `--burstiness`.
- constant: every interval exactly 1/rate.
The first request is scheduled at offset 0; a schedule ends at `count` requests or before `duration_s`, whichever
comes first.
"""

from __future__ import annotations

import random
from typing import Literal

from servelab.errors import UserError

Arrival = Literal["poisson", "gamma", "constant"]
ARRIVALS: tuple[Arrival, ...] = ("poisson", "gamma", "constant")
NS_PER_S = 1_000_000_000


def intervals_s(rate: float, arrival: Arrival, burstiness: float, rng: random.Random):
    """An endless stream of inter-arrival times in seconds."""
    if arrival == "constant":
        while True:
            yield 1.0 / rate
    elif arrival == "poisson":
        while True:
            yield rng.expovariate(rate)
    elif arrival == "gamma":
        scale = 1.0 / (rate * burstiness)
        while True:
            yield rng.gammavariate(burstiness, scale)
    else:
        raise UserError(f"unknown arrival process '{arrival}'", hint=f"use one of {', '.join(ARRIVALS)}")


def schedule_ns(*, rate: float, arrival: Arrival = "poisson", burstiness: float = 1.0, seed: int = 0,
                count: int | None = None, duration_s: float | None = None) -> list[int]:
    """Send offsets in ns from the start of the level, ascending, the first at 0.

    Bounded by `count` (requests), `duration_s` (offsets strictly below it), or both; at least one is required.
    """
    if not rate > 0:
        raise UserError(f"request rate must be positive (got {rate})")
    if arrival == "gamma" and not burstiness > 0:
        raise UserError(f"burstiness must be positive (got {burstiness})")
    if count is None and duration_s is None:
        raise UserError("an open-loop level needs a request count, a duration, or both")
    if (count is not None and count < 1) or (duration_s is not None and duration_s <= 0):
        raise UserError("the request count and the duration of a level must be positive")
    rng = random.Random(seed)
    limit_ns = None if duration_s is None else int(duration_s * NS_PER_S)
    offsets: list[int] = []
    t = 0.0
    gaps = intervals_s(rate, arrival, burstiness, rng)
    while count is None or len(offsets) < count:
        t_ns = int(round(t * NS_PER_S))
        if limit_ns is not None and t_ns >= limit_ns:
            break
        offsets.append(t_ns)
        t += next(gaps)
    return offsets
