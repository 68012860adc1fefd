"""`bench URL`: find out what serves the URL, run single-stream or a concurrency sweep, summarise.

The state of a run lives in a BenchState that is filled as the run goes, so Ctrl-C (or a crash of a later step)
leaves a partial but correct result: every completed request is kept, every request that was in flight is kept
with error_kind "cancelled" and what it had received, and the level in progress is summarised over the time it
actually ran.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import aiohttp

from servelab import aio
from servelab.bench.client import ClientOptions, Deadlines, StreamClient
from servelab.bench.limits import DescriptorShortage, auth_headers, check_descriptors, streams_needed
from servelab.host.environment import EnvironmentSampler, contention_warning
from servelab.bench.failures import top_errors
from servelab.bench.loads import Recorder, Target, make_spec, run_concurrency, run_single
from servelab.bench.loads.control import LevelControl, StallWatch
from servelab.bench.metrics import as_tally, peak_figures, summarize
from servelab.bench.plans import (PLAN_MODES, LoadPlan, annotate_partial, plan_headline, prepare_workload,
                                  run_plan)
from servelab.bench.tokenizer import (LlamaCppServerTokenizer, Tokenizer, probe_server_tokenizer,
                                      tokenizer_from_option)
from servelab.bench.server_metrics import MetricsWatcher
from servelab.bench import steady as steady_state
from servelab.bench.steady import SteadyRule, is_measured
from servelab.bench.selftest import SelftestResult, ceiling_warning, load_ceiling
from servelab.bench.workload import Workload
from servelab.bench.workers import WorkerPool, auto_workers, open_pool, streams_needed_most
from servelab.bench.warmup import plan_warmup
from servelab.bench.workloads import WorkloadSource
from servelab.engines.detect import detect_engine_config
from servelab.errors import UserError
from servelab.net import check_credentials, ensure_reachable, normalize_base_url
from servelab.records import BenchResult, EnvironmentSummary, Figure, RequestRecord, Summary


@dataclass
class BenchOptions:
    mode: Literal["single", "sweep", "concurrency", "rate", "rate-sweep", "slo-search"] = "single"
    model: str | None = None
    workload: WorkloadSource = field(default_factory=Workload)
    single_requests: int = 8
    # Warm-up before the first level: None (auto) the plan's highest concurrency at once, capped by the server's
    # slots, then one alone; a number: that many one at a time (bench/warmup.py; docs/metrics.md#warm-up).
    warmup: int | None = None
    level_duration_s: float = 10.0
    max_concurrency: int = 64
    min_gain: float = 0.03  # a level must beat the best so far by this fraction to count as growth
    patience: int = 2  # stop after this many levels in a row without growth (one noisy level is not a plateau)
    deadlines: Deadlines = field(default_factory=Deadlines)
    api_key: str | None = None
    # How to count tokens when the server gives no per-chunk counts: auto (the server's tokenizer endpoint when
    # it has one), server, none, calibration, or a path to a tokenizer.json. See bench/tokenizer.py.
    tokenizer: str = "auto"
    # The modes beyond single and sweep (concurrency, rate, rate-sweep, slo-search): see bench/plans.py.
    plan: LoadPlan = field(default_factory=LoadPlan)
    # The engine's processes when servelab launched it (their trees' CPU is the engine's, not "other" load);
    # empty: found from the URL's listening port where the server runs on this host (host/environment.py).
    engine_pids: list[int] = field(default_factory=list)
    # Which trial of an experiment's cell this bench is (stamped on every record; docs/metrics.md#trials).
    trial: int = 0
    # When a level has run long enough to be measured, its cap, the drain grace and the back-off after failures
    # (bench/steady.py; docs/metrics.md#steady-state).
    steady: SteadyRule = field(default_factory=SteadyRule)
    # The error gate (bench/failures.py): a level whose share of failed requests is above this breaks it; None:
    # only a level where every request failed does.
    max_error_rate: float | None = None
    # sweep: exactly these concurrencies, no stop rule (later trials of a cell repeat the first trial's levels,
    # so the trials measure the same loads); None: 1, 2, 4, … until throughput stops growing.
    sweep_levels: list[int] | None = None
    # Send from worker processes (a number, or "auto": bench/workers/) instead of this process; with `ray`
    # ("auto" or a cluster's address) the workers are Ray actors placed across that cluster. None: this process.
    workers: int | str | None = None
    ray: str | None = None
    # End the bench early when the level in progress has run this many seconds and other processes or CPU steal
    # made it contended so far (experiments: the trial runs again once the machine is quiet,
    # experiment/contention.py); None: measure to the end and mark the level contended.
    stop_when_contended_s: float | None = None


INTERRUPTED_LEVEL = "interrupted: this level did not run to the end"


@dataclass
class BenchState:
    url: str
    options: BenchOptions
    model: str = ""
    engine: str | None = None
    accepts_ignore_eos: bool = False
    recorder: Recorder = field(default_factory=Recorder)
    levels: list[Summary] = field(default_factory=list)
    current: tuple[str, int, int] | None = None  # (tag, concurrency, start_ns) of the level in progress
    stop_reason: str | None = None
    tokenizer: Tokenizer | None = None
    watcher: MetricsWatcher | None = None  # the server's /metrics, when the engine is known to have them
    client_ceiling: SelftestResult | None = field(default_factory=load_ceiling)
    accepts_min_tokens: bool = False  # the engine honours `min_tokens` (set by plans.prepare_workload)
    current_plan: dict | None = None  # plans.py: mode, rate and load of the level in progress, if it runs one
    search: dict | None = None  # slo-search: probes, bracket and answer (plans.slo_search)
    client: StreamClient | None = None  # the run's client, for the requests it recorded as cancelled
    environment: EnvironmentSampler | None = None  # what the machine did during each level (host/environment.py)
    warnings: list[str] = field(default_factory=list)  # about the whole bench (BenchResult.warnings)
    contended_stop: list[str] | None = None  # why the bench was ended early on a busy machine (stop_when_contended_s)
    # Told when a level begins: (tag, planned seconds, cap seconds, planned requests), for the live progress
    # (report/progress.py); the warm-up too, with `warmup=` what it sends ("8 concurrent + 1"). Called on the
    # event loop's thread, so it must not block.
    on_level: Callable[..., None] | None = None
    # Told when a level is measured, with its summary, so a caller can show it before the bench ends (`run`'s
    # sweep); on the event loop's thread, like on_level.
    on_level_done: Callable[[Summary], None] | None = None
    # Told the engine's processes once the environment sampler knows them (given, or found listening on the URL's
    # port), so the live progress shows their CPU as the engine's, not the client's.
    on_engine: Callable[[list[int]], None] | None = None
    server_slots: int | None = None  # what the server says it runs at once (llama.cpp /props total_slots)

    def level_done(self, summary: Summary) -> None:
        self.levels.append(summary)
        if self.on_level_done is not None:
            self.on_level_done(summary)

    def collect_cancelled(self) -> None:
        """Pass on the requests that were in flight when the run was interrupted and that no load mode took yet
        (a warm-up request, a task the event loop cancelled last): recorded like any other, as "cancelled"."""
        if self.client is not None:
            self.recorder.add_cancelled(self.client)

    def result(self, interrupted: bool = False) -> BenchResult:
        levels = list(self.levels)
        if interrupted and self.current is not None:
            tag, conc, start_ns = self.current
            self.recorder.flush()  # records still waiting for their recount: as counted
            partial = (self.recorder.current if self.recorder.current is not None
                       else [r for r in self.recorder.records if r.tag == tag])
            mode = (self.current_plan or {}).get("mode") or ("single" if tag == "single" else "concurrency")
            window = (start_ns, time.perf_counter_ns())
            levels.append(summarize(partial, tag=tag, mode=mode, concurrency=conc, window=window,
                                    slos=self.options.plan.slos or None))
            levels[-1].top_errors = top_errors(partial)
            if mode != "single":
                steady_state.apply(levels[-1], steady_state.judge(
                    partial, window, self.options.steady, ended_by="interrupted",
                    rate=(self.current_plan or {}).get("rate")))
            annotate_partial(self, levels[-1], partial)
            attach_environment(levels[-1], end_environment(self))
            levels[-1].warnings.append(INTERRUPTED_LEVEL)
        result = BenchResult(url=self.url, model=self.model, mode=self.options.mode,
                             workload=self.options.workload.describe(self.accepts_ignore_eos,
                                                                     self.accepts_min_tokens) |
                             {"engine_detected": self.engine,
                              "tokenizer": self.tokenizer.name if self.tokenizer else None} |
                             ({"load_plan": self.options.plan.describe(self.options.mode)}
                              if self.options.mode in PLAN_MODES else {}),
                             levels=levels, stop_reason=self.stop_reason, interrupted=interrupted,
                             search=self.search, warnings=list(self.warnings),
                             workers=self.client.provenance() if isinstance(self.client, WorkerPool) else [])
        result.headline = headline(result)
        return result


def headline(result: BenchResult) -> dict[str, Figure]:
    """The story's numbers: single-stream decode tok/s and peak output tok/s, keyed as baselines name them."""
    out: dict[str, Figure] = {}
    single = next((s for s in result.levels if s.mode == "single"), None)
    if single is None and result.mode == "sweep":
        single = next((s for s in result.levels if s.concurrency == 1), None)
    if single is not None:
        prefix = "single"
        for key in ("decode_tok_s", "output_tok_s", "ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "ttfo_ms",
                    "answer_tok_s", "reasoning_tokens", "answer_tokens", "reasoning_share"):
            if key in single.figures:
                out[f"{prefix}.{key}"] = single.figures[key]
    conc_levels = [s for s in result.levels if s.mode == "concurrency" and is_measured(s)
                   and s.figures["output_tok_s"].value]
    if conc_levels:
        out.update(peak_figures(conc_levels, load_key="concurrency", load=lambda s: s.concurrency,
                                load_unit="streams", note=lambda s: f"at concurrency {s.concurrency}"))
    out.update(plan_headline(result))
    return out


