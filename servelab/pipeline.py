"""One cell of an experiment: bring the server up (or take the URL of one already running), verify it, bench
single-stream then sweep, stop it, summarise. `servelab run` with or without a file runs every cell through
`run_cell`; the embedded default is an experiment like any other (experiment/default.py).

Each step's result is written to the run directory as soon as it exists (records as each request completes), so
Ctrl-C or a failing step leaves a readable, correct partial run: summary.json says `interrupted` or `failed`.
A cell that cannot start (engine missing, model missing, crash during start-up) or whose server cannot be
reached is returned as `failed` with the reason, never raised: the experiment goes on to the next cell.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from servelab.bench.runner import BenchOptions, bench
from servelab.engines import EngineSpec
from servelab.errors import EngineFailed, UserError
from servelab.lifecycle.launch import RunningEngine
from servelab.provenance import build_provenance
from servelab.records import BenchResult, RunSummary
from servelab.report.live import live_launch
from servelab.report.terminal import render_checks, render_levels, render_lint
from servelab.store.rundir import RunDir
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
    single: BenchOptions
    sweep: BenchOptions | None
    spec: EngineSpec | None = None
    url: str | None = None
    model: str | None = None  # the model id to request at `url` (None: the first the server lists)
    verify: VerifyPlan = field(default_factory=VerifyPlan)
    ready_timeout_s: float = 600.0


def run_cell(plan: CellPlan, console: Console) -> RunSummary:
    """Run one cell to the end; the summary's status says how it ended (complete, failed, interrupted)."""
    rundir = RunDir(plan.run_dir)
    model_name = plan.spec.model if plan.spec else plan.model
    summary = RunSummary(run_id=plan.run_id, status="interrupted",
                         provenance=build_provenance(engine=plan.spec.engine if plan.spec else None,
                                                     model=model_name))

    def save() -> None:
        summary.headline = {**(summary.single.headline if summary.single else {}),
                            **({k: v for k, v in summary.sweep.headline.items() if k.startswith("peak.")}
                               if summary.sweep else {})}
        rundir.write_json("summary.json", summary)

    save()
    try:
        with _server(plan, rundir, console) as engine:
            url, served_model = (engine.url, engine.served_model) if engine else (plan.url, plan.model)
            if engine is not None:
                summary.provenance = engine.provenance()
                summary.launch = engine.result()
                render_lint(console, summary.launch.lint)
                save()
            if plan.verify.enabled:
                console.rule("verify")
                summary.verify = verify(url, model=served_model, only=plan.verify.only, skip=plan.verify.skip,
                                        check_timeout_s=plan.verify.check_timeout_s)
                render_checks(console, summary.verify)
                save()
            for name, opts in (("single", plan.single), ("sweep", plan.sweep)):
                if opts is None:
                    continue
                console.rule(f"bench: {name}")
                opts.model = opts.model or served_model
                result = _bench_step(url, opts, rundir, console)
                setattr(summary, name, result)
                if engine is None and summary.provenance.engine is None:
                    summary.provenance.engine = result.workload.get("engine_detected")
                save()
                if result.interrupted:
                    raise KeyboardInterrupt
            if engine is not None:
                # Again after the load: some engines only reveal a setting in the lines they log while serving.
                summary.launch.lint = engine.lint()
            summary.status = "complete"
    except KeyboardInterrupt:
        summary.status = "interrupted"
        console.print("[yellow]interrupted: the engine was stopped and partial results were written[/yellow]")
    except UserError as exc:
        summary.status, summary.error = "failed", exc.message + (f" ({exc.hint})" if exc.hint else "")
        if isinstance(exc, EngineFailed) and exc.launch_result is not None:
            summary.launch = exc.launch_result
        console.print(f"[bold red]cell failed:[/bold red] {summary.error}", highlight=False)
    finally:
        rundir.close()
        save()
    return summary


@contextlib.contextmanager
def _server(plan: CellPlan, rundir: RunDir, console: Console) -> Iterator[RunningEngine | None]:
    """The engine servelab launched (stopped on leaving), or None for a server that was already running."""
    if plan.spec is None:
        yield None
        return
    with live_launch(plan.spec, rundir.path, console, ready_timeout_s=plan.ready_timeout_s) as engine:
        yield engine


def _bench_step(url: str, opts: BenchOptions, rundir: RunDir, console: Console) -> BenchResult:
    result = bench(url, opts, on_record=rundir.append_record)
    render_levels(console, result)
    return result
