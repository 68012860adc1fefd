"""slo-search: the highest rate (or, with `--search concurrency`, concurrency) whose level meets every latency
target: bracketing, then bisection, in a bounded number of probes (bench/loads/search.py). Each probe is a rate or
a concurrency level; the result's `search` holds the probes, the bracket and the answer."""

from __future__ import annotations

from typing import Any

from servelab.bench.headline import concurrency_peak, rate_peak, slo_answer
from servelab.bench.loads import Target
from servelab.bench.loads.search import SearchSpace, search_max_load
from servelab.bench.modes.concurrency import concurrency_level
from servelab.bench.modes.rate import open_loop_streams, rate_level
from servelab.bench.modes.registry import Mode, mode
from servelab.bench.plans import LoadPlan
from servelab.bench.sender import Sender
from servelab.bench.slo import describe as describe_slos
from servelab.bench.state import BenchOptions, RunState
from servelab.bench.steady import is_measured
from servelab.errors import UserError
from servelab.records import BenchResult, Figure


@mode("slo-search")
class SloSearch(Mode):
    description = "the highest load that meets --slo"

    def validate(self, options: BenchOptions) -> None:
        if not options.plan.slos:
            raise UserError("--mode slo-search needs latency targets",
                            hint="e.g. --slo ttft_p99_ms=500,itl_p99_ms=50")

    def schedule_rates(self, plan: LoadPlan) -> list[float] | None:
        if plan.search != "rate":
            return None
        if plan.rates:
            return list(plan.rates)
        start = plan.search_start or plan.ramp_start
        return [start / 64, start, plan.max_rate]  # the search may halve down to start / 64

    def peak_streams(self, options: BenchOptions) -> int | None:
        if options.plan.search == "concurrency":
            return int(options.plan.search_max or options.max_concurrency)
        return options.plan.max_concurrency or None

    def most_streams(self, options: BenchOptions) -> int | None:
        return self.peak_streams(options)

    def streams_needed(self, options: BenchOptions) -> tuple[int, str] | None:
        return open_loop_streams(options)

    def describe_load(self, options: BenchOptions) -> dict:
        plan = options.plan
        d = plan.describe_bounds()
        if plan.search == "concurrency":
            d["concurrency"] = None
        else:
            d |= plan.describe_arrivals()
        return d | plan.describe_slos()

    def headline(self, result: BenchResult) -> dict[str, Figure]:
        return concurrency_peak(result) | rate_peak(result) | slo_answer(result)

    async def run(self, state: RunState, client: Sender, target: Target) -> None:
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
            state.search["stop_reason"] += (f"; {len(unmeasured)} probe(s) were not measured and counted as not "
                                            f"meeting the targets (e.g. {unmeasured[0]['tag']}: "
                                            f"{unmeasured[0]['reason']})")
        state.stop_reason = state.search["stop_reason"]
