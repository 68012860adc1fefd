"""Closed-loop load: single stream, and concurrency levels where each worker sends when its last request ends.

Each mode returns its records and its measurement window; bench/metrics.py turns those into figures.
- single stream: requests one after another; window = first send .. last end.
- concurrency level c: c workers each send their next request as soon as the previous one ends, for
  `duration_s` (or until `max_requests` were sent). The window is first send .. the moment the workers stopped
  sending new requests: requests still running then finish and are recorded, but their tokens after the window
  do not count toward aggregate throughput, so the tail where fewer than c streams run does not dilute it.
  With a LevelControl carrying the steady-state rule (what `bench` passes), the level runs past its duration
  until the rule holds, within a cap (bench/loads/control.py).
Neither mode cancels a request itself, except that a level which reaches its cap cancels what is still in
flight a grace period later (recorded as cancelled, the detail naming the cap). When the level is cancelled
(Ctrl-C), the requests in flight are recorded with error_kind "cancelled" and what they had received, through
the recorder like any other record, before the cancellation goes on (Recorder.add_cancelled).
"""

from __future__ import annotations

import asyncio
import time

from servelab.bench.sender import Sender
from servelab.bench.loads.common import Recorder, Target, level_running, make_spec
from servelab.bench.loads.control import Backoff, LevelControl, StallWatch
from servelab.records import RequestRecord


async def run_single(client: Sender, workload, target: Target, recorder: Recorder, *,
                     requests: int, warmup: int = 1, tag: str = "single", stall: StallWatch | None = None
                     ) -> tuple[list[RequestRecord], tuple[int, int]]:
    """`requests` one after another. With `stall` (a StallWatch), the level ends once it says the server stopped
    answering; `stall.not_sent` is then how many were left."""
    # Every token event of a request lies between its send and its end, so inside this level's window (first
    # send .. last end) by construction: the tally folds each as it comes (a floor that is always past it).
    measured = recorder.level(floor=_past_everything)
    span = _Span()
    try:
        for _ in range(warmup):
            recorder.add(await client.send(make_spec(workload, target, recorder, tag, warmup=True)))
        for sent in range(1, requests + 1):
            record = await client.send(make_spec(workload, target, recorder, tag))
            recorder.add(record)
            measured.append(record)
            span.add(record)
            if stall is not None:
                stall.see(record)
                if stall.stalled:  # the server stopped answering: the rest would each wait out the deadline
                    stall.not_sent = requests - sent
                    break
    except asyncio.CancelledError:
        recorder.add_cancelled(client, measured)
        raise
    return measured, span.window()


async def run_concurrency(client: Sender, workload, target: Target, recorder: Recorder, *,
                          concurrency: int, duration_s: float | None, max_requests: int | None = None,
                          tag: str | None = None, control: LevelControl | None = None
                          ) -> tuple[list[RequestRecord], tuple[int, int]]:
    """`duration_s`, `max_requests` or both bound the level; with neither it would never end. With `control`
    (made with a steady-state rule, bench/loads/control.py) the level runs until that rule, its budget or its cap
    ends it, and workers back off after failures; `control.ended_by` says afterwards what ended it."""
    if duration_s is None and max_requests is None:
        raise ValueError("a concurrency level needs a duration, a request count, or both")
    tag = tag or f"c{concurrency}"
    control = control or LevelControl(None, duration_s=duration_s, max_requests=max_requests)
    span = _Span()

    async def worker() -> None:
        backoff = Backoff(control.rule) if control.rule is not None else None
        while control.may_send():
            control.sending(time.perf_counter_ns())
            record = await client.send(make_spec(workload, target, recorder, tag))
            recorder.add(record)
            measured.append(record)
            span.add(record)
            control.finished(record)
            if backoff is not None:
                await control.pause(backoff.after(record))

    start_ns = time.perf_counter_ns()
    async with level_running(control, recorder, client, start_ns) as level:
        measured = level.measured
        # No more workers than requests the budget allows: `--concurrency 1000000000 --requests 4` starts four.
        workers = concurrency if max_requests is None else min(concurrency, max_requests)
        level.tasks.extend(asyncio.create_task(worker()) for _ in range(workers))
        await control.drain(level.tasks, client, recorder, measured)
    # The window ends when the load generator stopped offering new work: at the deadline (or where the
    # steady-state rule first held, or at the cap), or at the last send when the request budget ran out first.
    window_end = control.window()[1]
    if window_end <= start_ns:  # a budget of fewer requests than workers: fall back to the whole span
        window_end = span.last if span.first is not None else start_ns
    return measured, (start_ns, window_end)


def _past_everything() -> int:
    return 2**63 - 1


class _Span:
    """First send and last end (or send) of a level's measured requests, kept as they finish."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.last = 0

    def add(self, record: RequestRecord) -> None:
        if self.first is None:
            self.first = record.t_send_ns
        self.last = max(self.last, record.t_end_ns or record.t_send_ns)

    def window(self) -> tuple[int, int]:
        return (self.first, self.last) if self.first is not None else (0, 0)
