"""Many streams written from one timer: the calibration server's cheap writer, for measuring a client's ceiling.

The precise writer (server.py) gives every stream its own `asyncio.sleep` per event and aiohttp's response writer
per write: ~30 us of server CPU per event on this machine, so at a few hundred streams the server, not the
client under test, runs out of CPU and every client looks equally good. Here one timer serves all streams: at
each wake-up every due write goes straight to its socket (`transport.write` of bytes framed as HTTP chunks
ahead of time), and the truth records each write's time as usual. The schedule is only as precise as the event
loop's timers (~1 ms), which does not matter: clients are judged against what was written and when, never
against the schedule.

Use it with `--writer ticker` (or `start_calibration_server(..., writer="ticker")`); it runs the same plans
(faults, split characters, comments) as the precise writer.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Iterator

from servelab.calibration.writes import Truth, Write


def http_chunk(data: bytes) -> bytes:
    """`data` framed as one chunk of a chunked HTTP/1.1 body (the response's headers said so)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class _Stream:
    __slots__ = ("transport", "writes", "pending", "truth", "t0", "done")

    def __init__(self, transport: asyncio.Transport, writes: Iterator[Write], truth: Truth, t0: int,
                 done: asyncio.Future[None]):
        self.transport, self.writes, self.truth, self.t0, self.done = transport, writes, truth, t0, done
        self.pending: Write | None = None


class Ticker:
    """Holds every ticker stream's next write in one heap ordered by due time; one timer wakes for the earliest."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, _Stream]] = []
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due: int | None = None

    def stream(self, transport: asyncio.Transport, writes: Iterator[Write], truth: Truth) -> asyncio.Future[None]:
        """Write `writes` to `transport` on schedule (due times count from the truth's receipt). The future
        resolves once all are out, or raises ConnectionError if the client went away first."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        s = _Stream(transport, writes, truth, truth.request_received_ns, done)
        self._advance(s, time.perf_counter_ns())
        self._arm()
        return done

    def _advance(self, s: _Stream, now: int) -> None:
        """Write what is due for `s` (its pending write, then any that need no waiting) and queue the next."""
        transport = s.transport
        while True:
            if transport.is_closing():
                if not s.done.done():
                    s.done.set_exception(ConnectionError("the client closed the connection"))
                return
            write = s.pending
            if write is None:
                write = next(s.writes, None)
                if write is None:
                    if not s.done.done():
                        s.done.set_result(None)
                    return
                if write.lead:  # written right after the previous write, ahead of its due time
                    transport.write(http_chunk(write.lead))
                if write.due_ns is not None and s.t0 + write.due_ns > now:
                    s.pending = write
                    heapq.heappush(self._heap, (s.t0 + write.due_ns, next(self._seq), s))
                    return
            s.pending = None
            transport.write(http_chunk(write.data))
            s.truth.record(write, time.perf_counter_ns())

    def _arm(self) -> None:
        if not self._heap:
            return
        due = self._heap[0][0]
        if self._timer is not None:
            if self._timer_due is not None and self._timer_due <= due:
                return
            self._timer.cancel()
        delay = max(due - time.perf_counter_ns(), 0) / 1e9
        self._timer, self._timer_due = asyncio.get_running_loop().call_later(delay, self._tick), due

    def _tick(self) -> None:
        self._timer = self._timer_due = None
        heap = self._heap
        now = time.perf_counter_ns()
        while heap and heap[0][0] <= now:
            _, _, s = heapq.heappop(heap)
            self._advance(s, now)
        self._arm()
