"""replay: a trace's requests (the first --requests of them, or all) at their time-scaled arrival times, as one
level (bench/loads/replay.py); tag `trace`, mode "rate", whose `rate` is the mean offered rate. The level's `load`
holds the trace's own implied cache hit ratio beside the one the engine reported (bench/workloads/traces.py).
Every trace request is in the level's budget, so the level ends when all were sent."""

from __future__ import annotations

from servelab.bench.headline import rate_peak
from servelab.bench.level_spec import LevelSpec
from servelab.bench.levels import run_level
from servelab.bench.loads import Target
from servelab.bench.loads.control import LevelControl
from servelab.bench.loads.replay import run_trace
from servelab.bench.modes.registry import Mode, mode
from servelab.bench.sender import Sender
from servelab.bench.state import BenchOptions, RunState
from servelab.bench.workloads.traces import TraceWorkload
from servelab.errors import UserError
from servelab.records import BenchResult, Figure


@mode("replay")
class Replay(Mode):
    description = "a trace's arrival times and lengths"

    def validate(self, options: BenchOptions) -> None:
        if not isinstance(options.workload, TraceWorkload):
            raise UserError("--mode replay needs a trace (--dataset FILE with --dataset-format mooncake, azure or "
                            "burstgpt)")

    def describe_load(self, options: BenchOptions) -> dict:
        # the trace's own schedule (its level's `load` says how it was scaled)
        return options.plan.describe_bounds() | {"schedule": "the trace's arrival times, time-scaled"}

    def headline(self, result: BenchResult) -> dict[str, Figure]:
        return rate_peak(result)

    async def run(self, state: RunState, client: Sender, target: Target) -> None:
        opts, plan = state.options, state.options.plan
        workload = opts.workload
        count = min(plan.requests or len(workload.entries), len(workload.entries))
        offsets = workload.offsets_ns(count)
        span_s = offsets[-1] / 1e9
        rate = (count - 1) / span_s if span_s > 0 else None
        load = {"requests": count, "time_scale": workload.time_scale, "replay_span_s": span_s,
                "mean_rate": rate, "implied_cache_hit_ratio": workload.implied_hit_ratio(count),
                "window": "first scheduled send .. last scheduled send"}
        control = LevelControl(opts.steady, duration_s=None, max_requests=count, open_loop=True)
        spec = LevelSpec(tag="trace", mode="rate", concurrency=0, rate=rate, load=load, control=control)

        async def generate():
            records, window = await run_trace(client, workload, target, state.recorder, count=count, tag="trace",
                                              control=control)
            load["sent"] = len(records)
            return records, window

        await run_level(state, spec, generate)
