"""Where a worker's monotonic clock stands against the coordinator's.

Each side times with `time.perf_counter_ns()`. On Linux that is CLOCK_MONOTONIC, one clock for every process of
a host (same boot), so workers on the coordinator's host share its clock exactly; on another host it counts from
that host's boot. The coordinator measures it either way, the same code for both: it sends pings, the worker
answers each with its clock's reading, and for the exchange with the shortest round trip

    offset = worker reading - (coordinator send + coordinator receive) / 2,  error bound = round trip / 2

(the reading was taken somewhere inside the round trip, so the truth is within half of it; NTP's rule).
A worker on the same boot of the same host gets offset 0 *applied* (the clocks are one: a measured offset
there is only the measurement's noise), and its measured offset and bound are still recorded, as a check.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path


def boot_id() -> str | None:
    """This boot of this host (Linux); None elsewhere. Two processes with the same one share CLOCK_MONOTONIC."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def host_name() -> str:
    return socket.gethostname()


@dataclass(frozen=True)
class Exchange:
    sent_ns: int  # coordinator clock, ping out
    worker_ns: int  # worker clock, when it answered
    received_ns: int  # coordinator clock, pong in

    @property
    def rtt_ns(self) -> int:
        return self.received_ns - self.sent_ns

    @property
    def offset_ns(self) -> int:
        return self.worker_ns - (self.sent_ns + self.received_ns) // 2


@dataclass(frozen=True)
class ClockEstimate:
    offset_ns: int  # worker clock - coordinator clock, as measured
    error_ns: int  # half the best round trip: the offset is within +- this
    rtt_ns: int
    samples: int


def estimate(exchanges: list[Exchange]) -> ClockEstimate:
    """The offset from the exchange with the shortest round trip."""
    if not exchanges:
        raise ValueError("no clock exchanges")
    best = min(exchanges, key=lambda e: e.rtt_ns)
    return ClockEstimate(offset_ns=best.offset_ns, error_ns=(best.rtt_ns + 1) // 2, rtt_ns=best.rtt_ns,
                         samples=len(exchanges))
