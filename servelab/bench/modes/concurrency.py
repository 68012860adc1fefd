"""concurrency: one closed-loop level at `--concurrency` streams (tag `c<N>`), bounded by `--requests`,
`--duration` or both."""

from __future__ import annotations

from servelab.bench.headline import concurrency_peak
from servelab.bench.level_spec import LevelSpec
from servelab.bench.levels import run_level
from servelab.bench.loads import Target, run_concurrency
from servelab.bench.loads.control import LevelControl
from servelab.bench.modes.registry import Mode, mode
from servelab.bench.sender import Sender
from servelab.bench.state import BenchOptions, RunState
from servelab.records import BenchResult, Figure, Summary


async def concurrency_level(state: RunState, client: Sender, target: Target, concurrency: int) -> Summary:
    """One closed-loop level at `concurrency` streams, bounded as the plan says (also an SLO search's probe)."""
    opts, plan = state.options, state.options.plan
    requests, duration = plan.bounds(opts.level_duration_s)
    control = LevelControl(opts.steady, duration_s=duration, max_requests=requests)
    spec = LevelSpec(tag=f"c{concurrency}", mode="concurrency", concurrency=concurrency, control=control,
                     load={"requests": requests, "duration_s": duration},
                     streams=(concurrency if requests is None else min(concurrency, requests),
                              f"concurrency {concurrency}"),
                     planned_s=duration, cap_s=opts.steady.cap_s(duration), planned_requests=requests)

    async def load():
        return await run_concurrency(client, opts.workload, target, state.recorder, concurrency=concurrency,
                                     duration_s=duration, max_requests=requests, tag=spec.tag, control=control)

    return await run_level(state, spec, load)


@mode("concurrency")
class Concurrency(Mode):
    description = "one closed-loop level"

    def peak_streams(self, options: BenchOptions) -> int:
        plan = options.plan
        return plan.concurrency if plan.requests is None else min(plan.concurrency, plan.requests)

    def most_streams(self, options: BenchOptions) -> int:
        return options.plan.concurrency

    def streams_needed(self, options: BenchOptions) -> tuple[int, str]:
        return self.peak_streams(options), f"--concurrency {options.plan.concurrency:,}"

    def planned_requests(self, options: BenchOptions) -> int | None:
        return options.plan.requests

    def describe_load(self, options: BenchOptions) -> dict:
        plan = options.plan
        return plan.describe_bounds() | {"concurrency": plan.concurrency} | plan.describe_slos()

    def headline(self, result: BenchResult) -> dict[str, Figure]:
        return concurrency_peak(result)

    async def run(self, state: RunState, client: Sender, target: Target) -> None:
        await concurrency_level(state, client, target, state.options.plan.concurrency)
