"""`servelab selftest`: how much load this machine's servelab client can measure with accurate timing.

The calibration server (its own process) streams scripted tokens and records when it wrote each event; the
client records when it read each event; both use the system-wide monotonic clock, so their difference is the
client's timing error for that event (loopback delivery plus the client's own lag). Load rises stream by stream
(1, 2, 4, … concurrent streams, each at a fixed events/s) until the error's p99 exceeds the tolerance (1 ms by
default). The last level within tolerance is the client's ceiling, saved so `bench` can warn when a run asks for
load near it. The server shares this machine (its cheap `ticker` writer; on four CPUs or more, two server
processes sharing the port), so the ceiling is that of client + server here: a conservative figure for the client
alone. Each level also says how late the server's own writes were against their schedule and how busy its
processes were, and the result names which side was the limit at the first level out of tolerance: the server
(its writes fell behind, or its processes were saturated) or the client.
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
    # The server's side: how late its token writes went out against their targets (p99, ms), and the CPU its
    # processes used over the level (cores; all of them together).
    server_late_ms_p99: float | None = None
    server_cpu_cores: float | None = None


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
    server_processes: int = 1
    # Which side ran out at the first level out of tolerance: "client", "server", or None (none was).
    limit: str | None = None
    limit_reason: str | None = None


def cache_path() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return root / "servelab" / "selftest.json"


def load_ceiling() -> SelftestResult | None:
    try:
        return SelftestResult.model_validate_json(cache_path().read_text())
    except (OSError, ValueError):
        return None


def _cpu_s(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except (psutil.Error, OSError):
            pass
    return total


async def _level(handle: CalibrationHandle, streams: int, *, itl_ms: float, tokens_per_event: int,
                 events_per_request: int, duration_s: float) -> SelftestLevel:
    script = {"ttft_ms": 0, "itl_ms": itl_ms, "tokens_per_event": tokens_per_event,
              "output_tokens": events_per_request * tokens_per_event, "usage_style": "llamacpp_timings"}
    body = {"model": "calibration", "messages": [{"role": "user", "content": "x"}], "calibration": script}
    ids: list[tuple[str, object]] = []
    opts = ClientOptions(stream_extras={"timings_per_token": True}, deadlines=Deadlines(idle_s=10, total_s=120))
    t0 = time.perf_counter_ns()
    stop = t0 + int(duration_s * 1e9)
    server_cpu0 = _cpu_s(handle.pids)

    async with StreamClient(handle.url, opts) as client:
        async def worker() -> None:
            while time.perf_counter_ns() < stop:
                cid = uuid.uuid4().hex
                rec = await client.send(RequestSpec(endpoint="/v1/chat/completions", body=body,
                                                    headers={"X-Calibration-Id": cid}))
                ids.append((cid, rec))

        await asyncio.gather(*(worker() for _ in range(streams)))
    elapsed_s = (time.perf_counter_ns() - t0) / 1e9
    server_cores = (_cpu_s(handle.pids) - server_cpu0) / elapsed_s
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
    server = await loop.run_in_executor(None, handle.summary, t0)
    return SelftestLevel(
        streams=streams, target_events_s=streams * 1000.0 / itl_ms if itl_ms else float("inf"),
        events_s=events / elapsed_s, tokens_s=tokens / elapsed_s, requests_s=(len(ids) - failed) / elapsed_s,
        error_ms_p50=percentile(errors, 50) if errors else float("inf"), error_ms_p99=p99,
        error_ms_max=errors[-1] if errors else float("inf"), failed=failed,
        within_tolerance=False, server_late_ms_p99=server.get("late_ms_p99"),
        server_cpu_cores=round(server_cores, 3))


SERVER_BUSY_CORES = 0.9  # per server process: at or above this, the server, not the client, ran out


def which_limit(level: SelftestLevel, tolerance_ms: float, processes: int) -> tuple[str, str]:
    """Which side was the limit at a level out of tolerance, and why: the server when its writes fell behind
    their schedule by more than the tolerance at p99, or its processes were saturated; the client otherwise
    (the server kept its schedule, and the client still read the events late)."""
    late, cores = level.server_late_ms_p99, level.server_cpu_cores
    if late is not None and late > tolerance_ms:
        return "server", (f"the calibration server's own writes were {late:.2f} ms late at p99 (its schedule "
                          f"slipped) at {level.streams} streams")
    if cores is not None and cores >= SERVER_BUSY_CORES * processes:
        return "server", (f"the calibration server's {processes} process(es) used {cores:.2f} cores at "
                          f"{level.streams} streams")
    return "client", (f"the server kept its schedule ({late if late is not None else float('nan'):.2f} ms late "
                      f"at p99, {cores if cores is not None else float('nan'):.2f} cores) while the client's "
                      f"p99 error reached {level.error_ms_p99:.2f} ms at {level.streams} streams")


async def run_selftest(*, tolerance_ms: float = 1.0, itl_ms: float = 5.0, tokens_per_event: int = 1,
                       max_streams: int = 256, level_duration_s: float = 2.0, events_per_request: int = 100,
                       on_level=None, server_processes: int | None = None) -> SelftestResult:
    levels: list[SelftestLevel] = []
    # Beyond two streams the ticker writer keeps the server's CPU per event well below the client's, so the
    # ceiling found is the client's rather than the server's (errors are measured against actual write times);
    # with four CPUs or more two server processes share the port (and two CPUs), so it stays so.
    cpus = os.cpu_count() or 1
    processes = server_processes or (2 if cpus >= 4 else 1)
    with start_calibration_server(writer="auto", processes=processes) as handle, \
            separate_cpus(handle.pids, server_cpus=processes):
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
    out = next((lv for lv in levels if not lv.within_tolerance), None)
    limit, why = which_limit(out, tolerance_ms, processes) if out is not None else (None, None)
    host = host_info()
    return SelftestResult(measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), tolerance_ms=tolerance_ms,
                          tokens_per_event=tokens_per_event, itl_ms=itl_ms, levels=levels,
                          ceiling_streams=best.streams if best else None,
                          ceiling_tokens_s=best.tokens_s if best else None,
                          ceiling_events_s=best.events_s if best else None,
                          host_cpu=host.cpu_model, cpu_count=host.cpu_cores_logical,
                          server_processes=processes, limit=limit, limit_reason=why)


def save(result: SelftestResult) -> Path:
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.model_dump(), indent=2) + "\n")
    return path


def ceiling_warning(events_s: float, ceiling: SelftestResult | None, processes: int = 1) -> str | None:
    """A warning when a level received events at more than half the rate this machine's client measured
    accurately in selftest (times `processes`: worker processes share the load, each timing its own part);
    None when fine or when no selftest has been run."""
    if ceiling is None or not ceiling.ceiling_events_s:
        return None
    limit = ceiling.ceiling_events_s * max(processes, 1)
    if events_s <= limit / 2:
        return None
    per = f" ({events_s / processes:,.0f} per worker process)" if processes > 1 else ""
    return (f"the client received {events_s:,.0f} events/s{per}, more than half of its measured ceiling "
            f"({ceiling.ceiling_events_s:,.0f} events/s per process within {ceiling.tolerance_ms:g} ms, `servelab "
            f"selftest` on {ceiling.measured_at}): client timing may limit these results")
