"""Bootstrap confidence intervals for servelab's figures (method: docs/metrics.md#comparing-runs).

Each figure is re-computed on resampled data by the same definition that produced it:
- a median over requests (single-stream decode tok/s, TTFT): resample requests with replacement;
- the per-token ITL median, whose samples come in clusters (one per request, and tokens of one request are not
  independent): resample whole requests and pool their gaps;
- aggregate output tok/s of a load level: resample equal-width time bins of the level's window (token counts
  per bin), the mean rate of the resampled bins being the throughput of the resample;
- energy per token (and tokens per joule) of a level: the same time bins, each with its tokens and the energy the
  GPUs drew in it, the figure of a resample being its bins' joules over their tokens.

A run of several trials is resampled hierarchically (Trials): trials first, then units within them.

Two runs are resampled independently; the interval of their ratio is the percentile interval of the ratios of
paired draws. Draws come from a fixed seed, so the same data always gives the same interval.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from servelab.bench.metrics import percentile

RESAMPLES = 1000
CONFIDENCE = 0.95
SEED = 20240613  # any fixed value: reproducible intervals, not a tuned one


class Resampler:
    """A figure's data with its definition: `point()` is the figure, `draw(rng)` the figure of one resample.

    The data is a list of independent `units` (requests, or time bins) and `combine(units)` computes the figure
    from any list of them, so units of several trials can be pooled (Trials)."""

    units: Sequence

    @property
    def n(self) -> int:  # independent units resampled
        return len(self.units)

    def combine(self, units: Sequence) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def point(self) -> float:
        return self.combine(self.units)

    def draw(self, rng: random.Random) -> float:
        return self.combine(rng.choices(self.units, k=self.n))


@dataclass
class MedianOf(Resampler):
    """The median of one value per request."""

    units: Sequence[float]

    def combine(self, units: Sequence[float]) -> float:
        return percentile(sorted(units), 50)


@dataclass
class MeanOf(Resampler):
    """The mean of one value per unit (an SLO search's answer, one per trial)."""

    units: Sequence[float]

    def combine(self, units: Sequence[float]) -> float:
        return sum(units) / len(units) if units else math.nan


@dataclass
class PercentileOf(Resampler):
    """A percentile (`q`, 0-100) of one value per request (replay lag: the p99 of client lag)."""

    units: Sequence[float]
    q: float = 50.0

    def combine(self, units: Sequence[float]) -> float:
        return percentile(sorted(units), self.q)


@dataclass
class PooledMedian(Resampler):
    """The median of samples pooled over requests, resampling whole requests (a cluster bootstrap)."""

    units: Sequence[Sequence[float]]

    def __post_init__(self) -> None:
        self.units = [g for g in self.units if g]

    def combine(self, units: Sequence[Sequence[float]]) -> float:
        return percentile(sorted(v for g in units for v in g), 50)


@dataclass
class BinnedRate(Resampler):
    """Tokens per second over a window split into equal bins: the resampled bins' tokens over their total width.
    A unit is (tokens, seconds) of one bin, so bins of trials with different widths pool correctly. `scale` ties
    the rate to the reported figure when the bins' total differs from it by edge tokens."""

    counts: Sequence[int]
    bin_s: float
    scale: float = 1.0

    def __post_init__(self) -> None:
        self.units = [(c * self.scale, self.bin_s) for c in self.counts]

    def combine(self, units: Sequence[tuple[float, float]]) -> float:
        seconds = sum(s for _, s in units)
        return sum(c for c, _ in units) / seconds if seconds else math.nan


@dataclass
class EnergyPerToken(Resampler):
    """Energy per output token (or, `inverse`, tokens per joule) of a level's window split into equal time bins: a
    unit is (joules, tokens) of one bin, the figure the resampled bins' joules over their tokens, so bins of trials
    with different power or throughput pool as one window would (docs/metrics.md#gpu-trials)."""

    units: Sequence[tuple[float, float]]
    inverse: bool = False

    def combine(self, units: Sequence[tuple[float, float]]) -> float:
        joules, tokens = sum(j for j, _ in units), sum(t for _, t in units)
        if self.inverse:
            return tokens / joules if joules else math.nan
        return joules / tokens if tokens else math.nan


@dataclass
class Trials(Resampler):
    """A hierarchical bootstrap over a cell's trials: each draw resamples the trials with replacement, then the
    units within each drawn trial, and computes the figure over everything drawn (docs/metrics.md#trial-intervals).
    Variation between trials (other work on the machine, CPU frequency, order) widens the interval as much as
    the trials differ, which resampling requests alone cannot see. With one trial it is the plain bootstrap."""

    parts: Sequence[Resampler]
    ids: Sequence[int] | None = None  # each part's trial index (default: 0, 1, …)

    def __post_init__(self) -> None:
        ids = list(self.ids) if self.ids is not None else list(range(len(self.parts)))
        kept = [(i, p) for i, p in zip(ids, self.parts) if p.n]
        self.ids, self.parts = [i for i, _ in kept], [p for _, p in kept]
        self.units = [u for p in self.parts for u in p.units]

    @property
    def trials(self) -> int:
        return len(self.parts)

    def combine(self, units: Sequence) -> float:
        return self.parts[0].combine(units)

    def draw(self, rng: random.Random) -> float:
        picked = rng.choices(self.parts, k=len(self.parts))
        return self.combine([u for p in picked for u in rng.choices(p.units, k=p.n)])

    def trial_points(self) -> list[float]:
        return [p.point() for p in self.parts]

    def points_by_trial(self) -> dict[int, float]:
        return dict(zip(self.ids, self.trial_points()))  # type: ignore[arg-type]


def time_bins(times_ns: Sequence[tuple[int, int]], start_ns: int, window_s: float) -> tuple[list[int], float]:
    """Token counts in equal bins over [start, start + window): about one bin per second, at least 10 bins (a
    5-second level gets 0.5-second bins), so even a short level has units to resample. `times_ns` holds
    (event time, tokens); events outside the window are not counted, as in output tok/s."""
    n_bins = max(10, round(window_s))
    bin_ns = window_s * 1e9 / n_bins
    counts = [0] * n_bins
    end_ns = start_ns + window_s * 1e9
    for t, tokens in times_ns:
        if start_ns <= t <= end_ns:
            counts[min(int((t - start_ns) / bin_ns), n_bins - 1)] += tokens
    return counts, bin_ns / 1e9


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


def draws(sampler: Resampler, rng: random.Random, resamples: int = RESAMPLES) -> list[float]:
    return [sampler.draw(rng) for _ in range(resamples)]


def interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval | None:
    finite = sorted(v for v in values if math.isfinite(v))
    if not finite:
        return None
    tail = (1 - confidence) / 2 * 100
    return Interval(percentile(finite, tail), percentile(finite, 100 - tail))


def figure_interval(sampler: Resampler, key: str) -> Interval | None:
    """The interval of one run's figure."""
    if sampler.n < 2:
        return None
    return interval(draws(sampler, random.Random(f"{SEED}:{key}")))


def ratio_interval(candidate: Resampler, baseline: Resampler | float, key: str) -> Interval | None:
    """The interval of candidate / baseline. A literal baseline (a float) has no noise of its own: the interval
    then reflects only the candidate's."""
    if candidate.n < 2:
        return None
    rng = random.Random(f"{SEED}:{key}:ratio")
    mine = draws(candidate, rng)
    if isinstance(baseline, Resampler):
        if baseline.n < 2:
            return None
        theirs = draws(baseline, rng)
    else:
        theirs = [baseline] * len(mine)
    return interval([a / b for a, b in zip(mine, theirs) if b])