class BenchStopped(Exception):
    """A level found that the run cannot go on (the server is gone, the client ran out of file descriptors): the
    levels measured so far are kept and the run stops with this reason."""


# What ended a level (LevelControl.ended_by) that ends the whole run too.
STOPPING_ENDS = ("gone", "fd_limit", "stalled")


def stop_if_broken(summary: Summary) -> None:
    """Raise BenchStopped after a level that ended because the server is gone or the client ran out of
    descriptors: a next level would only fail the same way."""
    steady = summary.steady
    if steady is not None and steady.ended_by in STOPPING_ENDS:
        raise BenchStopped(f"{summary.tag}: {steady.reason}")


def ensure_streams(state: BenchState, streams: int, what: str) -> None:
    """Before a level of `streams` concurrent requests: make sure the client may open that many sockets, or stop
    the run (BenchStopped) saying why, keeping the levels measured so far."""
    try:
        check_descriptors(streams, what)
    except DescriptorShortage as exc:
        raise BenchStopped(str(exc)) from None


async def prepare(state: BenchState, session: aiohttp.ClientSession) -> None:
    """Check the server answers, pick the model, and recognise the engine. Raises UserError if unreachable."""
    url = state.url
    await ensure_reachable(url)
    try:
        async with asyncio.timeout(10):
            async with session.get(url + "/v1/models") as resp:
                raw = await resp.read()
                status = resp.status
    except TimeoutError:
        raise UserError(f"{url}/v1/models did not answer within 10 s") from None
    except aiohttp.ClientError as exc:
        raise UserError(f"{url}/v1/models failed: {type(exc).__name__}: {exc}") from None
    models: list[str] = []
    try:
        body = json.loads(raw)
        models = [m["id"] for m in body.get("data", []) if isinstance(m, dict) and "id" in m]
    except (ValueError, AttributeError):
        pass
    if state.options.model:
        state.model = state.options.model
        if models and state.model not in models:
            listed = ", ".join(models[:5]) + (f" and {len(models) - 5} more" if len(models) > 5 else "")
            state.warnings.append(f"model '{state.model}' is not among the models the server lists ({listed}): "
                                  f"it may answer with another model, or refuse every request")
    elif models:
        state.model = models[0]
    else:
        snippet = " ".join(raw[:120].decode("utf-8", "replace").split())
        raise UserError(f"{url}/v1/models answered HTTP {status} without a model list ({snippet!r})",
                        hint="is this an OpenAI-compatible server? pass --model to name the model")
    adapter, config = await detect_engine_config(session, url)
    if adapter is not None:
        state.engine = adapter.name
        state.accepts_ignore_eos = adapter.accepts_ignore_eos
        state.server_slots = adapter.slots(config)
    option = state.options.tokenizer
    if option == "auto":
        state.tokenizer = (LlamaCppServerTokenizer(url, api_key=state.options.api_key)
                           if await probe_server_tokenizer(session, url) else None)
    else:
        state.tokenizer = tokenizer_from_option(option, url, api_key=state.options.api_key)


