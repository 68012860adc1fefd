"""The one place a load level runs, whatever the mode: begin, the mode's load, finish.

- begin: make sure the client may open the level's sockets, mark the level as running (so Ctrl-C can summarise
  it), tell the live progress, start the environment sampler's and the server metrics' level.
- the load: the mode's generator (bench/loads/), returning the level's tally and its measurement window.
- finish: recount tokens where the stream gave no per-chunk counts (after the load, so it never perturbs it,
  unless the level was long enough to fill a batch: bench/loads/common.py), summarise, attach the server's own
  metrics, the most common errors, the steady state (the aggregate figures withheld when it was not reached),
  the environment and what the GPUs did (bench/gpu_run.py); then, for a level with a load description, goodput
  and the SLO verdict when there are targets and a warning when an uncapped open loop's sends ran late; then
  hand the summary to the run and stop the run if the level found it cannot go on (BenchStopped).

`interrupted_level` is the same finish for the level Ctrl-C (or a busy machine) cut short, over the time it ran.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from servelab.bench import steady as steady_state
from servelab.bench.failures import top_errors
from servelab.bench.gpu_figures import not_measured
from servelab.bench.gpu_run import attach_gpu
from servelab.bench.level_spec import LevelSpec
from servelab.bench.limits import DescriptorShortage, check_descriptors
from servelab.bench.metrics import as_tally, goodput_figures, summarize
from servelab.bench.profiler import LevelProfile, start_profile, stop_profile
from servelab.bench.selftest import ceiling_warning
from servelab.bench.slo import level_verdict
from servelab.bench.state import BenchStopped, RunState
from servelab.bench.steady import is_measured, withhold
from servelab.host.environment import contention_warning
from servelab.records import EnvironmentSummary, RequestRecord, Summary

CLIENT_LAG_WARN_MS = 10.0  # uncapped open loop: a p99 send lag above this means the schedule was not kept
INTERRUPTED_LEVEL = "interrupted: this level did not run to the end"
# What ended a level (LevelControl.ended_by) that ends the whole run too.
STOPPING_ENDS = ("gone", "fd_limit", "stalled")

Load = Callable[[], Awaitable[tuple[list[RequestRecord], tuple[int, int]]]]


async def run_level(state: RunState, spec: LevelSpec, load: Load) -> Summary:
    """Run one level: begin, `load()` (the mode's generator: the level's records and window), finish."""
    if spec.streams is not None:
        ensure_streams(*spec.streams)
    profile = await start_level_profile(state, spec.tag)
    try:
        await begin(state, spec)
        records, window = await load()
        summary = await finish(state, spec, records, window)
    finally:  # stopped however the level ends: an engine is never left profiling
        if profile is not None:
            await asyncio.to_thread(stop_profile, profile)
    if profile is not None:
        summary.load = {**summary.load, "profile": profile.record()}
    state.level_done(summary)
    if spec.stall is not None and spec.stall.stalled:
        raise BenchStopped(f"{spec.tag}: {spec.stall.reason(spec.stall.not_sent)}")
    stop_if_broken(summary)
    return summary


async def start_level_profile(state: RunState, tag: str) -> LevelProfile | None:
    """The engine's profiler started before the level `--profile-level` names (None for every other level)."""
    if state.options.profile_level != tag:
        return None
    from servelab.engines import REGISTRY

    adapter = REGISTRY[state.engine]() if state.engine in REGISTRY else None
    return await asyncio.to_thread(start_profile, state.url, adapter.profiler if adapter else None, tag,
                                   state.options.api_key, state.options.engine_pids,
                                   adapter.title if adapter else "this server (its engine was not recognised)")


def ensure_streams(streams: int, what: str) -> None:
    """Before a level of `streams` concurrent requests: make sure the client may open that many sockets, or stop
    the run (BenchStopped) saying why, keeping the levels measured so far."""
    try:
        check_descriptors(streams, what)
    except DescriptorShortage as exc:
        raise BenchStopped(str(exc)) from None


