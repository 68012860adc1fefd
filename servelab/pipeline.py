"""One cell of an experiment: bring the server up (or take the URL of one already running), verify it, bench it
once per trial (its bench steps in order: by default single-stream then the sweep), stop it, summarise.
`servelab run` with or without a file runs every cell through a CellSession; the embedded default is an experiment
like any other (experiment/default.py).

A session outlives one trial, so an experiment can keep every cell's server up and interleave their trials
(experiment/schedule.py), or stop a server between its trials when only one fits at a time.

Each step's result is written to the run directory as soon as it exists (records as each request completes), so
Ctrl-C or a failing step leaves a readable, correct partial run: summary.json says `interrupted` or `failed`.
A cell that cannot start (engine missing, model missing, crash during start-up) or whose server cannot be
reached is marked `failed` with the reason, never raised: the experiment goes on to the next cell.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.text import Text

from servelab.bench.failures import error_gate, error_line
from servelab.bench.runner import BenchOptions, bench
from servelab.bench.trials import counted_trials, pooled_steps, run_headline
from servelab.engines import EngineSpec
from servelab.errors import EngineFailed, UserError
from servelab.lifecycle.launch import start_engine
from servelab.lifecycle.running import RunningEngine
from servelab.provenance import build_provenance
from servelab.records import BenchResult, RequestRecord, RunSummary, Step, Summary, Trial
from servelab.report.live import launch_view
from servelab.report.progress import PIPE_PROGRESS_S, LevelProgress
from servelab.report.terminal import level_line, render_checks, render_levels, render_lint
from servelab.store.rundir import RunDir
from servelab.textsafe import inert, inert_markup
from servelab.verify.runner import verify


@dataclass
class VerifyPlan:
    enabled: bool = True
    only: list[str] | None = None
    skip: list[str] = field(default_factory=list)
    check_timeout_s: float = 30.0


@dataclass
class CellPlan:
    """Everything one cell needs. Exactly one of `spec` (launch it) and `url` (already running) is set."""

    run_id: str
    run_dir: Path
    # A trial's bench steps, in order: (name, options); by default ("single", …) then ("sweep", …).
    steps: list[tuple[str, BenchOptions]]
    spec: EngineSpec | None = None
    url: str | None = None
    model: str | None = None  # the model id to request at `url` (None: the first the server lists)
    verify: VerifyPlan = field(default_factory=VerifyPlan)
    ready_timeout_s: float = 600.0
    trials: int = 1  # how many trials the experiment plans for this cell (for the headings)
    # End a trial early when a level has been contended this many seconds (experiment/contention.py reruns it once
    # the machine is quiet); None: every trial runs to its end.
    stop_when_contended_s: float | None = None
    cache_reset: bool = True  # empty the server's prefix cache before each trial (bench/cache_reset.py)


def in_series(workload, trial: int, step: str):
    """The workload with its prompts numbered for one bench (trial and step) where it numbers them (the default
    stories): a server that answered trial 1 would otherwise find trial 2's prompts in its prefix cache, and the
    sweep the single-stream step's. The step's whole name, which is unique within a trial (single and sweep
    share their first letter)."""
    if dataclasses.is_dataclass(workload) and any(f.name == "series" for f in dataclasses.fields(workload)):
        return dataclasses.replace(workload, series=f"t{trial}-{step}")
    return workload


class CellSession:
    """One cell's run directory and server across its trials. `start()` brings the server up (and verifies it
    the first time), `bench_trial()` runs one trial, `stop()` stops the server (it can be started again),
    `finish()` ends the cell. The summary is saved after every step."""

    def __init__(self, plan: CellPlan, console: Console):
        self.plan, self.console = plan, console
        self.rundir = RunDir(plan.run_dir)
        self.summary = RunSummary(run_id=plan.run_id, status="interrupted",
                                  provenance=build_provenance(engine=plan.spec.engine if plan.spec else None,
                                                              model=plan.spec.model if plan.spec else plan.model))
        self.engine: RunningEngine | None = None
        self._stack = contextlib.ExitStack()
        self.url: str | None = plan.url
        self.served_model: str | None = plan.model
        self.failed = False
        self._sweep_levels: list[int] | None = None  # the concurrencies of the first trial's sweep
        self._shown: set[int] = set()  # levels of the bench step in progress whose line is printed already
        self.save()

    # ---- the server ----
    @property
    def running(self) -> bool:
        return self.plan.spec is None or self.engine is not None

    def start(self) -> bool:
        """Bring the server up (a URL cell: nothing to start) and verify it once. False when the cell failed (the
        summary says why); KeyboardInterrupt propagates."""
        if self.failed:
            return False
        try:
            if self.plan.spec is not None and self.engine is None:
                self.engine = self._stack.enter_context(start_engine(self.plan.spec, self.rundir.path,
                                                                     view=launch_view(self.console),
                                                                     ready_timeout_s=self.plan.ready_timeout_s))
                self.url, self.served_model = self.engine.url, self.engine.served_model
                from servelab.lifecycle.exposure import engine_exposure

                exposed = engine_exposure(self.engine)  # a cell bound to 0.0.0.0 (issue 11 item 16)
                if exposed is not None:
                    self.console.print(f"[bold yellow]warning:[/bold yellow] {inert_markup(exposed.warning())}",
                                       highlight=False)
                self.summary.provenance = self.engine.provenance()
                launch = self.engine.result()
                if self.summary.launch is None:
                    render_lint(self.console, launch.lint)
                self.summary.launch = launch
                self.save()
            if self.plan.verify.enabled and self.summary.verify is None:
                self.console.rule("verify")
                v = self.plan.verify
                self.summary.verify = verify(self.url, model=self.served_model, only=v.only, skip=v.skip,
                                             check_timeout_s=v.check_timeout_s)
                render_checks(self.console, self.summary.verify)
                self.save()
            return True
        except UserError as exc:
            if isinstance(exc, EngineFailed) and exc.launch_result is not None:
                self.summary.launch = exc.launch_result
            self.fail(exc)
            return False

    def stop(self) -> None:
        """Stop the server servelab launched (lint read again first: some engines only reveal a setting in the
        lines they log while serving)."""
        if self.engine is not None:
            with contextlib.suppress(Exception):
                if self.summary.launch is not None:
                    self.summary.launch.lint = self.engine.lint()
            self.engine = None
            self._stack.close()
            self._stack = contextlib.ExitStack()
            self.save()

    # ---- trials ----
    def bench_trial(self, index: int, slot: int | None = None, round: int | None = None) -> Trial | None:
        """Run trial `index` against the running server (`round`: the round of the schedule it reruns, when it
        stands in for a contended trial). Returns it (None when the cell failed during it); a trial ended early
        on a busy machine comes back with status "contended" and why."""
        trial = Trial(index=index, slot=slot, status="interrupted", round=round,
                      started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        self.summary.trials.append(trial)
        many = self.plan.trials > 1
        trial.cache_reset = self._reset_cache()
        try:
            for step_no, (name, base) in enumerate(self.plan.steps):
                opts = dataclasses.replace(base, model=base.model or self.served_model, trial=index,
                                           engine_pids=[self.engine.pid] if self.engine else [],
                                           stop_when_contended_s=self.plan.stop_when_contended_s,
                                           workload=in_series(base.workload, index, name),
                                           # what the GPUs did, one series per bench (docs/output.md#gpu-series)
                                           gpu_series=self.rundir.path / f"gpu_series-{index}-{step_no}.jsonl.gz",
                                           engine_findings=list(self.summary.launch.lint) if self.summary.launch
                                           else [])
                if base.mode == "sweep" and self._sweep_levels:
                    opts.sweep_levels = list(self._sweep_levels)  # every trial runs the first trial's levels
                if not many:
                    self.console.rule(f"bench: {name}")
                result = self._bench(opts, name if many else None)
                trial.steps.append(Step(name=name, result=result))
                if result.contended_stop:  # the machine was busy: kept as evidence, run again when it is quiet
                    self._render(name, result, many)
                    trial.status, trial.contention = "contended", list(result.contended_stop)
                    self.save()
                    return trial
                if base.mode == "sweep" and self._sweep_levels is None:
                    self._sweep_levels = [s.concurrency for s in result.levels if s.mode == "concurrency"]
                if self.summary.provenance.engine is None:
                    self.summary.provenance.engine = result.workload.get("engine_detected")
                self._render(name, result, many)
                self.save()
                if result.interrupted:
                    raise KeyboardInterrupt
                broken = error_gate(result.levels, opts.max_error_rate)
                if broken:
                    trial.status = "failed"
                    self.fail(UserError(f"bench {name} broke the error gate: " + "; ".join(broken)))
                    return None
            trial.status = "complete"
            self.save()
            return trial
        except UserError as exc:
            trial.status = "failed"
            self.fail(exc)
            return None

    def _reset_cache(self) -> str:
        """The server's prefix cache emptied before a trial (or why not), in one line, printed and returned."""
        from servelab.bench.cache_reset import reset_prefix_cache

        line = (reset_prefix_cache(self.url, self.plan.spec.engine if self.plan.spec else None,
                                   api_key=self.plan.steps[0][1].api_key if self.plan.steps else None).line
                if self.plan.cache_reset and self.url else "not reset: turned off (cache_reset: false)")
        self.console.print(Text(f"  cache  {line}", style="" if line.startswith("reset") else "yellow"),
                           highlight=False)
        return line

    def _bench(self, opts: BenchOptions, lines_as: str | None = None) -> BenchResult:
        """One bench step. With `lines_as` (a step's name: trials print a line per level, not tables), each
        level's line is printed as the level ends, not when the whole sweep does."""
        self._shown = set()

        def print_level(level: Summary) -> None:
            self._shown.add(id(level))
            self._level_lines(lines_as, level)

        # The level running now, as `bench` shows it: live in a terminal, a line every 10 s into a pipe or a CI
        # log, so a sweep whose levels end together is never silent (report/progress.py).
        # The engine servelab launched is a child of this process: its CPU is shown as the engine's, not the client's.
        progress = LevelProgress(engine_pids=opts.engine_pids)
        live = self.console.is_terminal
        with (self.console.status("benchmarking…") if live else contextlib.nullcontext()) as status, \
                progress.printing(self.console, every_s=None if live else PIPE_PROGRESS_S, status=status):
            def on_record(record: RequestRecord) -> None:
                record.trial = opts.trial
                self.rundir.append_record(record)
                progress.add(record)

            result = bench(self.url, opts, on_record=on_record, on_level=progress.begin,
                           on_engine=progress.watch_engine,
                           on_level_done=print_level if lines_as is not None else None)
        for level in result.levels:
            level.trial = opts.trial
        return result

    def _render(self, name: str, result: BenchResult, many: bool) -> None:
        if not many:
            render_levels(self.console, result)
            return
        for level in result.levels:
            if id(level) not in self._shown:  # a level summarised only when the bench ended (interrupted)
                self._level_lines(name, level)

    def _level_lines(self, name: str, level: Summary) -> None:
        busy = level.environment is not None and level.environment.contended
        self.console.print(Text(f"  {name:6} {level_line(level)}" + ("  ⚠ contended" if busy else ""),
                                style="yellow" if busy else ""), highlight=False)
        for error in level.top_errors:
            self.console.print(Text(f"         {level.tag} error: {inert(error_line(error))}", style="red"),
                               highlight=False)

    # ---- the end ----
    def fail(self, exc: UserError) -> None:
        self.failed = True
        self.summary.status = "failed"
        self.summary.error = exc.message + (f" ({exc.hint})" if exc.hint else "")
        self.console.print(f"[bold red]cell failed:[/bold red] {inert_markup(self.summary.error, multiline=True)}",
                           highlight=False)
        self.save()

    def finish(self) -> RunSummary:
        """Stop the server and write the final summary: complete when every planned trial completed (a cell
        whose trials all ran before an interruption is complete)."""
        self.stop()
        if not self.failed:
            done = sum(1 for t in self.summary.trials if t.status == "complete")
            self.summary.status = "complete" if done >= self.plan.trials else "interrupted"
        self.rundir.close()
        self.save(final=True)
        return self.summary

    def save(self, final: bool = False) -> None:
        """summary.json, its headline pooled over the trials that count (bench/trials.py)."""
        trials = self.summary.trials
        if len(trials) <= 1:
            only = trials[0] if trials else None
            self.summary.headline = run_headline(only.steps) if only else {}
            self.summary.excluded_trials = []
        elif final or all(t.status != "interrupted" for t in trials):
            counted, excluded = counted_trials(trials)
            # The records file (and any the disk refused), read one record at a time: memory stays flat.
            self.summary.headline = run_headline(pooled_steps(counted, self.rundir.iter_records()))
            self.summary.excluded_trials = [t.index for t in excluded]
        self.rundir.write_json("summary.json", self.summary)