async def begin_level(state: BenchState, tag: str, concurrency: int) -> None:
    """Mark a load level as running (so Ctrl-C can summarise it) and take the server's metrics before it."""
    state.current = (tag, concurrency, time.perf_counter_ns())
    state.recorder.current = None  # the level's load mode opens its tally
    if state.on_level is not None:
        opts = state.options
        if tag == "single":
            state.on_level(tag, None, None, opts.single_requests)
        elif opts.mode in ("multiturn", "replay"):  # bounded by their turns or the trace, not by a duration
            state.on_level(tag, None, None, None)
        else:
            requests, duration = (opts.plan.bounds(opts.level_duration_s) if opts.mode in PLAN_MODES
                                  else (None, opts.level_duration_s))
            state.on_level(tag, duration, opts.steady.cap_s(duration), requests)
    if state.environment is not None:
        state.environment.start_level()
    if state.watcher is not None:
        await state.watcher.start_level()


async def finish_level(state: BenchState, records: list[RequestRecord], *, tag: str, mode: str,
                       concurrency: int, window: tuple[int, int], control: LevelControl | None = None,
                       rate: float | None = None) -> Summary:
    """Recount tokens where the stream gave no per-chunk counts (after the load, so it never perturbs it, unless
    the level was long enough to fill a batch: bench/loads/common.py), then compute the level's figures and attach
    the server's own metrics, the most common errors and, for a level run under `control`, whether it reached a
    steady state (its aggregate figures withheld when it did not). `records` is the level's tally (or, from a
    load mode that keeps a list, its records)."""
    await state.recorder.settle()
    tally = as_tally(records, state.recorder.slos or None)
    server = await state.watcher.end_level(tally) if state.watcher is not None else None
    environment = end_environment(state)
    state.current = None
    summary = summarize(tally, tag=tag, mode=mode, concurrency=concurrency, window=window)
    summary.server = server
    summary.top_errors = top_errors(tally)
    if control is not None and control.rule is not None:
        steady_state.apply(summary, steady_state.judge(tally, window, control.rule, ended_by=control.ended_by,
                                                       cap_s=control.cap_s, rate=rate,
                                                       budget=control.max_requests,
                                                       stall_reason=control.stall_reason()))
    attach_environment(summary, environment)
    events = tally.in_window(window)[2]
    if summary.window_s > 0:
        processes = state.client.count if isinstance(state.client, WorkerPool) else 1
        warning = ceiling_warning(events / summary.window_s, state.client_ceiling, processes)
        if warning:
            summary.warnings.append(warning)
    if state.recorder.recounted_live:
        summary.warnings.append(f"{state.recorder.recounted_live} records were recounted with the tokenizer while "
                                f"the level ran (in batches, to keep memory bounded), not after it")
        state.recorder.recounted_live = 0
    return summary


