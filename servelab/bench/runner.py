"""`bench URL`: find out what serves the URL, run the levels of its mode (bench/modes/), summarise.

The state of a run lives in a BenchState that is filled as the run goes, so Ctrl-C (or a crash of a later step)
leaves a partial but correct result: every completed request is kept, every request that was in flight is kept
with error_kind "cancelled" and what it had received, and the level in progress is summarised over the time it
actually ran (bench/levels.py).

The runner does what every mode shares: it checks the options (the mode's own validation, the descriptors its
streams need), probes the server and prepares the workload, opens the client, the environment sampler and the
server-metrics watcher, warms up, then hands over to the mode, which runs its levels through bench/levels.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from servelab import aio
from servelab.bench.client import ClientOptions
from servelab.bench.gpu_run import GpuRun
from servelab.bench.levels import INTERRUPTED_LEVEL, interrupted_level
from servelab.bench.limits import DescriptorShortage, auth_headers, check_descriptors
from servelab.bench.loads import Recorder, Target, make_spec
from servelab.bench.modes import Mode, get_mode, mode_of
from servelab.bench.sender import Sender
from servelab.bench.server_metrics import MetricsWatcher
from servelab.bench.stall_stacks import IdleDeadlineStacks
from servelab.bench.state import BenchOptions, BenchStopped, RunState
from servelab.bench.tokenizer import LlamaCppServerTokenizer, probe_server_tokenizer, tokenizer_from_option
from servelab.bench.unary_client import EndpointClient
from servelab.bench.warmup import plan_warmup
from servelab.bench.workers import auto_workers, open_pool
from servelab.bench.workloads import counter_for
from servelab.engines import get_engine
from servelab.engines.detect import detect_engine_config
from servelab.errors import UserError
from servelab.host.environment import EnvironmentSampler, is_local_host
from servelab.net import check_credentials, ensure_reachable, normalize_base_url
from servelab.protocol.dialects import Dialect, dialect_for
from servelab.records import BenchResult, Figure, RequestRecord, Summary

__all__ = ["BenchOptions", "BenchState", "BenchStopped", "bench", "headline"]


@dataclass
class BenchState(RunState):
    """A run's state (bench/state.py), and the result it makes."""

    def result(self, interrupted: bool = False) -> BenchResult:
        levels = list(self.levels)
        if interrupted:
            partial = interrupted_level(self)
            if partial is not None:
                levels.append(partial)
        opts = self.options
        run_mode = mode_of(opts)
        load_plan = run_mode.describe_load(opts)
        result = BenchResult(url=self.url, model=self.model, mode=opts.mode,
                             workload=opts.workload.describe(self.accepts_ignore_eos, self.accepts_min_tokens) |
                             {"engine_detected": self.engine,
                              "tokenizer": self.tokenizer.name if self.tokenizer else None} |
                             ({"load_plan": load_plan} if load_plan is not None else {}) |
                             ({"gpu_telemetry": self.gpu.provenance()} if self.gpu is not None else {}),
                             levels=levels, stop_reason=self.stop_reason, interrupted=interrupted,
                             search=self.search, warnings=list(self.warnings),
                             workers=self.client.provenance() if self.client is not None else [])
        result.headline = run_mode.headline(result)
        return result


def headline(result: BenchResult) -> dict[str, Figure]:
    """The story's numbers of a result, as its mode declares them (single-stream decode tok/s, peak output
    tok/s, an SLO search's answer, …), keyed as baselines name them."""
    return get_mode(result.mode).headline(result)


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
        state.accepts_ignore_eos = adapter.sends_field("ignore_eos", workload_dialect(state))
        state.server_slots = adapter.slots(config)
    option = state.options.tokenizer
    if option == "auto":
        state.tokenizer = (LlamaCppServerTokenizer(url, api_key=state.options.api_key)
                           if await probe_server_tokenizer(session, url) else None)
    else:
        state.tokenizer = tokenizer_from_option(option, url, api_key=state.options.api_key)


async def prepare_workload(state: BenchState, session: aiohttp.ClientSession) -> None:
    """Read files and measure prompts before any request is timed."""
    adapter = get_engine(state.engine) if state.engine else None
    state.accepts_min_tokens = adapter.sends_field("min_tokens", workload_dialect(state)) if adapter else False
    counter = counter_for(state.engine, session, state.url, model=state.model)
    await state.options.workload.prepare(counter, needed=planned_requests(state))
    probe = getattr(state.options.workload, "probe_endpoint", None)
    if probe is not None:  # a non-streamed endpoint: which path serves it, what a right answer is (workloads/unary.py)
        await probe(session, state.url, state.model)


def workload_dialect(state: BenchState) -> Dialect:
    """The dialect of the workload's endpoint: with the engine, it decides which of the engine's own request fields
    (ignore_eos, min_tokens) are sent (EngineAdapter.sends_field): none on /v1/messages, whose converters in llama.cpp
    and vLLM keep only Anthropic's fields; on /v1/responses those the engine's ResponsesRequest reads."""
    return dialect_for(getattr(state.options.workload, "endpoint", "/v1/chat/completions"))


