"""Open-loop load: requests go out at scheduled times whatever the server is doing.

The schedule (bench/loads/arrivals.py) is computed, and every request body due within the level's duration built,
before the clock starts (requests of an extension past it, bench/loads/control.py, are built as they fall due, and
so are those past PREBUILD_BYTES of bytes that bodies hold alone: synthetic images). The sender then only sleeps
until each absolute target time and hands the request to a task of its own: it never waits for a response, and
because it sleeps until absolute targets rather than for an interval after each send, lateness never accumulates.
Each record carries its scheduled time, so client lag (send - scheduled) shows when the client, not the server,
limited the load.

With `max_concurrency`, a request whose time has come waits for one of that many slots (vLLM's
`--max-concurrency` with a request rate); its lag then includes that wait, which is the cap doing its job.

Measurement window: first scheduled send .. last scheduled send (docs/metrics.md#open-loop-window). It is the span
over which the load was offered at the requested rate; requests still running after it finish and are recorded,
but only their tokens inside the window count toward aggregate throughput. The level never cancels a request at
the end of its window (except, with the steady-state rule, the requests still in flight a grace period after
the level's cap: bench/loads/control.py); when the level itself is cancelled (Ctrl-C), it cancels the requests
in flight, waits for them, and passes them on recorded with error_kind "cancelled" (Recorder.add_cancelled).
Requests whose time had not come, or that were still waiting for a slot, were never sent and leave no record.
"""

from __future__ import annotations

import asyncio
import time

from servelab.bench.client import RequestSpec
from servelab.bench.sender import Sender
from servelab.bench.loads.arrivals import Arrival, schedule_ns
from servelab.bench.loads.common import Recorder, Target, level_running, make_spec
from servelab.bench.loads.control import LevelControl
from servelab.records import RequestRecord

# The clock starts this long after the schedule is ready, so the first send is not late by set-up work.
START_LEAD_NS = 5_000_000
LONG_WAIT_NS = 250_000_000
PREBUILD_BYTES = 256 << 20  # a level's bodies built before its clock, past which the rest are built when due
NS_PER_S = 1_000_000_000


def rate_tag(rate: float) -> str:
    return f"r{rate:g}"


async def run_rate(client: Sender, workload, target: Target, recorder: Recorder, *, rate: float,
                   arrival: Arrival = "poisson", burstiness: float = 1.0, seed: int = 0,
                   requests: int | None = None, duration_s: float | None = None,
                   max_concurrency: int | None = None, tag: str | None = None,
                   control: LevelControl | None = None) -> tuple[list[RequestRecord], tuple[int, int]]:
    """One open-loop level at `rate` requests/s, bounded by `requests`, `duration_s` or both. With `control`
    (made with a steady-state rule) the schedule goes on past `duration_s` until the rule holds, up to the cap;
    the requests due within the duration are built before the clock starts, later ones as they fall due."""
    tag = tag or rate_tag(rate)
    control = control or LevelControl(None, duration_s=duration_s, max_requests=requests, open_loop=True)
    horizon = control.cap_s if control.rule is not None and control.cap_s is not None else duration_s
    offsets = schedule_ns(rate=rate, arrival=arrival, burstiness=burstiness, seed=seed, count=requests,
                          duration_s=horizon)
    planned_ns = int(duration_s * NS_PER_S) if duration_s is not None else None
    due_in_duration = sum(1 for o in offsets if planned_ns is None or o < planned_ns)
    prebuilt = prebuild(workload, target, recorder, tag, due_in_duration)
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def one(spec: RequestSpec, scheduled_ns: int) -> None:
        if slots is None:
            record = await client.send(spec, scheduled_ns=scheduled_ns)
        else:
            async with slots:
                record = await client.send(spec, scheduled_ns=scheduled_ns)
        recorder.add(record)
        measured.append(record)
        control.finished(record)

    # A pool of workers (bench/workers/) takes each request this long before its time and holds it until then
    # on the worker's clock; this process's own client sends at the time (lead 0).
    lead_ns = client.dispatch_lead_ns
    start_ns = time.perf_counter_ns() + START_LEAD_NS
    async with level_running(control, recorder, client, start_ns) as level:
        measured = level.measured
        for k, offset in enumerate(offsets):
            due_ns = start_ns + offset
            await sleep_until(due_ns - lead_ns, control)
            if not control.may_send(due_ns):
                break
            if k < len(prebuilt):
                spec, prebuilt[k] = prebuilt[k], None  # its task holds it now: the list need not
            else:
                spec = make_spec(workload, target, recorder, tag)
            control.sending(due_ns)
            level.tasks.append(asyncio.create_task(one(spec, due_ns)))
        control.end_schedule()
        await control.drain(level.tasks, client, recorder, measured)
    return measured, control.window()


def prebuild(workload, target: Target, recorder: Recorder, tag: str, count: int) -> list[RequestSpec | None]:
    """The first `count` requests, built before the clock starts, until the bytes they hold alone pass
    PREBUILD_BYTES (requests with synthetic images: 600 requests of a 1024x1024 image are 2.4 GB); the rest are
    built as they fall due, which costs the sender a copy of the image per send (in its client lag)."""
    built: list[RequestSpec | None] = []
    held = 0
    while len(built) < count and held < PREBUILD_BYTES:
        spec = make_spec(workload, target, recorder, tag)
        held += spec.own_bytes
        built.append(spec)
    return built


async def sleep_until(due_ns: int, control: LevelControl) -> None:
    """Sleep until `due_ns`; long waits (a low rate) in steps, so a level that ends meanwhile stops waiting. Never
    returns early: an event loop's timer may fire up to a millisecond before its time (uvloop rounds to whole
    milliseconds), so a short sleep is checked again, and the send is never ahead of its schedule."""
    while True:
        delay_ns = due_ns - time.perf_counter_ns()
        if delay_ns <= 0:
            return
        if delay_ns <= LONG_WAIT_NS:
            await asyncio.sleep(delay_ns / NS_PER_S)
            continue
        await asyncio.sleep(LONG_WAIT_NS / NS_PER_S)
        if control.ended:
            return
