"""Closed-loop load: single stream, and concurrency levels where each worker sends when its last request ends.

Each mode returns its records and its measurement window; bench/metrics.py turns those into figures.
- single stream: requests one after another; window = first send .. last end.
- concurrency level c: c workers each send their next request as soon as the previous one ends, for
  `duration_s` (or until `max_requests` were sent). The window is first send .. the moment the workers stopped
  sending new requests: requests still running then finish and are recorded, but their tokens after the window
  do not count toward aggregate throughput, so the tail where fewer than c streams run does not dilute it.
Neither mode cancels a request itself. When the level is cancelled (Ctrl-C), the requests in flight are recorded
with error_kind "cancelled" and what they had received, through the recorder like any other record, before the
cancellation goes on (Recorder.add_cancelled).
"""

from __future__ import annotations

import asyncio
import time

from servelab.bench.client import StreamClient
from servelab.bench.loads.common import Recorder, Target, make_spec
from servelab.records import RequestRecord


async def run_single(client: StreamClient, workload, target: Target, recorder: Recorder, *,
                     requests: int, warmup: int = 1, tag: str = "single") -> tuple[list[RequestRecord],
                                                                                 tuple[int, int]]:
    measured: list[RequestRecord] = []
    try:
        for _ in range(warmup):
            recorder.add(await client.send(make_spec(workload, target, recorder, tag, warmup=True)))
        for _ in range(requests):
            record = await client.send(make_spec(workload, target, recorder, tag))
            recorder.add(record)
            measured.append(record)
    except asyncio.CancelledError:
        recorder.add_cancelled(client, measured)
        raise
    if not measured:
        return measured, (0, 0)
    return measured, (measured[0].t_send_ns, max(r.t_end_ns or r.t_send_ns for r in measured))


async def run_concurrency(client: StreamClient, workload, target: Target, recorder: Recorder, *,
                          concurrency: int, duration_s: float | None, max_requests: int | None = None,
                          tag: str | None = None) -> tuple[list[RequestRecord], tuple[int, int]]:
    """`duration_s`, `max_requests` or both bound the level; with neither it would never end."""
    if duration_s is None and max_requests is None:
        raise ValueError("a concurrency level needs a duration, a request count, or both")
    tag = tag or f"c{concurrency}"
    measured: list[RequestRecord] = []
    start_ns = time.perf_counter_ns()
    stop_ns = start_ns + int(duration_s * 1e9) if duration_s is not None else None
    sent = 0
    last_send_ns = start_ns

    async def worker() -> None:
        nonlocal sent, last_send_ns
        while (stop_ns is None or time.perf_counter_ns() < stop_ns) and (max_requests is None
                                                                          or sent < max_requests):
            sent += 1
            last_send_ns = time.perf_counter_ns()
            record = await client.send(make_spec(workload, target, recorder, tag))
            recorder.add(record)
            measured.append(record)

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    except asyncio.CancelledError:
        # gather has cancelled every worker and waited for it, so each request in flight is on client.cancelled.
        recorder.add_cancelled(client, measured)
        raise
    # The window ends when the load generator stopped offering new work: at the deadline, or at the last send
    # when the request budget ran out first.
    budget_spent = max_requests is not None and sent >= max_requests
    window_end = last_send_ns if budget_spent or stop_ns is None else stop_ns
    if window_end <= start_ns:  # a budget of fewer requests than workers: fall back to the whole span
        window_end = max((r.t_end_ns or r.t_send_ns) for r in measured) if measured else start_ns
    return measured, (start_ns, window_end)
