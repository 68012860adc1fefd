"""Load modes against the calibration server: open-loop sends are never held back by slow responses, levels
are bounded by count and duration, warm-up is excluded, and failed requests are kept and counted."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest

from servelab.bench.client import StreamClient
from servelab.bench.loads import Recorder, Target, run_concurrency, run_rate
from servelab.bench.options import BenchArgs, build_options
from servelab.bench.runner import bench
from servelab.bench.workloads import Workload
from servelab.calibration import Script, start_calibration_server
from servelab.errors import UserError

MS = 1_000_000


@pytest.fixture(scope="module")
def cal():
    with start_calibration_server(Script(ttft_ms=5, itl_ms=2, output_tokens=4)) as handle:
        yield handle


@dataclass
class Scripted:
    """The default workload with a calibration script laid over some requests (by request number)."""

    script: Callable[[int], dict[str, Any] | None]
    base: Workload = field(default_factory=lambda: Workload(max_tokens=4))
    endpoint: str = "/v1/chat/completions"

    async def prepare(self, counter, needed=None) -> None:
        pass

    def request(self, index: int, model: str, **kw):
        spec = self.base.request(index, model, **kw)
        if (s := self.script(index)) is not None:
            spec.body["calibration"] = s
        return spec

    def describe(self, *args) -> dict[str, Any]:
        return self.base.describe(*args) | {"scripted": True}


def level(url: str, workload, **kw):
    """One open-loop level through the real client; returns (records, window)."""
    async def go():
        async with StreamClient(url) as client:
            return await run_rate(client, workload, Target(model="calibration"), Recorder(), **kw)
    return asyncio.run(go())


def test_open_loop_sends_are_not_held_back_by_slow_responses(cal) -> None:
    slow = Scripted(lambda i: {"ttft_ms": 1500})
    records, (ws, we) = level(cal.url, slow, rate=20, arrival="constant", requests=12)
    assert len(records) == 12 and all(r.ok for r in records)
    # Every request went out before the first response could have come back (1.5 s): nothing waited for one.
    first_token = min(r.events[0].t_ns for r in records)
    assert max(r.t_send_ns for r in records) < first_token
    lags = sorted((r.t_send_ns - r.scheduled_ns) / MS for r in records)
    assert lags[0] > -1 and lags[-1] < 250  # recorded per request; generous for a busy 2-core machine
    # Window = first .. last scheduled send: 11 intervals of 50 ms, exactly.
    assert (we - ws) == 11 * 50 * MS
    assert sorted(r.scheduled_ns for r in records) == [ws + k * 50 * MS for k in range(12)]


def test_levels_are_bounded_by_count_duration_or_both(cal) -> None:
    fast = Scripted(lambda i: None)
    assert len(level(cal.url, fast, rate=40, arrival="constant", duration_s=0.3)[0]) == 12  # 0, 25, ..., 275 ms
    assert len(level(cal.url, fast, rate=40, arrival="poisson", requests=5, duration_s=30)[0]) == 5
    assert len(level(cal.url, fast, rate=40, arrival="constant", requests=500, duration_s=0.1)[0]) == 4

    async def closed():
        async with StreamClient(cal.url) as client:
            return await run_concurrency(client, fast, Target(model="calibration"), Recorder(), concurrency=3,
                                         duration_s=None, max_requests=7)
    records, (ws, we) = asyncio.run(closed())
    assert len(records) == 7 and ws < we


def test_warm_up_is_recorded_but_excluded(cal) -> None:
    seen = []
    result = bench(cal.url, build_options(BenchArgs(mode="rate", rate="50", requests=5, warmup=2)),
                   on_record=seen.append)
    (lv,) = result.levels
    assert [r.warmup for r in seen].count(True) == 2 and len(seen) == 7
    assert lv.requests == 5 and lv.figures["e2e_ms"].dist.n == 5 and lv.mode == "rate" and lv.rate == 50
    assert lv.load["arrival"] == "poisson" and lv.load["scheduled"] == 5
    assert all(r.scheduled_ns is not None for r in seen if not r.warmup)
    assert all(r.scheduled_ns is None for r in seen if r.warmup)  # warm-up is not part of the schedule
    assert result.workload["load_plan"]["rates"] == [50.0]


def test_server_errors_are_kept_and_counted_not_dropped(cal) -> None:
    # Every third request answers HTTP 500; one more ends with an in-band error after two events.
    def script(i: int):
        return {"http_status": 500} if i % 3 == 0 else {"in_band_error_after_events": 2} if i == 4 else None
    opts = build_options(BenchArgs(mode="rate", rate="100", requests=12, warmup=0, slo="e2e_p50_ms=5000"))
    opts.workload = Scripted(script)
    seen = []
    result = bench(cal.url, opts, on_record=seen.append)
    (lv,) = result.levels
    assert len(seen) == 12 and lv.requests == 12
    assert lv.errors == {"http": 4, "in_band": 1} and lv.failed == 5 and lv.ok == 7
    failed = [r for r in seen if not r.ok]
    assert {r.index for r in failed} == {0, 3, 4, 6, 9}
    assert all(r.http_status == 500 and "500" in r.error_detail for r in failed if r.error_kind == "http")
    assert any("5 of 12 requests failed" in w for w in lv.warnings)
    assert lv.figures["slo_attainment"].value == pytest.approx(7 / 12)  # a failure meets no target
    assert lv.figures["e2e_ms"].dist.n == 7


def test_rate_sweep_runs_a_list_or_a_ramp(cal) -> None:
    # 16 requests a level: enough for the steady-state rule (10 completed inside the window) to measure them.
    listed = bench(cal.url, build_options(BenchArgs(mode="rate-sweep", rate="20,40", requests=16, warmup=0)))
    assert [lv.tag for lv in listed.levels] == ["r20", "r40"] and listed.stop_reason == "ran every listed rate"
    assert listed.headline["peak.rate"].value in (20, 40)
    opts = build_options(BenchArgs(mode="rate-sweep", requests=16, warmup=0, max_rate=64))
    opts.plan.ramp_start = 16
    ramp = bench(cal.url, opts)
    # The calibration server has no capacity limit, so throughput grows with the rate up to the maximum (unless
    # a noisy level on a busy machine stops the ramp early, which is also a correct stop).
    assert [lv.rate for lv in ramp.levels] == [16, 32, 64][:len(ramp.levels)] and len(ramp.levels) >= 2
    assert ramp.stop_reason in ("reached the maximum rate (64 req/s)",) or "stopped growing" in ramp.stop_reason


@pytest.mark.parametrize("args,needle", [
    (BenchArgs(mode="rate"), "needs one --rate"),
    (BenchArgs(mode="rate", rate="1,2"), "needs one --rate"),
    (BenchArgs(mode="concurrency"), "needs --concurrency"),
    (BenchArgs(mode="single", slo="ttft_p99_ms=5"), "apply to --mode"),
    (BenchArgs(mode="rate", rate="5", arrival="poisson", burstiness=0.5), "applies to gamma"),
    (BenchArgs(mode="rate", rate="-3"), "positive"),
    (BenchArgs(mode="sweep", rate="3"), "does not apply"),
    (BenchArgs(mode="single", prefix_groups=2), "need --prefix-groups, --prefix-tokens and --input-tokens"),
    (BenchArgs(mode="storm"), "unknown mode"),
])
def test_bad_option_combinations_are_refused_before_anything_is_sent(args: BenchArgs, needle: str) -> None:
    with pytest.raises(UserError, match=needle):
        build_options(args)


def test_burstiness_selects_gamma_arrivals() -> None:
    plan = build_options(BenchArgs(mode="rate", rate="5", burstiness=0.5)).plan
    assert plan.arrival == "gamma" and plan.burstiness == 0.5


def test_a_think_time_is_never_cut_short_by_the_event_loop() -> None:
    """uvloop's timers count whole milliseconds from when its loop last read the clock: work done in the same loop
    turn before the wait made a 10 ms think time last ~9.6 ms (CI saw it). A pause waits out the remainder."""
    import time

    from servelab import aio
    from servelab.bench.loads.control import LevelControl

    async def go() -> list[int]:
        control = LevelControl(None, duration_s=None, max_requests=1)
        control.begin(time.perf_counter_ns())
        short = []
        for _ in range(20):
            spin_end = time.perf_counter_ns() + 700_000  # the loop turn's own work, as a finished request's
            while time.perf_counter_ns() < spin_end:
                pass
            t0 = time.perf_counter_ns()
            await control.pause(0.01)
            if time.perf_counter_ns() - t0 < 10_000_000:
                short.append(time.perf_counter_ns() - t0)
        return short

    assert aio.run(go()) == []


@pytest.mark.parametrize("mode, cap, p99_ms, warned", [
    ("rate", 0, 10.5, True),  # uncapped open loop (a rate, a trace replay): late sends offered less load
    ("rate", 0, 9.5, False),
    ("rate", 0, None, False),  # no send measured: nothing to say of its lag
    ("rate", 4, 50.0, False),  # a capped level's lag includes the wait for a slot, the cap doing its job
    ("concurrency", 0, 50.0, False),
])
def test_an_open_loop_level_whose_sends_went_out_late_says_so(mode, cap, p99_ms, warned) -> None:
    from servelab.bench.level_spec import LevelSpec
    from servelab.bench.levels import CLIENT_LAG_WARN_MS, late_sends_warning
    from servelab.records import Figure, Summary

    spec = LevelSpec(tag="trace", mode=mode, concurrency=cap)
    summary = Summary(tag="trace", mode=mode, concurrency=cap, requests=3, ok=3, failed=0, window_s=1.0,
                      figures={"client_lag_ms": Figure(value=p99_ms, unit="ms", definition="client-lag")})
    warning = late_sends_warning(spec, summary)
    assert (warning is not None) == warned and CLIENT_LAG_WARN_MS == 10.0
    if warned:
        assert warning.startswith(f"client lag p99 {p99_ms:.1f} ms") and "client, not the server" in warning
