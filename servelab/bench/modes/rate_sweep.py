"""rate-sweep: open-loop levels at the rates listed in `--rate 1,2,4`, all of them (stopping only when more than
half a level's requests fail); or, with no list, a geometric ramp from `ramp_start` by `ramp_factor` up to
`--max-rate` that stops by the ladder's rule (bench/modes/escalation.py): throughput stopped growing, latency
targets broke, or a level was not measured."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from servelab.bench.headline import rate_peak
from servelab.bench.loads import Target
from servelab.bench.modes.escalation import Escalation
from servelab.bench.modes.rate import describe_open_loop, open_loop_streams, rate_level
from servelab.bench.modes.registry import Mode, mode
from servelab.bench.plans import LoadPlan
from servelab.bench.sender import Sender
from servelab.bench.state import BenchOptions, RunState
from servelab.errors import UserError
from servelab.records import BenchResult, Figure


def ramp(start: float, factor: float, maximum: float) -> Iterator[float]:
    if not start > 0 or not factor > 1:
        raise UserError("a rate ramp needs a positive start and a factor above 1")
    for k in itertools.count():
        rate = start * factor ** k
        if rate > maximum * (1 + 1e-9):
            return
        yield rate


@mode("rate-sweep")
class RateSweep(Mode):
    description = "open-loop levels at listed rates, or a ramp until throughput stops growing"

    def schedule_rates(self, plan: LoadPlan) -> list[float]:
        return list(plan.rates) or [plan.ramp_start, plan.max_rate]

    def streams_needed(self, options: BenchOptions) -> tuple[int, str] | None:
        return open_loop_streams(options)

    def describe_load(self, options: BenchOptions) -> dict:
        return describe_open_loop(options)

    def headline(self, result: BenchResult) -> dict[str, Figure]:
        return rate_peak(result)

    async def run(self, state: RunState, client: Sender, target: Target) -> None:
        opts, plan = state.options, state.options.plan
        listed = bool(plan.rates)
        ladder = Escalation(opts.min_gain, opts.patience, where=lambda s: f"{s.rate:g} req/s",
                            higher="a higher rate would not be either", fixed=listed)
        for rate in (plan.rates if listed else ramp(plan.ramp_start, plan.ramp_factor, plan.max_rate)):
            reason = ladder.stop_reason(await rate_level(state, client, target, rate))
            if reason:
                state.stop_reason = reason
                return
        state.stop_reason = "ran every listed rate" if listed else f"reached the maximum rate ({plan.max_rate:g} req/s)"