def end_environment(state: BenchState) -> EnvironmentSummary | None:
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


async def run_bench(state: BenchState) -> BenchResult:
    opts = state.options
    streams = streams_needed(opts)
    if streams is not None:  # before anything is sent: a limit too low for the load asked for is a set-up error
        check_descriptors(*streams)
    # The API key goes with every request servelab makes, not only the streams: /v1/models, the engine's
    # fingerprint, /tokenize, the prompt counters and /metrics.
    headers = auth_headers(opts.api_key)
    async with aiohttp.ClientSession(headers=headers) as probe_session:
        await prepare(state, probe_session)
        state.recorder.tokenizer = state.tokenizer  # chunk-counted records wait for it before they are written
        await prepare_workload(state, probe_session)
    from servelab.engines import get_engine  # registry lookup for the detected engine's request extras

    adapter = get_engine(state.engine) if state.engine else None
    extras = adapter.stream_extras if adapter else {}
    client_opts = ClientOptions(deadlines=opts.deadlines, api_key=opts.api_key, stream_extras=dict(extras))
    target = Target(model=state.model, accepts_ignore_eos=state.accepts_ignore_eos,
                    accepts_min_tokens=state.accepts_min_tokens)
    async with EnvironmentSampler(opts.engine_pids, url=state.url) as environment, \
            MetricsWatcher(state.url, adapter.metric_names if adapter else {}, headers=headers) as watcher, \
            open_client(state, client_opts) as client:
        state.watcher, state.client, state.environment = watcher, client, environment
        if state.on_engine is not None:
            state.on_engine(list(dict.fromkeys(environment.engine_roots)))
        if isinstance(client, WorkerPool):  # the workers' CPU on this host is the client's, not other load
            environment.add_client_pids(client.local_pids)
        try:
            await until_contended(state, run_levels(state, client, target))
        except BenchStopped as exc:
            state.stop_reason = f"stopped: {exc}"
        except ContendedStop:
            state.collect_cancelled()  # every request in flight, as "cancelled"
            result = state.result(interrupted=True)
            result.interrupted = False  # nobody pressed Ctrl-C: the machine was busy
            result.contended_stop = list(state.contended_stop or [])
            result.stop_reason = "stopped: the machine was busy (" + "; ".join(result.contended_stop) + ")"
            if result.levels and result.levels[-1].warnings[-1:] == [INTERRUPTED_LEVEL]:
                result.levels[-1].warnings[-1] = "stopped early: the machine was busy (" + \
                    "; ".join(result.contended_stop) + "): this level did not run to the end"
            return result
    return state.result()


