"""single: requests one at a time, the single-stream figures (tag `single`)."""

from __future__ import annotations

from servelab.bench.headline import single_figures
from servelab.bench.level_spec import LevelSpec
from servelab.bench.levels import run_level
from servelab.bench.loads import Target, run_single
from servelab.bench.loads.control import StallWatch
from servelab.bench.modes.registry import Mode, mode
from servelab.bench.sender import Sender
from servelab.bench.state import BenchOptions, RunState
from servelab.records import BenchResult, Figure


@mode("single")
class Single(Mode):
    description = "one request at a time"
    takes_slos = False
    warmup_tag = "single"

    def peak_streams(self, options: BenchOptions) -> int:
        return 1

    def most_streams(self, options: BenchOptions) -> int:
        return 1

    def planned_requests(self, options: BenchOptions) -> int:
        return options.single_requests

    def headline(self, result: BenchResult) -> dict[str, Figure]:
        return single_figures(result)

    async def run(self, state: RunState, client: Sender, target: Target) -> None:
        opts = state.options
        spec = LevelSpec(tag="single", mode="single", concurrency=1, stall=StallWatch(),
                         planned_requests=opts.single_requests)

        async def load():
            return await run_single(client, opts.workload, target, state.recorder, requests=opts.single_requests,
                                    warmup=0, stall=spec.stall)

        await run_level(state, spec, load)
