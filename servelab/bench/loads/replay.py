"""Trace replay: requests go out at the trace's own (time-scaled) arrival times, whatever the server is doing.

The same sender as an open-loop rate level (bench/loads/open_loop.py): every request is built before the clock
starts, the sender sleeps until each absolute due time and hands the request to a task of its own, so lateness
never accumulates, and each record carries its scheduled time (client lag = send − scheduled). Only the
schedule differs: the trace's offsets instead of a drawn process. Window: first .. last scheduled send.
"""

from __future__ import annotations

import asyncio
import time

from servelab.bench.sender import Sender
from servelab.bench.loads.common import Recorder, Target, level_running
from servelab.bench.loads.control import LevelControl
from servelab.bench.loads.open_loop import START_LEAD_NS, sleep_until
from servelab.records import RequestRecord


async def run_trace(client: Sender, workload, target: Target, recorder: Recorder, *, count: int | None = None,
                    tag: str = "trace", control: LevelControl | None = None
                    ) -> tuple[list[RequestRecord], tuple[int, int]]:
    """Replay the first `count` entries of `workload` (a TraceWorkload; None: all of them)."""
    offsets = workload.offsets_ns(count)
    control = control or LevelControl(None, duration_s=None, max_requests=len(offsets), open_loop=True)
    specs = []
    for k in range(len(offsets)):
        spec = workload.request(k, target.model, tag=tag, accepts_ignore_eos=target.accepts_ignore_eos,
                                accepts_min_tokens=target.accepts_min_tokens)
        spec.index = recorder.take_index()
        specs.append(spec)
    async def one(spec, scheduled_ns: int) -> None:
        record = await client.send(spec, scheduled_ns=scheduled_ns)
        recorder.add(record)
        measured.append(record)
        control.finished(record)

    start_ns = time.perf_counter_ns() + START_LEAD_NS
    async with level_running(control, recorder, client, start_ns) as level:
        measured = level.measured
        for spec, offset in zip(specs, offsets):
            due_ns = start_ns + offset
            await sleep_until(due_ns, control)
            if not control.may_send(due_ns):
                break
            control.sending(due_ns)
            level.tasks.append(asyncio.create_task(one(spec, due_ns)))
        control.end_schedule()
        await control.drain(level.tasks, client, recorder, measured)
    return measured, control.window()
