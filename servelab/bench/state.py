"""What one bench holds while it runs: its options (BenchOptions) and its state (RunState), filled as the run
goes, so Ctrl-C (or a crash of a later step) leaves a partial but correct result (bench/runner.py).

Below the level runner (bench/levels.py) and the modes (bench/modes/), which read and fill it; the runner turns it
into a BenchResult.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.bench.client import Deadlines
from servelab.bench.level_spec import LevelSpec
from servelab.bench.loads import Recorder
from servelab.bench.plans import LoadPlan
from servelab.bench.selftest import SelftestResult, load_ceiling
from servelab.bench.sender import Sender
from servelab.bench.server_metrics import MetricsWatcher
from servelab.bench.steady import SteadyRule
from servelab.bench.tokenizer import Tokenizer
from servelab.bench.workload import Workload
from servelab.bench.workloads import WorkloadSource
from servelab.host.environment import EnvironmentSampler
from servelab.records import Summary


@dataclass
class BenchOptions:
    mode: str = "single"  # a registered mode (bench/modes/): single, sweep, concurrency, rate, rate-sweep, …
    model: str | None = None
    workload: WorkloadSource = field(default_factory=Workload)
    single_requests: int = 8
    # Warm-up before the first level: None (auto) the plan's highest concurrency at once, capped by the server's
    # slots, then one alone; a number: that many one at a time (bench/warmup.py; docs/metrics.md#warm-up).
    warmup: int | None = None
    level_duration_s: float = 10.0
    max_concurrency: int = 64
    # The stop rule of the sweep and of the rate ramp, "until throughput stops growing"
    # (bench/modes/escalation.py; docs/metrics.md#peak-output-tok-s): a level grows when its output tok/s beats
    # the best so far by `min_gain`; the ladder stops after `patience` levels in a row that do not (one noisy
    # level is not a plateau).
    min_gain: float = 0.03
    patience: int = 2
    deadlines: Deadlines = field(default_factory=Deadlines)
    api_key: str | None = None
    # How to count tokens when the server gives no per-chunk counts: auto (the server's tokenizer endpoint when
    # it has one), server, none, calibration, or a path to a tokenizer.json. See bench/tokenizer.py.
    tokenizer: str = "auto"
    # The modes beyond single and sweep (concurrency, rate, rate-sweep, slo-search, …): see bench/plans.py.
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
    # What the GPUs did (bench/gpu_run.py; docs/metrics.md#gpu): sampled unless `gpu` is False, from NVML when the
    # engine runs on this host, else the DCGM exporters at `gpu_metrics` (and dcgm-exporter's default local one),
    # else amdsmi; the series goes to `gpu_series` (the run directory's), or a temporary file removed at the end.
    gpu: bool = True
    gpu_metrics: list[str] = field(default_factory=list)
    gpu_series: Path | None = None
    # The engine's lint findings when servelab launched it: GPU hints name the setting that explains them.
    engine_findings: list[Any] = field(default_factory=list)
    # The tag of the level to run the engine's profiler around (bench/profiler.py); None: no profile.
    profile_level: str | None = None


class BenchStopped(Exception):
    """A level found that the run cannot go on (the server is gone, the client ran out of file descriptors): the
    levels measured so far are kept and the run stops with this reason."""


@dataclass
class RunState:
    url: str
    options: BenchOptions
    model: str = ""
    engine: str | None = None
    accepts_ignore_eos: bool = False
    recorder: Recorder = field(default_factory=Recorder)
    levels: list[Summary] = field(default_factory=list)
    current: tuple[str, int, int] | None = None  # (tag, concurrency, start_ns) of the level in progress
    # What the level in progress is (its summary's mode, rate and load), for a partial summary on Ctrl-C.
    current_spec: LevelSpec | None = None
    stop_reason: str | None = None
    tokenizer: Tokenizer | None = None
    watcher: MetricsWatcher | None = None  # the server's /metrics, when the engine is known to have them
    client_ceiling: SelftestResult | None = field(default_factory=load_ceiling)
    accepts_min_tokens: bool = False  # the engine honours `min_tokens` (set when the workload is prepared)
    search: dict[str, Any] | None = None  # slo-search: probes, bracket and answer (bench/modes/slo_search.py)
    client: Sender | None = None  # the run's client, for the requests it recorded as cancelled
    environment: EnvironmentSampler | None = None  # what the machine did during each level (host/environment.py)
    gpu: Any = None  # the bench's GPU telemetry (bench/gpu_run.GpuRun), set by the runner
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
    # The engine's stacks when a level's stream hits its idle deadline (bench/stall_stacks.py), set by the runner.
    idle_stacks: Any = None

    def level_done(self, summary: Summary) -> None:
        self.levels.append(summary)
        if self.on_level_done is not None:
            self.on_level_done(summary)

    def collect_cancelled(self) -> None:
        """Pass on the requests that were in flight when the run was interrupted and that no load mode took yet
        (a warm-up request, a task the event loop cancelled last): recorded like any other, as "cancelled"."""
        if self.client is not None:
            self.recorder.add_cancelled(self.client)
