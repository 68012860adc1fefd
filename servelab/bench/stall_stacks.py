"""The engine's stacks when a stream hits its idle deadline: what the server was doing while a stream went silent.

During `bench` against an engine on this host (its processes given by the launcher, or found listening on the
URL's port: host/environment.py), the first measured request of a level that ends with error_kind "timeout_idle"
(bench/client.py: no SSE event for the idle deadline) has the engine's stacks read (lifecycle/stacks/): at most
one capture per level, on a thread of its own, so the event loop and every other stream go on. At the level's
end its summary joins the level's warnings and its timeout_idle entries of `top_errors` (`stacks`), e.g.
"a stream hit its idle deadline; the engine's stacks then: 8 of 8 ranks idle in the request loop ...".
The level waits for a capture still running at its end at most CAPTURE_DEADLINE_S (never the event loop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any

from servelab.records import RequestRecord, StackReport, Summary

SAMPLES = 2  # two samples a second apart: enough to see whether the server's stacks move
INTERVAL_S = 1.0
CAPTURE_DEADLINE_S = 6.0
WARNING = "a stream hit its idle deadline; the engine's stacks then: "


def _read(pid: int, adapter: Any) -> StackReport:
    from servelab.lifecycle.stacks import read_stacks

    return read_stacks(pid, adapter, samples=SAMPLES, interval_s=INTERVAL_S, deadline_s=CAPTURE_DEADLINE_S)


class IdleDeadlineStacks:
    """One stack capture per level, started by its first stream that went idle past its deadline."""

    def __init__(self, engine_pids: Callable[[], Sequence[int]], adapter: Any = None,
                 reader: Callable[[int, Any], StackReport] = _read):
        self._engine_pids, self.adapter, self._reader = engine_pids, adapter, reader
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._capture: concurrent.futures.Future[StackReport] | None = None
        self.captures = 0

    def start_level(self) -> None:
        self._capture = None  # a capture from the level before, still running, is no longer this level's

    def watching(self, on_record: Callable[[RequestRecord], None] | None) -> Callable[[RequestRecord], None]:
        """`on_record`, which also looks at each record as it is passed on (on the event loop: never blocks)."""
        def see_then_pass(record: RequestRecord) -> None:
            self.see(record)
            if on_record is not None:
                on_record(record)
        return see_then_pass

    def see(self, record: RequestRecord) -> None:
        if record.error_kind != "timeout_idle" or record.warmup or self._capture is not None:
            return
        roots = list(self._engine_pids())
        if not roots:
            return  # not an engine on this host: no stacks to read
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="servelab-stacks")
        self.captures += 1
        self._capture = self._pool.submit(self._reader, roots[0], self.adapter)

    async def attach(self, summary: Summary) -> None:
        """The level's capture, if it had one, as a warning of its summary."""
        capture, self._capture = self._capture, None
        if capture is None:
            return
        try:
            report = await asyncio.wait_for(asyncio.wrap_future(capture), CAPTURE_DEADLINE_S + 2.0)
        except (asyncio.TimeoutError, Exception) as exc:  # the stacks are evidence, never a reason to lose a level
            summary.warnings.append(f"{WARNING}not read ({type(exc).__name__})")
            return
        said = report.unavailable or report.summary or "nothing to say"
        summary.warnings.append(WARNING + said)
        for error in summary.top_errors:  # and with the errors it explains
            if error.kind == "timeout_idle":
                error.stacks = said

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
