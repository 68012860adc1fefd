"""Load modes: single stream and closed-loop concurrency levels, and the sweep that finds peak throughput.

Each mode returns its records and its measurement window; bench/metrics.py turns those into figures.
- single stream: requests one after another; window = first send .. last end.
- concurrency level c: c workers each send their next request as soon as the previous one ends, for
  `duration_s` (or until `max_requests` were sent). The window is first send .. the moment the workers stopped
  sending new requests: requests still running then finish and are recorded, but their tokens after the window
  do not count toward aggregate throughput, so the tail where fewer than c streams run does not dilute it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from servelab.bench.client import StreamClient
from servelab.bench.workload import Workload
from servelab.records import RequestRecord


@dataclass
class Recorder:
    """Collects records as they complete, so an interrupted run still has everything that finished."""

    records: list[RequestRecord] = field(default_factory=list)
    on_record: Callable[[RequestRecord], None] | None = None
    next_index: int = 0

    def take_index(self) -> int:
        i = self.next_index
        self.next_index += 1
        return i

    def add(self, record: RequestRecord) -> None:
        self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)


@dataclass(frozen=True)
class Target:
    model: str
    accepts_ignore_eos: bool = False


async def run_single(client: StreamClient, workload: Workload, target: Target, recorder: Recorder, *,
                     requests: int, warmup: int = 1, tag: str = "single") -> tuple[list[RequestRecord],
                                                                                 tuple[int, int]]:
    for _ in range(warmup):
        recorder.add(await client.send(_spec(workload, target, recorder, tag, warmup=True)))
    measured: list[RequestRecord] = []
    for _ in range(requests):
        record = await client.send(_spec(workload, target, recorder, tag))
        recorder.add(record)
        measured.append(record)
    if not measured:
        return measured, (0, 0)
    return measured, (measured[0].t_send_ns, max(r.t_end_ns or r.t_send_ns for r in measured))


async def run_concurrency(client: StreamClient, workload: Workload, target: Target, recorder: Recorder, *,
                          concurrency: int, duration_s: float, max_requests: int | None = None,
                          tag: str | None = None) -> tuple[list[RequestRecord], tuple[int, int]]:
    tag = tag or f"c{concurrency}"
    measured: list[RequestRecord] = []
    start_ns = time.perf_counter_ns()
    stop_ns = start_ns + int(duration_s * 1e9)
    sent = 0
    last_send_ns = start_ns

    async def worker() -> None:
        nonlocal sent, last_send_ns
        while time.perf_counter_ns() < stop_ns and (max_requests is None or sent < max_requests):
            sent += 1
            last_send_ns = time.perf_counter_ns()
            record = await client.send(_spec(workload, target, recorder, tag))
            recorder.add(record)
            measured.append(record)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    # The window ends when the load generator stopped offering new work: at the deadline, or at the last send
    # when the request budget ran out first.
    window_end = stop_ns if max_requests is None or sent < max_requests else last_send_ns
    if window_end <= start_ns:  # a budget of fewer requests than workers: fall back to the whole span
        window_end = max((r.t_end_ns or r.t_send_ns) for r in measured) if measured else start_ns
    return measured, (start_ns, window_end)


def _spec(workload: Workload, target: Target, recorder: Recorder, tag: str, warmup: bool = False):
    return workload.request(recorder.take_index(), target.model, tag=tag, warmup=warmup,
                            accepts_ignore_eos=target.accepts_ignore_eos)
