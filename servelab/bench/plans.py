"""The load plan: the options of the modes beyond single stream and the concurrency sweep (bench/modes/), and the
pieces each mode describes its load with in the result (`workload.load_plan`).

- concurrency: one closed-loop level at `concurrency` streams.
- rate: one open-loop level at `rates[0]` requests/s.
- rate-sweep: the listed rates, all of them; or, with no list, a geometric ramp from `ramp_start` by
  `ramp_factor` up to `max_rate` that stops when output tok/s stops growing or the latency targets break.
- slo-search: the highest rate (or concurrency) whose level meets every target (bench/loads/search.py).
- multiturn, replay: conversations (`concurrency` users, or `rates[0]` conversations/s) and a trace.
Every level is bounded by `requests`, `duration_s` or both (neither: the runner's level duration).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servelab.bench.loads.arrivals import Arrival
from servelab.bench.loads.search import Dimension
from servelab.bench.slo import SLO, describe as describe_slos


@dataclass
class LoadPlan:
    concurrency: int = 1  # mode concurrency
    rates: list[float] = field(default_factory=list)  # mode rate: rates[0]; rate-sweep: the list (empty: ramp)
    arrival: Arrival = "poisson"
    burstiness: float = 1.0  # gamma shape; 1.0 = Poisson
    seed: int = 0  # arrival schedules (the same seed at every level: the same pattern, scaled)
    requests: int | None = None  # per level
    duration_s: float | None = None  # per level
    max_concurrency: int | None = None  # open-loop cap on requests in flight (None: uncapped)
    ramp_start: float = 1.0
    ramp_factor: float = 2.0
    max_rate: float = 256.0
    slos: list[SLO] = field(default_factory=list)
    search: Dimension = "rate"  # slo-search: what to vary
    search_start: float | None = None  # default: ramp_start req/s, or 1 stream
    search_max: float | None = None  # default: max_rate, or the runner's max_concurrency
    max_probes: int = 8
    tolerance: float = 0.1  # slo-search over rates: stop when the bracket is within this ratio

    def bounds(self, default_duration_s: float) -> tuple[int | None, float | None]:
        if self.requests is None and self.duration_s is None:
            return None, default_duration_s
        return self.requests, self.duration_s

    # ---- what a mode's load description is made of ----
    def describe_bounds(self) -> dict[str, Any]:
        return {"requests_per_level": self.requests, "duration_s_per_level": self.duration_s}

    def describe_arrivals(self) -> dict[str, Any]:
        return {"arrival": self.arrival, "burstiness": self.burstiness if self.arrival == "gamma" else None,
                "seed": self.seed, "max_concurrency": self.max_concurrency}

    def describe_rates(self) -> str | list[float]:
        return self.rates or f"ramp from {self.ramp_start:g} x{self.ramp_factor:g} to {self.max_rate:g} req/s"

    def describe_slos(self) -> dict[str, Any]:
        return {"slos": describe_slos(self.slos)} if self.slos else {}
