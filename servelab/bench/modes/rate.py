"""rate: one open-loop level at `--rate` requests/s (tag `r<R>`), arrivals as `--arrival` says, bounded by
`--requests`, `--duration` or both, capped at `--max-concurrency` requests in flight when given."""

from __future__ import annotations

from servelab.bench.headline import rate_peak
from servelab.bench.level_spec import LevelSpec
from servelab.bench.levels import run_level
from servelab.bench.loads import Target, rate_tag, run_rate
from servelab.bench.loads.control import LevelControl
from servelab.bench.modes.registry import Mode, mode
from servelab.bench.plans import LoadPlan
from servelab.bench.sender import Sender
from servelab.bench.state import BenchOptions, RunState
from servelab.errors import UserError
from servelab.records import BenchResult, Figure, Summary


async def rate_level(state: RunState, client: Sender, target: Target, rate: float) -> Summary:
    """One open-loop level at `rate` requests/s, bounded as the plan says (also a rate sweep's level and an SLO
    search's probe)."""
    opts, plan = state.options, state.options.plan
    requests, duration = plan.bounds(opts.level_duration_s)
    load = {"arrival": plan.arrival, "burstiness": plan.burstiness, "seed": plan.seed, "requests": requests,
            "duration_s": duration, "max_concurrency": plan.max_concurrency,
            "window": "first scheduled send .. last scheduled send"}
    control = LevelControl(opts.steady, duration_s=duration, max_requests=requests, open_loop=True)
    spec = LevelSpec(tag=rate_tag(rate), mode="rate", concurrency=plan.max_concurrency or 0, rate=rate, load=load,
                     control=control, planned_s=duration, cap_s=opts.steady.cap_s(duration),
                     planned_requests=requests)

    async def generate():
        records, window = await run_rate(client, opts.workload, target, state.recorder, rate=rate,
                                         arrival=plan.arrival, burstiness=plan.burstiness, seed=plan.seed,
                                         requests=requests, duration_s=duration,
                                         max_concurrency=plan.max_concurrency, tag=spec.tag, control=control)
        load["scheduled"] = len(records)
        return records, window

    return await run_level(state, spec, generate)


def open_loop_streams(options: BenchOptions) -> tuple[int, str] | None:
    """An open loop's streams are bounded in advance only by its --max-concurrency cap."""
    plan = options.plan
    if not plan.max_concurrency:
        return None
    streams = plan.max_concurrency if plan.requests is None else min(plan.max_concurrency, plan.requests)
    return streams, f"--max-concurrency {plan.max_concurrency:,}"


def describe_open_loop(options: BenchOptions) -> dict:
    plan = options.plan
    return plan.describe_bounds() | plan.describe_arrivals() | {"rates": plan.describe_rates()} | plan.describe_slos()


@mode("rate")
class Rate(Mode):
    description = "one open-loop level"

    def validate(self, options: BenchOptions) -> None:
        if not options.plan.rates:
            raise UserError("--mode rate needs --rate")

    def schedule_rates(self, plan: LoadPlan) -> list[float]:
        return list(plan.rates) or [plan.ramp_start, plan.max_rate]

    def streams_needed(self, options: BenchOptions) -> tuple[int, str] | None:
        return open_loop_streams(options)

    def planned_requests(self, options: BenchOptions) -> int | None:
        return options.plan.requests

    def describe_load(self, options: BenchOptions) -> dict:
        return describe_open_loop(options)

    def headline(self, result: BenchResult) -> dict[str, Figure]:
        return rate_peak(result)

    async def run(self, state: RunState, client: Sender, target: Target) -> None:
        await rate_level(state, client, target, state.options.plan.rates[0])