def stop_if_broken(summary: Summary) -> None:
    """Raise BenchStopped after a level that ended because the server is gone or the client ran out of
    descriptors: a next level would only fail the same way."""
    steady = summary.steady
    if steady is not None and steady.ended_by in STOPPING_ENDS:
        raise BenchStopped(f"{summary.tag}: {steady.reason}")


async def begin(state: RunState, spec: LevelSpec) -> None:
    """Mark the level as running (so Ctrl-C can summarise it) and take the server's metrics before it."""
    state.current = (spec.tag, spec.concurrency, time.perf_counter_ns())
    state.current_spec = spec
    state.recorder.current = None  # the level's load mode opens its tally
    if state.on_level is not None:
        state.on_level(spec.tag, spec.planned_s, spec.cap_s, spec.planned_requests)
    if state.environment is not None:
        state.environment.start_level()
    if state.idle_stacks is not None:
        state.idle_stacks.start_level()
    if state.watcher is not None:
        await state.watcher.start_level()


async def finish(state: RunState, spec: LevelSpec, records: list[RequestRecord], window: tuple[int, int]
                 ) -> Summary:
    """The level's summary (module docstring). `records` is the level's tally (or, from a load mode that keeps a
    list, its records)."""
    await state.recorder.settle()
    tally = as_tally(records, state.recorder.slos or None)
    server = await state.watcher.end_level(tally) if state.watcher is not None else None
    environment = end_environment(state)
    state.current, state.current_spec = None, None
    summary = summarize(tally, tag=spec.tag, mode=spec.mode, concurrency=spec.concurrency, window=window)
    summary.server = server
    summary.top_errors = top_errors(tally)
    control = spec.control
    if control is not None and control.rule is not None:
        steady_state.apply(summary, steady_state.judge(tally, window, control.rule, ended_by=control.ended_by,
                                                       cap_s=control.cap_s, rate=spec.rate,
                                                       budget=control.max_requests,
                                                       stall_reason=control.stall_reason()))
    attach_environment(summary, environment)
    await attach_level_gpu(state, summary, tally, window)
    events = tally.in_window(window)[2]
    if summary.window_s > 0 and state.client is not None:
        warning = ceiling_warning(events / summary.window_s, state.client_ceiling, state.client.processes)
        if warning:
            summary.warnings.append(warning)
    if state.recorder.recounted_live:
        summary.warnings.append(f"{state.recorder.recounted_live} records were recounted with the tokenizer while "
                                f"the level ran (in batches, to keep memory bounded), not after it")
        state.recorder.recounted_live = 0
    if spec.stall is not None and spec.stall.stalled:  # the evidence where every level's is: its steady state
        steady_state.apply(summary, steady_state.judge(records, window, state.options.steady, ended_by="stalled",
                                                       stall_reason=spec.stall.reason(spec.stall.not_sent)))
    if spec.load is not None:
        describe_load(state, spec, summary, records, window)
        if (warning := late_sends_warning(spec, summary)) is not None:
            summary.warnings.append(warning)
    if state.idle_stacks is not None:  # what the engine was doing when a stream went idle
        await state.idle_stacks.attach(summary)
    return summary


def late_sends_warning(spec: LevelSpec, summary: Summary) -> str | None:
    """An uncapped open-loop level (mode "rate": a request rate, a trace replay, open-loop conversations) whose p99
    send was later than CLIENT_LAG_WARN_MS offered less load than its schedule. A capped one's lag includes waiting
    for a slot, which is the cap doing its job."""
    lag = summary.figures.get("client_lag_ms")
    if spec.mode != "rate" or spec.concurrency or lag is None or lag.value is None \
            or lag.value <= CLIENT_LAG_WARN_MS:
        return None
    return (f"client lag p99 {lag.value:.1f} ms: sends went out late, so the load offered was below the "
            f"schedule's (the client, not the server, limited it)")