async def run_levels(state: BenchState, client: StreamClient, target: Target) -> None:
    opts = state.options
    if opts.mode == "single":
        await warm_up(state, client, target, tag="single")
        await begin_level(state, "single", 1)
        stall = StallWatch()
        records, window = await run_single(client, opts.workload, target, state.recorder,
                                           requests=opts.single_requests, warmup=0, stall=stall)
        level = await finish_level(state, records, tag="single", mode="single", concurrency=1, window=window)
        if stall.stalled:  # the evidence where every level's is: its steady state (the error gate reads it)
            steady_state.apply(level, steady_state.judge(records, window, opts.steady, ended_by="stalled",
                                                         stall_reason=stall.reason(stall.not_sent)))
        state.level_done(level)
        if stall.stalled:
            raise BenchStopped(f"single: {stall.reason(stall.not_sent)}")
    elif opts.mode == "sweep":
        await sweep(state, client, target)
    else:
        await run_plan(state, client, target)


class ContendedStop(Exception):
    """The bench was ended early because the machine was busy (BenchOptions.stop_when_contended_s)."""


CONTENTION_CHECK_S = 1.0  # how often the level in progress is looked at


async def until_contended(state: BenchState, levels) -> None:
    """Run `levels`; with stop_when_contended_s, cancel it (as Ctrl-C would: every request in flight recorded as
    cancelled, the level in progress summarised) once the level in progress has run that long and other
    processes or CPU steal made it contended so far, and raise ContendedStop. Warm-up is not judged: it is not
    measured."""
    after = state.options.stop_when_contended_s
    if after is None or state.environment is None:
        await levels
        return
    main = asyncio.ensure_future(levels)
    while True:
        try:
            done, _ = await asyncio.wait({main}, timeout=CONTENTION_CHECK_S)
        except asyncio.CancelledError:  # Ctrl-C: the levels record what they had in flight, then it goes on
            main.cancel()
            await asyncio.gather(main, return_exceptions=True)
            raise
        if done:
            main.result()  # its exception, if it raised one
            return
        if state.current is None:
            continue
        try:
            env = state.environment.level_so_far()
        except Exception:  # the environment is evidence; never a reason to lose the bench
            continue
        if env.contended and (env.duration_s or 0.0) >= after:
            state.contended_stop = list(env.reasons)
            main.cancel()
            await asyncio.gather(main, return_exceptions=True)
            raise ContendedStop()


def open_client(state: BenchState, client_opts: ClientOptions) -> StreamClient | WorkerPool:
    """This process's StreamClient, or with --workers/--ray a pool of workers that the load modes use the same
    way (bench/workers/coordinator.py)."""
    opts = state.options
    if opts.workers is None and opts.ray is None:
        return StreamClient(state.url, client_opts)
    workers = opts.workers or 1
    if workers == "auto" and opts.ray is None:  # under Ray, auto is the cluster's CPUs (ray_backend.py)
        ceiling = state.client_ceiling.ceiling_streams if state.client_ceiling else None
        workers = auto_workers(streams_needed_most(opts), ceiling)
    return open_pool(state.url, client_opts, workers, ray=opts.ray, on_warning=state.warnings.append)


