"""The bench modes beyond single stream and the concurrency sweep: one concurrency level, one request rate, a
rate sweep, and the max-load search under latency targets. Plus preparing the workload before any of them.

The runner (bench/runner.py) owns the run's state, the levels' begin/finish (server metrics, token recount) and
the single/sweep modes; this module plans the others on top of those same steps, so every level of every mode
is summarised the same way.
- concurrency: one closed-loop level at `concurrency` streams.
- rate: one open-loop level at `rates[0]` requests/s.
- rate-sweep: the listed rates, all of them; or, with no list, a geometric ramp from `ramp_start` by
  `ramp_factor` up to `max_rate` that stops when output tok/s stops growing or the latency targets break.
- slo-search: the highest rate (or concurrency) whose level meets every target (bench/loads/search.py).
Every level is bounded by `requests`, `duration_s` or both (neither: the runner's level duration).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from servelab.bench.client import StreamClient
from servelab.bench.loads import Target, rate_tag, run_concurrency, run_rate
from servelab.bench.loads.arrivals import Arrival
from servelab.bench.loads.control import LevelControl
from servelab.bench.loads.search import Dimension, SearchSpace, search_max_load
from servelab.bench.metrics import goodput_figures, peak_figures
from servelab.bench.slo import SLO, describe as describe_slos, level_verdict
from servelab.bench.steady import is_measured, withhold
from servelab.bench.workloads import counter_for
from servelab.errors import UserError
from servelab.records import BenchResult, Figure, RequestRecord, Summary

if TYPE_CHECKING:
    from servelab.bench.runner import BenchState

PLAN_MODES = ("concurrency", "rate", "rate-sweep", "slo-search", "multiturn", "replay")  # the last two: issue 16
CLIENT_LAG_WARN_MS = 10.0  # uncapped open loop: a p99 send lag above this means the schedule was not kept


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

    def describe(self, mode: str) -> dict[str, Any]:
        d: dict[str, Any] = {"requests_per_level": self.requests, "duration_s_per_level": self.duration_s}
        if mode == "replay":  # the trace's own schedule (its level's `load` says how it was scaled)
            return d | {"schedule": "the trace's arrival times, time-scaled"}
        if mode == "multiturn" and not self.rates:
            return d | {"users": self.concurrency}
        if mode == "concurrency" or (mode == "slo-search" and self.search == "concurrency"):
            d["concurrency"] = self.concurrency if mode == "concurrency" else None
        else:
            d |= {"arrival": self.arrival, "burstiness": self.burstiness if self.arrival == "gamma" else None,
                  "seed": self.seed, "max_concurrency": self.max_concurrency}
            if mode in ("rate", "rate-sweep"):
                d["rates"] = self.rates or f"ramp from {self.ramp_start:g} x{self.ramp_factor:g} to " \
                                           f"{self.max_rate:g} req/s"
        if self.slos:
            d["slos"] = describe_slos(self.slos)
        return d


# ---------------------------------------------------------------------------------------------------------------
# Preparing the workload (reading files, measuring prompts) before any request is timed
# ---------------------------------------------------------------------------------------------------------------

async def prepare_workload(state: BenchState, session: aiohttp.ClientSession) -> None:
    from servelab.engines import get_engine

    adapter = get_engine(state.engine) if state.engine else None
    state.accepts_min_tokens = adapter.accepts_min_tokens if adapter else False
    counter = counter_for(state.engine, session, state.url, model=state.model)
    await state.options.workload.prepare(counter, needed=planned_requests(state))


def planned_requests(state: BenchState) -> int | None:
    """How many requests the run will build, when the plan fixes it (None: it depends on time)."""
    from servelab.bench.warmup import plan_warmup

    opts = state.options
    warmup = plan_warmup(opts, state.server_slots).total
    if opts.mode == "single":
        return warmup + opts.single_requests
    plan = opts.plan
    if opts.mode in ("concurrency", "rate") and plan.requests is not None:
        return warmup + plan.requests
    return None


# ---------------------------------------------------------------------------------------------------------------
# Levels
# ---------------------------------------------------------------------------------------------------------------

async def rate_level(state: BenchState, client: StreamClient, target: Target, rate: float) -> Summary:
    from servelab.bench.runner import begin_level

    opts, plan = state.options, state.options.plan
    requests, duration = plan.bounds(opts.level_duration_s)
    tag, cap = rate_tag(rate), plan.max_concurrency or 0
    load = {"arrival": plan.arrival, "burstiness": plan.burstiness, "seed": plan.seed, "requests": requests,
            "duration_s": duration, "max_concurrency": plan.max_concurrency,
            "window": "first scheduled send .. last scheduled send"}
    state.current_plan = {"mode": "rate", "rate": rate, "load": load}
    await begin_level(state, tag, cap)
    control = LevelControl(opts.steady, duration_s=duration, max_requests=requests, open_loop=True)
    records, window = await run_rate(client, opts.workload, target, state.recorder, rate=rate,
                                     arrival=plan.arrival, burstiness=plan.burstiness, seed=plan.seed,
                                     requests=requests, duration_s=duration, max_concurrency=plan.max_concurrency,
                                     tag=tag, control=control)
    load["scheduled"] = len(records)
    return await _finish(state, records, tag=tag, mode="rate", concurrency=cap, window=window, rate=rate,
                         load=load, control=control)


async def concurrency_level(state: BenchState, client: StreamClient, target: Target, concurrency: int
                            ) -> Summary:
    from servelab.bench.runner import begin_level, ensure_streams

    opts, plan = state.options, state.options.plan
    requests, duration = plan.bounds(opts.level_duration_s)
    tag = f"c{concurrency}"
    ensure_streams(state, concurrency if requests is None else min(concurrency, requests),
                   f"concurrency {concurrency}")
    load = {"requests": requests, "duration_s": duration}
    state.current_plan = {"mode": "concurrency", "load": load}
    await begin_level(state, tag, concurrency)
    control = LevelControl(opts.steady, duration_s=duration, max_requests=requests)
    records, window = await run_concurrency(client, opts.workload, target, state.recorder,
                                            concurrency=concurrency, duration_s=duration, max_requests=requests,
                                            tag=tag, control=control)
    return await _finish(state, records, tag=tag, mode="concurrency", concurrency=concurrency, window=window,
                         load=load, control=control)


async def _finish(state: BenchState, records: list[RequestRecord], *, tag: str, mode: str, concurrency: int,
                  window: tuple[int, int], rate: float | None = None, load: dict[str, Any],
                  control: LevelControl | None = None) -> Summary:
    """The runner's finish (server metrics, recount, figures, steady state), then what this module's modes add:
    the load's description, goodput and the SLO verdict when there are targets, and a warning when sends ran
    late."""
    from servelab.bench.runner import finish_level, stop_if_broken

    summary = await finish_level(state, records, tag=tag, mode=mode, concurrency=concurrency, window=window,
                                 control=control, rate=rate)
    state.current_plan = None
    summary.rate, summary.load = rate, load
    if control is not None:
        summary.load["ended_by"] = control.ended_by
    slos = state.options.plan.slos
    if slos:
        summary.figures.update(goodput_figures(records, slos, window))
        summary.slo = level_verdict(records, slos)
        withhold(summary)
        unjudged(summary)
    lag = summary.figures.get("client_lag_ms")
    if mode == "rate" and not concurrency and lag is not None and lag.value is not None \
            and lag.value > CLIENT_LAG_WARN_MS:
        summary.warnings.append(f"client lag p99 {lag.value:.1f} ms: sends went out late, so the load offered "
                                f"was below the schedule's (the client, not the server, limited it)")
    state.level_done(summary)
    stop_if_broken(summary)
    return summary


def unjudged(summary: Summary) -> None:
    """A level that is not measured (docs/metrics.md#steady-state) is never called met: its SLO verdict says
    it was not judged, and why."""
    if summary.slo is not None and not is_measured(summary):
        summary.slo["passed"] = False
        summary.slo["judged"] = False
        summary.slo["reason"] = f"not measured: {summary.steady.reason}"


def annotate_partial(state: BenchState, summary: Summary, records: list[RequestRecord]) -> None:
    """Ctrl-C during one of this module's levels: give its partial summary what _finish would have."""
    info = state.current_plan or {}
    summary.rate, summary.load = info.get("rate"), dict(info.get("load") or {})
    if state.options.plan.slos:
        summary.slo = level_verdict(records, state.options.plan.slos)
        withhold(summary)
        unjudged(summary)


# ---------------------------------------------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------------------------------------------

async def run_plan(state: BenchState, client: StreamClient, target: Target) -> None:
    from servelab.bench.runner import warm_up

    opts, plan = state.options, state.options.plan
    if opts.mode == "rate" and not plan.rates:
        raise UserError("--mode rate needs --rate")
    if opts.mode == "slo-search" and not plan.slos:
        raise UserError("--mode slo-search needs latency targets", hint="e.g. --slo ttft_p99_ms=500,itl_p99_ms=50")
    await warm_up(state, client, target, tag="warmup")
    if opts.mode == "concurrency":
        await concurrency_level(state, client, target, plan.concurrency)
    elif opts.mode == "rate":
        await rate_level(state, client, target, plan.rates[0])
    elif opts.mode == "rate-sweep":
        await rate_sweep(state, client, target)
    elif opts.mode == "slo-search":
        await slo_search(state, client, target)
    elif opts.mode in ("multiturn", "replay"):  # conversations and trace replay (bench/conversation_plans.py)
        from servelab.bench.conversation_plans import run_mode

        await run_mode(state, client, target)
    else:
        raise UserError(f"unknown mode '{opts.mode}'")


def ramp(start: float, factor: float, maximum: float) -> Iterator[float]:
    if not start > 0 or not factor > 1:
        raise UserError("a rate ramp needs a positive start and a factor above 1")
    for k in itertools.count():
        rate = start * factor ** k
        if rate > maximum * (1 + 1e-9):
            return
        yield rate


async def rate_sweep(state: BenchState, client: StreamClient, target: Target) -> None:
    opts, plan = state.options, state.options.plan
    listed = bool(plan.rates)
    best: Summary | None = None
    for rate in (plan.rates if listed else ramp(plan.ramp_start, plan.ramp_factor, plan.max_rate)):
        level = await rate_level(state, client, target, rate)
        if level.failed and level.failed > (level.ok + level.failed) / 2:
            state.stop_reason = f"more than half the requests failed at {rate:g} req/s"
            return
        if listed:  # every rate asked for runs; an unmeasured level says so itself
            continue
        if not is_measured(level):
            state.stop_reason = f"{rate:g} req/s was not measured ({level.steady.reason}); a higher rate would " \
                                f"not be either"
            return
        if level.slo is not None and not level.slo["passed"]:
            state.stop_reason = f"the latency targets broke at {rate:g} req/s"
            return
        tput = level.figures["output_tok_s"].value or 0.0
        best_tput = (best.figures["output_tok_s"].value or 0.0) if best is not None else 0.0
        if best is not None and tput < best_tput * (1 + opts.min_gain):
            state.stop_reason = (f"output tok/s stopped growing: {tput:.1f} at {rate:g} req/s is not "
                                 f"{opts.min_gain:.0%} above {best_tput:.1f} at {best.rate:g} req/s")
            return
        if best is None or tput > best_tput:
            best = level
    state.stop_reason = "ran every listed rate" if listed else f"reached the maximum rate ({plan.max_rate:g} req/s)"


async def slo_search(state: BenchState, client: StreamClient, target: Target) -> None:
    opts, plan = state.options, state.options.plan
    by_rate = plan.search == "rate"
    space = SearchSpace(plan.search, start=plan.search_start or (plan.ramp_start if by_rate else 1),
                        maximum=plan.search_max or (plan.max_rate if by_rate else opts.max_concurrency),
                        max_probes=plan.max_probes, tolerance=plan.tolerance)
    probes: list[dict[str, Any]] = []
    as_load = float if by_rate else int  # concurrency is a whole number of streams in the result too

    async def probe(load: float) -> bool:
        level = await (rate_level(state, client, target, load) if by_rate
                       else concurrency_level(state, client, target, int(load)))
        # A level that is not measured (too few requests, or the cap) is never called met: it counts as not
        # passing, and the probe says why (docs/metrics.md#slo-search).
        measured = is_measured(level)
        passed = bool(level.slo and level.slo["passed"]) and measured
        entry = {"load": as_load(load), "tag": level.tag, "passed": passed,
                 "observed_ms": {k: t["observed_ms"] for k, t in (level.slo or {}).get("targets", {}).items()}}
        if not measured:
            entry["judged"] = False
            entry["reason"] = f"not measured: {level.steady.reason}"
        probes.append(entry)
        return passed

    state.search = {"dimension": plan.search, "targets": describe_slos(plan.slos), "probes": probes}
    outcome = await search_max_load(probe, space)
    state.search |= {"best": None if outcome.best is None else as_load(outcome.best),
                     "lowest_failing": None if outcome.lowest_failing is None else as_load(outcome.lowest_failing),
                     "stop_reason": outcome.stop_reason}
    unmeasured = [p for p in probes if p.get("judged") is False]
    if unmeasured:
        state.search["stop_reason"] += (f"; {len(unmeasured)} probe(s) were not measured and counted as not meeting "
                                        f"the targets (e.g. {unmeasured[0]['tag']}: {unmeasured[0]['reason']})")
    state.stop_reason = state.search["stop_reason"]


# ---------------------------------------------------------------------------------------------------------------
# Headline figures of these modes
# ---------------------------------------------------------------------------------------------------------------

def plan_headline(result: BenchResult) -> dict[str, Figure]:
    """Peak output tok/s over rate levels (when there are no concurrency levels to take it from), and the
    answer of an SLO search: the highest load that met the targets, with its goodput."""
    out: dict[str, Figure] = {}
    rate_levels = [s for s in result.levels if s.mode == "rate" and s.rate is not None and is_measured(s)
                   and s.figures["output_tok_s"].value]
    if rate_levels and not any(s.mode == "concurrency" for s in result.levels):
        out.update(peak_figures(rate_levels, load_key="rate", load=lambda s: s.rate, load_unit="req/s",
                                note=lambda s: f"at {s.rate:g} req/s offered"))
    search = result.search or {}
    if search.get("best") is not None:
        by_rate = search["dimension"] == "rate"
        level = next((s for s in result.levels if s.slo and s.slo["passed"] and is_measured(s)
                      and (s.rate if by_rate else s.concurrency) == search["best"]), None)
        out["slo.max_rate" if by_rate else "slo.max_concurrency"] = Figure(
            value=search["best"], unit="req/s" if by_rate else "streams", definition="slo-search",
            note=f"targets {search['targets']}; lowest failing: {search.get('lowest_failing')}")
        if level is not None:
            for key in ("goodput_req_s", "output_tok_s", "request_s"):
                if key in level.figures:
                    out[f"slo.{key}"] = level.figures[key]
    return out
