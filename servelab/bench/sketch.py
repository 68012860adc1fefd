"""A distribution of many samples (every token gap of a level) in bounded memory.

Exact while it is small: the samples themselves, in a compact array, so a level of up to `EXACT_LIMIT` samples
gets exactly the figures a sorted list would give. Past that it becomes a DDSketch (Datadog's quantile sketch,
the `ddsketch` package) with relative accuracy `RELATIVE_ACCURACY`: every quantile it returns is within 0.5 % of
the sample at that quantile's rank (docs/metrics.md#sketch). Count, mean, minimum and maximum stay exact either
way. Infinite samples (a failed request counted against an ITL target) are counted apart: a sketch holds finite
values only.
"""

from __future__ import annotations

import math
import operator
from array import array

from ddsketch import DDSketch

from servelab.quantiles import percentile as percentile  # noqa: PLC0414 - re-exported for bench's figures
from servelab.records import Distribution

EXACT_LIMIT = 1_000_000  # 8 MB of float64: beyond this, a level's gaps go into the sketch
RELATIVE_ACCURACY = 0.005


def distribution(values) -> Distribution | None:
    """The Distribution of every value given, exactly (None when there is none)."""
    v = sorted(values)
    if not v:
        return None
    return Distribution(n=len(v), mean=sum(v) / len(v), min=v[0], p50=percentile(v, 50), p90=percentile(v, 90),
                        p95=percentile(v, 95), p99=percentile(v, 99), max=v[-1])


class Samples:
    """Add samples (with a repeat count), merge two, read a Distribution or any percentile."""

    def __init__(self, exact_limit: int = EXACT_LIMIT):
        self.exact_limit = exact_limit
        self._exact: array | None = array("d")
        self._sketch: DDSketch | None = None
        self.n = 0  # finite samples
        self.infinite = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf

    @property
    def sketched(self) -> bool:
        return self._sketch is not None

    def add(self, value: float, count: int = 1) -> None:
        if count <= 0:
            return
        if math.isinf(value):
            self.infinite += count
            return
        self.n += count
        self._sum += value * count
        self._min = min(self._min, value)
        self._max = max(self._max, value)
        if self._exact is not None:
            if count == 1:
                self._exact.append(value)
            else:
                self._exact.extend([value] * count)
            if len(self._exact) > self.exact_limit:
                self._to_sketch()
        else:
            self._sketch.add(value, count)

    def extend(self, values) -> None:
        for v in values:
            self.add(v)

    def add_all(self, values: list[float], counts: list[int] | None = None) -> None:
        """`add` of every value (with its count, 1 when None), in a few passes of C loops: a level folds each
        request's gaps as it finishes, inside the client's event loop, where a slow fold delays the reading of
        every other stream's tokens (it cost a 256-token request ~1 ms, one call to `add` per gap)."""
        if not values:
            return
        if any(map(math.isinf, values)) or (counts is not None and min(counts) <= 0):
            for v, c in zip(values, counts or [1] * len(values)):
                self.add(v, c)
            return
        if counts is None or max(counts) == 1:
            self.n += len(values)
            self._sum += math.fsum(values)
            flat = values
        else:
            self.n += sum(counts)
            self._sum += math.fsum(map(operator.mul, values, counts))
            flat = [v for v, c in zip(values, counts) for _ in range(c)]
        self._min = min(self._min, min(values))
        self._max = max(self._max, max(values))
        if self._exact is not None:
            self._exact.extend(flat)
            if len(self._exact) > self.exact_limit:
                self._to_sketch()
        else:
            for v in flat:
                self._sketch.add(v)

    def merge(self, other: Samples) -> None:
        self.infinite += other.infinite
        if other.n == 0:
            return
        if self._exact is not None and other._exact is not None:
            self._exact.extend(other._exact)
            if len(self._exact) > self.exact_limit:
                self._to_sketch()
        else:
            if self._exact is not None:
                self._to_sketch()
            if other._exact is not None:
                for v in other._exact:
                    self._sketch.add(v)
            else:
                self._sketch.merge(other._sketch)
        self.n += other.n
        self._sum += other._sum
        self._min = min(self._min, other._min)
        self._max = max(self._max, other._max)

    def _to_sketch(self) -> None:
        sketch = DDSketch(RELATIVE_ACCURACY)
        for v in self._exact or ():
            sketch.add(v)
        self._sketch, self._exact = sketch, None

    # ---- reading ----
    def quantile(self, q: float, extra_infinite: int = 0) -> float:
        """The q-th percentile (0..100) over every sample, infinite ones included (they sort last), and
        `extra_infinite` more of them."""
        infinite = self.infinite + extra_infinite
        total = self.n + infinite
        if total == 0:
            return math.nan
        if self._exact is not None:
            if infinite:
                value = percentile(sorted(self._exact) + [math.inf] * infinite, q)
                return math.inf if math.isnan(value) else value  # between two infinite samples (inf - inf)
            return percentile(sorted(self._exact), q)
        rank = (total - 1) * q / 100.0
        if rank > self.n - 1:
            return math.inf
        return self._sketch.get_quantile_value(min(rank / max(self.n - 1, 1), 1.0))

    def distribution(self) -> Distribution | None:
        """Over the finite samples (what a figure's distribution shows)."""
        if self.n == 0:
            return None
        if self._exact is not None:
            return distribution(self._exact)
        q = self._sketch.get_quantile_value
        clamp = lambda x: min(max(x, self._min), self._max)  # noqa: E731 - the sketch's bins can overshoot
        return Distribution(n=self.n, mean=self._sum / self.n, min=self._min, p50=clamp(q(0.50)),
                            p90=clamp(q(0.90)), p95=clamp(q(0.95)), p99=clamp(q(0.99)), max=self._max)
