"""Open-loop load: requests go out at scheduled times whatever the server is doing.

The schedule (bench/loads/arrivals.py) is computed, and every request body built, before the clock starts. The
sender then only sleeps until each absolute target time and hands the request to a task of its own: it never
waits for a response, and because it sleeps until absolute targets rather than for an interval after each send,
lateness never accumulates. Each record carries its scheduled time, so client lag (send - scheduled) shows when
the client, not the server, limited the load.

With `max_concurrency`, a request whose time has come waits for one of that many slots (vLLM's
`--max-concurrency` with a request rate); its lag then includes that wait, which is the cap doing its job.

Measurement window: first scheduled send .. last scheduled send (docs/metrics.md#open-loop-window). It is the span
over which the load was offered at the requested rate; requests still running after it finish and are recorded,
but only their tokens inside the window count toward aggregate throughput. The level never cancels a request at
the end of its window; when the level itself is cancelled (Ctrl-C), it cancels the requests in flight, waits for
them, and passes them on recorded with error_kind "cancelled" (Recorder.add_cancelled). Requests whose time had
not come, or that were still waiting for a slot, were never sent and leave no record.
"""

from __future__ import annotations

import asyncio
import time

from servelab.bench.client import RequestSpec, StreamClient
from servelab.bench.loads.arrivals import Arrival, schedule_ns
from servelab.bench.loads.common import Recorder, Target, make_spec
from servelab.records import RequestRecord

# The clock starts this long after the schedule is ready, so the first send is not late by set-up work.
START_LEAD_NS = 5_000_000


def rate_tag(rate: float) -> str:
    return f"r{rate:g}"


async def run_rate(client: StreamClient, workload, target: Target, recorder: Recorder, *, rate: float,
                   arrival: Arrival = "poisson", burstiness: float = 1.0, seed: int = 0,
                   requests: int | None = None, duration_s: float | None = None,
                   max_concurrency: int | None = None, tag: str | None = None
                   ) -> tuple[list[RequestRecord], tuple[int, int]]:
    """One open-loop level at `rate` requests/s, bounded by `requests`, `duration_s` or both."""
    tag = tag or rate_tag(rate)
    offsets = schedule_ns(rate=rate, arrival=arrival, burstiness=burstiness, seed=seed, count=requests,
                          duration_s=duration_s)
    specs = [make_spec(workload, target, recorder, tag) for _ in offsets]
    measured: list[RequestRecord] = []
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def one(spec: RequestSpec, scheduled_ns: int) -> None:
        if slots is None:
            record = await client.send(spec, scheduled_ns=scheduled_ns)
        else:
            async with slots:
                record = await client.send(spec, scheduled_ns=scheduled_ns)
        recorder.add(record)
        measured.append(record)

    tasks: list[asyncio.Task] = []
    start_ns = time.perf_counter_ns() + START_LEAD_NS
    try:
        for offset, spec in zip(offsets, specs):
            due_ns = start_ns + offset
            delay_ns = due_ns - time.perf_counter_ns()
            if delay_ns > 0:
                await asyncio.sleep(delay_ns / 1e9)
            tasks.append(asyncio.create_task(one(spec, due_ns)))
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        # Interrupted: stop the requests in flight and wait for them (a cancelled gather already did; one
        # cancelled while the sender slept did not), so each is recorded as cancelled before the level ends.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        recorder.add_cancelled(client, measured)
        raise
    finally:
        for task in tasks:  # only when stopped by an exception: a finished gather leaves nothing to cancel
            task.cancel()
    return measured, (start_ns + offsets[0], start_ns + offsets[-1])