def describe_load(state: RunState, spec: LevelSpec, summary: Summary, records, window: tuple[int, int]) -> None:
    """The level's rate and load (with what ended it), and its goodput and SLO verdict when there are targets (a
    level that is not measured is never called met)."""
    summary.rate, summary.load = spec.rate, spec.load if spec.load is not None else {}
    if spec.control is not None:
        summary.load["ended_by"] = spec.control.ended_by
    slos = state.options.plan.slos
    if slos:
        summary.figures.update(goodput_figures(records, slos, window))
        summary.slo = level_verdict(records, slos)
        withhold(summary)
        unjudged(summary)


def unjudged(summary: Summary) -> None:
    """A level that is not measured (docs/metrics.md#steady-state) is never called met: its SLO verdict says
    it was not judged, and why."""
    if summary.slo is not None and not is_measured(summary):
        summary.slo["passed"] = False
        summary.slo["judged"] = False
        summary.slo["reason"] = f"not measured: {summary.steady.reason}"


def interrupted_level(state: RunState) -> Summary | None:
    """The level in progress when the run was cut short, summarised over the time it actually ran (None: no level
    was running)."""
    if state.current is None:
        return None
    tag, concurrency, start_ns = state.current
    spec = state.current_spec
    state.recorder.flush()  # records still waiting for their recount: as counted
    partial = (state.recorder.current if state.recorder.current is not None
               else [r for r in state.recorder.records if r.tag == tag])
    mode = spec.mode if spec is not None else ("single" if tag == "single" else "concurrency")
    rate = spec.rate if spec is not None else None
    window = (start_ns, time.perf_counter_ns())
    summary = summarize(partial, tag=tag, mode=mode, concurrency=concurrency, window=window,
                        slos=state.options.plan.slos or None)
    summary.top_errors = top_errors(partial)
    if mode != "single":
        steady_state.apply(summary, steady_state.judge(partial, window, state.options.steady,
                                                       ended_by="interrupted", rate=rate))
    summary.rate, summary.load = rate, dict((spec.load if spec is not None else None) or {})
    if state.options.plan.slos:
        summary.slo = level_verdict(partial, state.options.plan.slos)
        withhold(summary)
        unjudged(summary)
    attach_environment(summary, end_environment(state))
    level_gpu(state, summary, as_tally(partial), window, mark=True)
    summary.warnings.append(INTERRUPTED_LEVEL)
    return summary


async def attach_level_gpu(state: RunState, summary: Summary, tally, window: tuple[int, int]) -> None:
    """What the GPUs did inside the level's window (bench/gpu_run.py), read off the event loop: a reading just
    after the window, then the series over it."""
    if state.gpu is None:
        return
    await asyncio.to_thread(level_gpu, state, summary, tally, window, True)


def level_gpu(state: RunState, summary: Summary, tally, window: tuple[int, int], mark: bool) -> None:
    """The level's GPU summary and figures over `window`, divided by the tokens output tok/s counts in it (none
    when the level is not measured: its output tok/s is withheld, and J/token with it)."""
    gpu = state.gpu
    if gpu is None:
        return
    try:
        if mark:
            gpu.mark_end(window[1])
        tokens, answer, _ = tally.in_window(window)
        measured = is_measured(summary)
        found = gpu.level(summary, window, tokens if measured else None, answer if measured else None)
    except Exception as exc:  # the GPUs are evidence beside the figures, never a reason to lose them
        found = not_measured(f"the GPU figures failed ({' '.join(str(exc).split())[:120]})")
    attach_gpu(summary, found, state.options.engine_findings)


def end_environment(state: RunState) -> EnvironmentSummary | None:
    """The environment of the level that is ending, from the run's sampler; None without one (or if it failed:
    the environment is evidence beside the figures, never a reason to lose them)."""
    if state.environment is None:
        return None
    try:
        return state.environment.end_level()
    except Exception:
        return None


def attach_environment(summary: Summary, environment: EnvironmentSummary | None) -> None:
    """Put the level's environment on its summary, with a warning when it was contended
    (docs/metrics.md#contended)."""
    if environment is None:
        return
    summary.environment = environment
    warning = contention_warning(environment)
    if warning:
        summary.warnings.append(warning)