def planned_requests(state: BenchState) -> int | None:
    """How many requests the run will build, when the plan fixes it (None: it depends on time)."""
    opts = state.options
    levels = mode_of(opts).planned_requests(opts)
    return None if levels is None else plan_warmup(opts, state.server_slots).total + levels


async def run_bench(state: BenchState) -> BenchResult:
    opts = state.options
    run_mode = mode_of(opts)
    run_mode.validate(opts)
    streams = run_mode.streams_needed(opts)
    if streams is not None:  # before anything is sent: a limit too low for the load asked for is a set-up error
        check_descriptors(*streams)
    # The API key goes with every request servelab makes, not only the streams: /v1/models, the engine's
    # fingerprint, /tokenize, the prompt counters and /metrics.
    headers = auth_headers(opts.api_key)
    async with aiohttp.ClientSession(headers=headers) as probe_session:
        await prepare(state, probe_session)
        state.recorder.tokenizer = state.tokenizer  # chunk-counted records wait for it before they are written
        await prepare_workload(state, probe_session)
    adapter = get_engine(state.engine) if state.engine else None
    extras = adapter.stream_extras if adapter else {}
    client_opts = ClientOptions(deadlines=opts.deadlines, api_key=opts.api_key, stream_extras=dict(extras))
    target = Target(model=state.model, accepts_ignore_eos=state.accepts_ignore_eos,
                    accepts_min_tokens=state.accepts_min_tokens)
    async with EnvironmentSampler(opts.engine_pids, url=state.url) as environment, \
            MetricsWatcher(state.url, adapter.metric_names if adapter else {}, headers=headers) as watcher, \
            open_client(state, client_opts) as client:
        state.watcher, state.client, state.environment = watcher, client, environment
        await open_gpu(state, environment.engine_roots)
        if state.on_engine is not None:
            state.on_engine(list(dict.fromkeys(environment.engine_roots)))
        if client.local_pids:  # the workers' CPU on this host is the client's, not other load
            environment.add_client_pids(client.local_pids)
        on_record = state.recorder.on_record
        state.idle_stacks = IdleDeadlineStacks(lambda: environment.engine_roots, adapter)
        state.recorder.on_record = state.idle_stacks.watching(on_record)
        try:
            await until_contended(state, run_levels(state, run_mode, client, target))
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
        finally:
            state.recorder.on_record = on_record
            state.idle_stacks.close()
            state.gpu.stop()  # every way out: the levels summarised, Ctrl-C, a crash (bench() closes it too)
    return state.result()


async def open_gpu(state: BenchState, engine_roots: list[int]) -> None:
    """The bench's GPU telemetry (bench/gpu_run.py): NVML only when the engine runs on this host (servelab
    launched it, its process listens on the URL's port here, or the URL is this machine's)."""
    opts = state.options
    host = urlsplit(state.url).hostname
    local = bool(opts.engine_pids) or bool(engine_roots) or is_local_host(host)
    pids = list(opts.engine_pids) or list(engine_roots)
    state.gpu = await asyncio.to_thread(GpuRun.open, enabled=opts.gpu, urls=list(opts.gpu_metrics), local=local,
                                        series=opts.gpu_series, engine_pids=pids)
    if state.environment is not None and state.gpu.sampler is not None:
        state.gpu.add_engine_pids(set(state.environment.engine_roots))


async def run_levels(state: BenchState, run_mode: Mode, client: Sender, target: Target) -> None:
    await warm_up(state, client, target, tag=run_mode.warmup_tag)
    await run_mode.run(state, client, target)


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


def open_client(state: BenchState, client_opts: ClientOptions) -> Sender:
    """This process's client (a StreamClient that also sends non-streamed requests: bench/unary_client.py), or with
    --workers/--ray a pool of workers that the load modes use the same way (bench/workers/coordinator.py)."""
    opts = state.options
    if opts.workers is None and opts.ray is None:
        return EndpointClient(state.url, client_opts)
    workers = opts.workers or 1
    if workers == "auto" and opts.ray is None:  # under Ray, auto is the cluster's CPUs (ray_backend.py)
        ceiling = state.client_ceiling.ceiling_streams if state.client_ceiling else None
        workers = auto_workers(mode_of(opts).most_streams(opts), ceiling)
    return open_pool(state.url, client_opts, workers, ray=opts.ray, on_warning=state.warnings.append)


async def warm_up(state: BenchState, client: Sender, target: Target, tag: str) -> None:
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
        if state.gpu is not None:
            state.gpu.close()  # the sampler stopped, a temporary series removed
        close = getattr(options.workload, "close", None)
        if close is not None:  # what the workload left for the server to read (image files) goes with the bench
            close()
