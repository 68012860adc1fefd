"""`servelab selftest`: how much load this machine's servelab client can measure with accurate timing.

The calibration server (its own process) streams scripted tokens and records when it wrote each event; the
client records when it read each event; both use the system-wide monotonic clock, so their difference is the
client's timing error for that event (loopback delivery plus the client's own lag). Load rises stream by stream
(1, 2, 4, … concurrent streams, each at a fixed events/s) until the error's p99 exceeds the tolerance (1 ms by
default). The last level within tolerance is the client's ceiling, saved so `bench` can warn when a run asks for
load near it. The server shares this machine (its cheap `ticker` writer), so the ceiling is that of client +
server here: a conservative figure for the client alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path

from pydantic import BaseModel

from servelab import SCHEMA_VERSION
from servelab.bench.client import ClientOptions, Deadlines, RequestSpec, StreamClient
from servelab.bench.metrics import NS_PER_MS, percentile
from servelab.calibration import CalibrationHandle, separate_cpus, start_calibration_server
from servelab.provenance import host_info


class SelftestLevel(BaseModel):
    streams: int
    target_events_s: float
    events_s: float  # events the client received per second over the level
    tokens_s: float
    requests_s: float
    error_ms_p50: float
    error_ms_p99: float
    error_ms_max: float
    failed: int
    within_tolerance: bool


class SelftestResult(BaseModel):
    schema_version: int = SCHEMA_VERSION
    measured_at: str
    tolerance_ms: float
    tokens_per_event: int
    itl_ms: float
    levels: list[SelftestLevel]
    ceiling_streams: int | None
    ceiling_tokens_s: float | None
    ceiling_events_s: float | None
    host_cpu: str | None
    cpu_count: int | None


def cache_path() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return root / "servelab" / "selftest.json"


def load_ceiling() -> SelftestResult | None:
    try:
        return SelftestResult.model_validate_json(cache_path().read_text())
    except (OSError, ValueError):
        return None


async def _level(handle: CalibrationHandle, streams: int, *, itl_ms: float, tokens_per_event: int,
                 events_per_request: int, duration_s: float) -> SelftestLevel:
    script = {"ttft_ms": 0, "itl_ms": itl_ms, "tokens_per_event": tokens_per_event,
              "output_tokens": events_per_request * tokens_per_event, "usage_style": "llamacpp_timings"}
    body = {"model": "calibration", "messages": [{"role": "user", "content": "x"}], "calibration": script}
    ids: list[tuple[str, object]] = []
    opts = ClientOptions(stream_extras={"timings_per_token": True}, deadlines=Deadlines(idle_s=10, total_s=120))
    t0 = time.perf_counter_ns()
    stop = t0 + int(duration_s * 1e9)

    async with StreamClient(handle.url, opts) as client:
        async def worker() -> None:
            while time.perf_counter_ns() < stop:
                cid = uuid.uuid4().hex
                rec = await client.send(RequestSpec(endpoint="/v1/chat/completions", body=body,
                                                    headers={"X-Calibration-Id": cid}))
                ids.append((cid, rec))

        await asyncio.gather(*(worker() for _ in range(streams)))
    elapsed_s = (time.perf_counter_ns() - t0) / 1e9
    errors: list[float] = []
    events = tokens = failed = 0
    loop = asyncio.get_running_loop()
    for cid, rec in ids:
        if not rec.ok:
            failed += 1
            continue
        truth = await loop.run_in_executor(None, handle.truth, cid)
        client_t = [e.t_ns for e in rec.events if e.tokens]
        server_t = [e["t_ns"] for e in truth["events"]]
        errors.extend((c - s) / NS_PER_MS for c, s in zip(client_t, server_t))
        events += len(client_t)
        tokens += rec.output_tokens
    errors.sort()
    p99 = percentile(errors, 99) if errors else float("inf")
    return SelftestLevel(
        streams=streams, target_events_s=streams * 1000.0 / itl_ms if itl_ms else float("inf"),
        events_s=events / elapsed_s, tokens_s=tokens / elapsed_s, requests_s=(len(ids) - failed) / elapsed_s,
        error_ms_p50=percentile(errors, 50) if errors else float("inf"), error_ms_p99=p99,
        error_ms_max=errors[-1] if errors else float("inf"), failed=failed,
        within_tolerance=False)


async def run_selftest(*, tolerance_ms: float = 1.0, itl_ms: float = 5.0, tokens_per_event: int = 1,
                       max_streams: int = 256, level_duration_s: float = 2.0, events_per_request: int = 100,
                       on_level=None) -> SelftestResult:
    levels: list[SelftestLevel] = []
    # Beyond two streams the ticker writer keeps the server's CPU per event well below the client's, so the
    # ceiling found is the client's rather than the server's (errors are measured against actual write times).
    with start_calibration_server(writer="auto") as handle, separate_cpus(handle.proc.pid):
        streams = 1
        while streams <= max_streams:
            level = await _level(handle, streams, itl_ms=itl_ms, tokens_per_event=tokens_per_event,
                                 events_per_request=events_per_request, duration_s=level_duration_s)
            level.within_tolerance = level.failed == 0 and level.error_ms_p99 <= tolerance_ms
            levels.append(level)
            if on_level:
                on_level(level)
            if not level.within_tolerance:
                break
            streams *= 2
    good = [lv for lv in levels if lv.within_tolerance]
    best = good[-1] if good else None
    host = host_info()
    return SelftestResult(measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), tolerance_ms=tolerance_ms,
                          tokens_per_event=tokens_per_event, itl_ms=itl_ms, levels=levels,
                          ceiling_streams=best.streams if best else None,
                          ceiling_tokens_s=best.tokens_s if best else None,
                          ceiling_events_s=best.events_s if best else None,
                          host_cpu=host.cpu_model, cpu_count=host.cpu_cores_logical)


def save(result: SelftestResult) -> Path:
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.model_dump(), indent=2) + "\n")
    return path


def ceiling_warning(events_s: float, ceiling: SelftestResult | None) -> str | None:
    """A warning when a level received events at more than half the rate this machine's client measured
    accurately in selftest; None when fine or when no selftest has been run."""
    if ceiling is None or not ceiling.ceiling_events_s or events_s <= ceiling.ceiling_events_s / 2:
        return None
    return (f"the client received {events_s:,.0f} events/s, more than half of its measured ceiling "
            f"({ceiling.ceiling_events_s:,.0f} events/s within {ceiling.tolerance_ms:g} ms, `servelab selftest` "
            f"on {ceiling.measured_at}): client timing may limit these results")
