"""Issue 14: the bench client leaves nothing behind a finished request.

The client moves what is alive into the collector's permanent generation every quarter second (client.py
`_keep_collector_pauses_short`), so any reference cycle a request leaves is never collected: before this was
found, every stream's records, chunks and exchange stayed in memory (~3.7 MB/s at 64 streams). The test finds
cycles directly: with freezing off and the collector saving what it finds (DEBUG_SAVEALL), requests that end
every way a stream can end must leave no garbage cycle holding a record, a stream or an exchange.
"""

from __future__ import annotations

import asyncio
import gc

import pytest

from servelab import aio
from servelab.bench import client as client_module
from servelab.bench.client import ClientOptions, Deadlines, RequestSpec, StreamClient
from servelab.calibration import Script, start_calibration_server

ENDINGS = [{}, {"http_status": 500}, {"disconnect_after_events": 3}, {"in_band_error_after_events": 2},
           {"invalid_json_after_events": 2}, {"stall_after_events": 2}]


@pytest.fixture(scope="module")
def cal():
    with start_calibration_server(Script(ttft_ms=5, itl_ms=2, output_tokens=12)) as handle:
        yield handle


def test_finished_requests_leave_no_reference_cycle(cal, monkeypatch) -> None:
    monkeypatch.setattr(client_module.StreamClient, "_keep_collector_pauses_short", lambda self: None)
    kinds: list[str | None] = []

    async def main() -> list[str]:
        opts = ClientOptions(deadlines=Deadlines(idle_s=0.5))
        async with StreamClient(cal.url, opts) as client:
            async def one(script: dict) -> None:
                body = {"model": "calibration", "messages": [{"role": "user", "content": "x"}], "max_tokens": 12,
                        "calibration": script}
                kinds.append((await client.send(RequestSpec(endpoint="/v1/chat/completions", body=body)))
                             .error_kind)

            for script in ENDINGS:  # warm: imports, caches and the loop's own objects settle first
                await one(script)
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                await asyncio.gather(*(one(script) for script in ENDINGS * 3))
                gc.collect()
                return sorted({type(o).__name__ for o in gc.garbage})
            finally:
                gc.set_debug(0)
                gc.garbage.clear()

    left = aio.run(main())
    assert set(kinds) == {None, "http", "disconnect", "in_band", "parse", "timeout_idle"}  # every ending ran
    held = {"RequestRecord", "TokenEvent", "RawChunk", "_StreamState", "_StreamHandler", "Exchange", "frame"}
    assert not held & set(left), left
