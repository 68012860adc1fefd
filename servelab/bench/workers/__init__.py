"""Load beyond one core and one host: the bench's requests sent by worker processes, or by Ray actors across a
Ray cluster, while one coordinator (the bench process) owns the schedule, the level control and every figure.

- protocol.py     frames between coordinator and workers (requests out, records back, clock pings)
- clock.py        where a worker's monotonic clock stands against the coordinator's, and how sure that is
- worker.py       the worker: a StreamClient driven by its coordinator (`python -m servelab.bench.workers.worker`)
- coordinator.py  WorkerPool: `send` as StreamClient's, over N workers; deaths, clocks, provenance
- ray_backend.py  the same workers placed as Ray actors (`servelab[ray]`; `--ray auto|ADDRESS`)

The load modes need no change to use a pool: it is a client whose `send` happens elsewhere (docs/metrics.md#clocks).
"""

from __future__ import annotations

import math
import os

from servelab.bench.client import ClientOptions
from servelab.bench.workers.coordinator import WorkerPool
from servelab.errors import UserError

__all__ = ["WorkerPool", "auto_workers", "open_pool", "parse_workers"]


def parse_workers(text: str | int | None) -> int | str | None:
    """--workers: a positive number or "auto"; None: not given (this process sends, as before)."""
    if text is None or isinstance(text, int):
        if isinstance(text, int) and text < 1:
            raise UserError(f"--workers must be at least 1 or auto (got {text})")
        return text
    if text.strip().lower() == "auto":
        return "auto"
    try:
        n = int(text)
    except ValueError:
        raise UserError(f"bad --workers '{text}'", hint="a number of worker processes, or auto") from None
    if not 1 <= n <= 1024:
        raise UserError(f"--workers {n} is out of range: 1 to 1,024")
    return n


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def auto_workers(streams: int | None, ceiling_streams: int | None, cpus: int | None = None) -> int:
    """--workers auto: enough workers that none carries more streams than one client timed accurately in
    `servelab selftest` (its ceiling), at most one per usable CPU but one (the coordinator's); without a
    selftest result, one per usable CPU but one. At least one."""
    cpus = cpus if cpus is not None else usable_cpus()
    most = max(1, cpus - 1)
    if not ceiling_streams or not streams:
        return most
    return max(1, min(most, math.ceil(streams / ceiling_streams)))


def open_pool(url: str, options: ClientOptions, workers: int | str, *, ray: str | None = None,
              on_warning=None) -> WorkerPool:
    backend = None
    if ray is not None:
        from servelab.bench.workers.ray_backend import RayActors

        backend = RayActors(ray)
    return WorkerPool(url, options, workers, backend=backend, on_warning=on_warning)