async def warm_up(state: BenchState, client: StreamClient, target: Target, tag: str) -> None:
    """Warm-up requests (bench/warmup.py): recorded (marked warmup) but outside every level's figures and
    server-metric window. Auto: the plan's highest concurrency at once (capped by the server's slots), then one."""
    plan = plan_warmup(state.options, state.server_slots)
    if not plan.total:
        return
    while plan.concurrent > 1:  # too few descriptors for all at once: a smaller warm-up, not a stopped run
        try:
            check_descriptors(plan.concurrent, "the warm-up")
            break
        except DescriptorShortage:
            plan = dataclasses.replace(plan, concurrent=plan.concurrent // 2)
    if plan.concurrent == 1:
        plan = dataclasses.replace(plan, concurrent=0, sequential=plan.sequential + 1)
    if state.on_level is not None:
        state.on_level(tag, None, None, plan.total, warmup=plan.describe())

    async def one() -> None:
        spec = make_spec(state.options.workload, target, state.recorder, tag, warmup=True)
        state.recorder.add(await client.send(spec))

    if plan.concurrent:
        await asyncio.gather(*(one() for _ in range(plan.concurrent)))
    for _ in range(plan.sequential):
        await one()


def sweep_concurrencies(opts: BenchOptions) -> Iterator[int]:
    """The sweep's levels: exactly `sweep_levels` when given (a later trial repeating the first trial's), else
    1, 2, 4, … up to max_concurrency (the sweep stops earlier when throughput stops growing)."""
    if opts.sweep_levels:
        yield from opts.sweep_levels
        return
    concurrency = 1
    while concurrency <= opts.max_concurrency:
        yield concurrency
        concurrency *= 2


async def sweep(state: BenchState, client: StreamClient, target: Target) -> None:
    """Concurrency 1, 2, 4, ... until aggregate output tok/s stops growing (or max_concurrency is reached); or
    exactly `sweep_levels` when given, measured or not, with no stop rule but failures."""
    opts = state.options
    await warm_up(state, client, target, tag="warmup")
    best: Summary | None = None
    flat = 0  # consecutive levels that did not beat the best by min_gain
    for concurrency in sweep_concurrencies(opts):
        tag = f"c{concurrency}"
        ensure_streams(state, concurrency, f"concurrency {concurrency}")
        await begin_level(state, tag, concurrency)
        control = LevelControl(opts.steady, duration_s=opts.level_duration_s)
        records, window = await run_concurrency(client, opts.workload, target, state.recorder,
                                                concurrency=concurrency, duration_s=opts.level_duration_s,
                                                control=control)
        level = await finish_level(state, records, tag=tag, mode="concurrency", concurrency=concurrency,
                                   window=window, control=control)
        state.level_done(level)
        stop_if_broken(level)
        tput = level.figures["output_tok_s"].value or 0.0
        if level.failed and level.failed > (level.ok + level.failed) / 2:
            state.stop_reason = f"more than half the requests failed at concurrency {concurrency}"
            return
        if opts.sweep_levels:  # every level of the first trial, measured or not
            continue
        if not is_measured(level):
            state.stop_reason = (f"concurrency {concurrency} was not measured ({level.steady.reason}); a higher "
                                 f"concurrency would be slower still")
            return
        best_tput = (best.figures["output_tok_s"].value or 0.0) if best is not None else 0.0
        if best is not None and tput < best_tput * (1 + opts.min_gain):
            flat += 1
            if flat >= opts.patience:
                state.stop_reason = (f"output tok/s stopped growing: {flat} level(s) up to concurrency "
                                     f"{concurrency} were not {opts.min_gain:.0%} above {best_tput:.1f} at "
                                     f"concurrency {best.concurrency}")
                return
        else:
            flat = 0
        if best is None or tput > best_tput:
            best = level
    state.stop_reason = ("ran the levels of the cell's first trial" if opts.sweep_levels
                         else f"reached the maximum concurrency ({opts.max_concurrency})")


def bench(url: str, options: BenchOptions, on_record: Callable[[RequestRecord], None] | None = None,
          on_level: Callable[[str, float | None, float | None, int | None], None] | None = None,
          on_level_done: Callable[[Summary], None] | None = None,
          on_engine: Callable[[list[int]], None] | None = None) -> BenchResult:
    """Run a benchmark to the end, or until Ctrl-C; either way return what was measured."""
    base_url = normalize_base_url(url)
    check_credentials(base_url, options.api_key)
    # keep=False: records leave memory once passed on (records.jsonl); each level keeps only its tally.
    recorder = Recorder(on_record=on_record, secrets=(options.api_key,) if options.api_key else (), keep=False,
                        slos=tuple(options.plan.slos or ()))
    state = BenchState(url=base_url, options=options, recorder=recorder, on_level=on_level,
                       on_level_done=on_level_done, on_engine=on_engine)
    try:
        return aio.run(run_bench(state))
    except KeyboardInterrupt:
        # The runner (aio.run, as asyncio.run) has cancelled and finished every task by now, so every request in
        # flight is on the client's list; the load modes took theirs already, this takes the rest.
        state.collect_cancelled()
        return state.result(interrupted=True)
    finally:
        recorder.flush()  # a record still waiting for its recount is written as counted, never lost
