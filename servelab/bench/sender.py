"""What the load modes and the runner need of the client that sends a bench's requests: this process's StreamClient
(bench/client.py) and a pool of worker processes (bench/workers/coordinator.py WorkerPool) both are one."""

from __future__ import annotations

from typing import Protocol

from servelab.bench.client import RequestSpec
from servelab.records import RequestRecord, WorkerProvenance


class Sender(Protocol):
    # Requests in flight when their task was cancelled, recorded as "cancelled" (the Recorder takes them from here).
    cancelled: list[RequestRecord]
    # How long before its scheduled time an open-loop request is handed over (a pool holds it on the worker's
    # clock until then; this process sends at the time: 0).
    dispatch_lead_ns: int
    # How many processes send (the client ceiling of `servelab selftest` is per process).
    processes: int

    async def send(self, spec: RequestSpec, scheduled_ns: int | None = None) -> RequestRecord: ...

    def abandoned(self) -> list[RequestRecord]:
        """Sends whose coroutine ended without recording themselves, moved to `cancelled`."""
        ...

    @property
    def local_pids(self) -> list[int]:
        """The sending processes on this host other than this one (their CPU is the client's, not other load)."""
        ...

    def provenance(self) -> list[WorkerProvenance]:
        """Each worker's host, clock and requests (empty: this process sent them)."""
        ...
