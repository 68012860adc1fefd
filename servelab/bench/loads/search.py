"""The highest load that meets latency targets: bracketing, then bisection, in a bounded number of probes.

`probe(load)` runs one level at that load and says whether it met every target. The search doubles the load
from `start` until a probe fails (or halves it until one passes), then bisects between the highest passing and
the lowest failing load until they are close (rates: within `tolerance`, relative; concurrency: adjacent
integers) or the probe budget is spent. Every probe lies strictly inside the current bracket, so the answer is
consistent even when a noisy level would not be: it is the highest load that *was seen* to pass, below the
lowest that was seen to fail.

Pure decision logic: the probe is a callable, so the search is tested without a server.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

Dimension = Literal["rate", "concurrency"]


@dataclass(frozen=True)
class SearchSpace:
    dimension: Dimension
    start: float
    maximum: float
    minimum: float | None = None  # default: 1 stream, or start / 64 req/s
    max_probes: int = 8
    tolerance: float = 0.1  # rates: stop once lowest failing / highest passing <= 1 + tolerance

    @property
    def floor(self) -> float:
        if self.minimum is not None:
            return self.minimum
        return 1.0 if self.dimension == "concurrency" else self.start / 64


@dataclass
class SearchOutcome:
    best: float | None  # highest load that passed (None: none did)
    lowest_failing: float | None  # lowest load that failed (None: none did)
    probes: list[tuple[float, bool]] = field(default_factory=list)
    stop_reason: str = ""


def round_rate(x: float) -> float:
    """Three significant figures: rates a person can read in a tag, and a finite set to bisect over."""
    if x <= 0:
        return x
    digits = 2 - math.floor(math.log10(x))
    return round(x, digits)


async def search_max_load(probe: Callable[[float], Awaitable[bool]], space: SearchSpace) -> SearchOutcome:
    integer = space.dimension == "concurrency"
    snap = (lambda v: float(max(1, int(v)))) if integer else round_rate
    out = SearchOutcome(best=None, lowest_failing=None)
    x = snap(min(max(space.start, space.floor), space.maximum))
    while True:
        if len(out.probes) >= space.max_probes:
            out.stop_reason = f"probe budget spent ({space.max_probes} probes)"
            return out
        passed = await probe(x)
        out.probes.append((x, passed))
        if passed:
            out.best = x
        else:
            out.lowest_failing = x
        lo, hi = out.best, out.lowest_failing
        if hi is None:  # everything passed so far: go up
            if x >= space.maximum:
                out.stop_reason = f"the highest load allowed ({space.maximum:g}) met the targets"
                return out
            x = snap(min(x * 2, space.maximum))
        elif lo is None:  # everything failed so far: go down
            if x <= space.floor:
                out.stop_reason = f"even the lowest load tried ({x:g}) broke the targets"
                return out
            x = snap(max(x / 2, space.floor))
        else:
            mid = snap((lo + hi) // 2 if integer else math.sqrt(lo * hi))
            close = hi - lo <= 1 if integer else hi / lo <= 1 + space.tolerance
            if close or mid <= lo or mid >= hi:
                out.stop_reason = f"bracketed: {lo:g} met the targets, {hi:g} did not"
                return out
            x = mid
