"""burst: `--requests N` requests sent at once, as one level (tag `b<N>`, a concurrency-style summary at
concurrency N): how the server takes a queue it did not see coming. Every request body is built before the first
send. The window is first send .. last end, as for single stream: every token event of the level lies inside it,
so the level has no steady-state rule (a burst ends when its requests do)."""

from __future__ import annotations

import asyncio

from servelab.bench.headline import concurrency_peak
from servelab.bench.level_spec import LevelSpec
from servelab.bench.levels import run_level
from servelab.bench.loads import Recorder, Target, make_spec
from servelab.bench.loads.common import stop_in_flight
from servelab.bench.modes.registry import Mode, mode
from servelab.bench.sender import Sender
from servelab.bench.state import BenchOptions, RunState
from servelab.errors import UserError
from servelab.records import BenchResult, Figure, RequestRecord

PAST_EVERYTHING_NS = 2**63 - 1  # the window's end is the last end: every event is inside it as it comes


async def send_at_once(client: Sender, workload, target: Target, recorder: Recorder, *, requests: int, tag: str
                       ) -> tuple[list[RequestRecord], tuple[int, int]]:
    measured = recorder.level(floor=lambda: PAST_EVERYTHING_NS)
    specs = [make_spec(workload, target, recorder, tag) for _ in range(requests)]
    sends: list[int] = []
    ends: list[int] = []

    async def one(spec) -> None:
        record = await client.send(spec)
        recorder.add(record)
        measured.append(record)
        sends.append(record.t_send_ns)
        ends.append(record.t_end_ns or record.t_send_ns)

    tasks = [asyncio.create_task(one(spec)) for spec in specs]
    try:
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        await stop_in_flight(tasks, client, recorder, measured)  # in flight -> cancelled
        raise
    return measured, ((min(sends), max(ends)) if sends else (0, 0))


@mode("burst")
class Burst(Mode):
    description = "--requests N sent at once"

    def validate(self, options: BenchOptions) -> None:
        if not options.plan.requests:
            raise UserError("--mode burst needs --requests N (how many are sent at once)")

    def peak_streams(self, options: BenchOptions) -> int:
        return options.plan.requests or 1

    def most_streams(self, options: BenchOptions) -> int:
        return self.peak_streams(options)

    def streams_needed(self, options: BenchOptions) -> tuple[int, str]:
        return self.peak_streams(options), f"--requests {self.peak_streams(options):,}"

    def planned_requests(self, options: BenchOptions) -> int | None:
        return options.plan.requests

    def describe_load(self, options: BenchOptions) -> dict:
        return {"requests_at_once": options.plan.requests} | options.plan.describe_slos()

    def headline(self, result: BenchResult) -> dict[str, Figure]:
        return concurrency_peak(result)

    async def run(self, state: RunState, client: Sender, target: Target) -> None:
        opts = state.options
        n = opts.plan.requests
        spec = LevelSpec(tag=f"b{n}", mode="concurrency", concurrency=n, planned_requests=n,
                         load={"requests": n, "at_once": True, "window": "first send .. last end"})

        async def load():
            return await send_at_once(client, opts.workload, target, state.recorder, requests=n, tag=spec.tag)

        await run_level(state, spec, load)
