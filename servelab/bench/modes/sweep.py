"""sweep: closed-loop concurrency 1, 2, 4, … until output tok/s stops growing (bench/modes/escalation.py) or
`max_concurrency`; or exactly `sweep_levels` when given (a later trial of a cell repeating the first trial's),
measured or not, with no stop rule but failures. Tags `c<N>`."""

from __future__ import annotations

from collections.abc import Iterator

from servelab.bench.headline import concurrency_peak, single_figures
from servelab.bench.level_spec import LevelSpec
from servelab.bench.levels import run_level
from servelab.bench.loads import Target, run_concurrency
from servelab.bench.loads.control import LevelControl
from servelab.bench.modes.escalation import Escalation
from servelab.bench.modes.registry import Mode, mode
from servelab.bench.sender import Sender
from servelab.bench.state import BenchOptions, RunState
from servelab.records import BenchResult, Figure


def sweep_concurrencies(opts: BenchOptions) -> Iterator[int]:
    """The sweep's levels: exactly `sweep_levels` when given (a later trial repeating the first trial's), else
    1, 2, 4, … up to max_concurrency (the sweep stops earlier when throughput stops growing)."""
    if opts.sweep_levels:
        yield from opts.sweep_levels
        return
    concurrency = 1
    while concurrency <= opts.max_concurrency:
        yield concurrency
        concurrency *= 2


@mode("sweep")
class Sweep(Mode):
    description = "concurrency 1, 2, 4, … until throughput stops growing"
    takes_slos = False

    def peak_streams(self, options: BenchOptions) -> int:
        return max(options.sweep_levels) if options.sweep_levels else options.max_concurrency

    def most_streams(self, options: BenchOptions) -> int:
        return self.peak_streams(options)

    def headline(self, result: BenchResult) -> dict[str, Figure]:
        return single_figures(result, or_concurrency_1=True) | concurrency_peak(result)

    async def run(self, state: RunState, client: Sender, target: Target) -> None:
        opts = state.options
        ladder = Escalation(opts.min_gain, opts.patience, where=lambda s: f"concurrency {s.concurrency}",
                            higher="a higher concurrency would be slower still", fixed=bool(opts.sweep_levels))
        for concurrency in sweep_concurrencies(opts):
            control = LevelControl(opts.steady, duration_s=opts.level_duration_s)
            spec = LevelSpec(tag=f"c{concurrency}", mode="concurrency", concurrency=concurrency, control=control,
                             streams=(concurrency, f"concurrency {concurrency}"), planned_s=opts.level_duration_s,
                             cap_s=opts.steady.cap_s(opts.level_duration_s))

            async def load(concurrency=concurrency, control=control):
                return await run_concurrency(client, opts.workload, target, state.recorder, concurrency=concurrency,
                                             duration_s=opts.level_duration_s, control=control)

            reason = ladder.stop_reason(await run_level(state, spec, load))
            if reason:
                state.stop_reason = reason
                return
        state.stop_reason = ("ran the levels of the cell's first trial" if opts.sweep_levels
                             else f"reached the maximum concurrency ({opts.max_concurrency})")
