"""The main job: launch an engine, wait for ready, verify, bench single-stream then sweep, stop, summarise.

Each step's result is written to the run directory as soon as it exists (records as each request completes), so
Ctrl-C or a failing step leaves a readable, correct partial run: summary.json says `interrupted` or `failed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from servelab.bench.runner import BenchOptions, bench
from servelab.engines import EngineSpec
from servelab.errors import EngineFailed, UserError
from servelab.provenance import build_provenance
from servelab.records import BenchResult, RunSummary
from servelab.report.live import live_launch
from servelab.report.terminal import render_checks, render_levels, render_lint
from servelab.store.rundir import RunDir
from servelab.verify.runner import verify


@dataclass
class RunOptions:
    spec: EngineSpec = field(default_factory=lambda: EngineSpec(engine="llamacpp", model="smollm2"))
    out_root: Path = Path("runs")
    single: BenchOptions = field(default_factory=lambda: BenchOptions(mode="single", single_requests=8))
    sweep: BenchOptions = field(default_factory=lambda: BenchOptions(mode="sweep", level_duration_s=10.0,
                                                                     max_concurrency=32))
    ready_timeout_s: float = 600.0


def run_main_job(options: RunOptions, console: Console) -> tuple[RunSummary, RunDir]:
    spec = options.spec
    rundir = RunDir.create(options.out_root, spec.engine, Path(spec.model).stem)
    summary = RunSummary(run_id=rundir.run_id, status="interrupted",
                         provenance=build_provenance(engine=spec.engine, model=spec.model))

    def save() -> None:
        summary.headline = {**(summary.single.headline if summary.single else {}),
                            **({k: v for k, v in summary.sweep.headline.items() if k.startswith("peak.")}
                               if summary.sweep else {})}
        rundir.write_json("summary.json", summary)

    save()
    try:
        with live_launch(spec, rundir.path, console, ready_timeout_s=options.ready_timeout_s) as engine:
            summary.provenance = engine.provenance()
            summary.launch = engine.result()
            render_lint(console, summary.launch.lint)
            save()

            console.rule("verify")
            summary.verify = verify(engine.url, model=engine.served_model)
            render_checks(console, summary.verify)
            save()

            for name, opts in (("single", options.single), ("sweep", options.sweep)):
                console.rule(f"bench: {name}")
                opts.model = opts.model or engine.served_model
                result = _bench_step(engine.url, opts, rundir, console)
                setattr(summary, name, result)
                save()
                if result.interrupted:
                    raise KeyboardInterrupt
            summary.status = "complete"
    except KeyboardInterrupt:
        summary.status = "interrupted"
        console.print("[yellow]interrupted: the engine was stopped and partial results were written[/yellow]")
    except UserError as exc:
        summary.status, summary.error = "failed", str(exc)
        if isinstance(exc, EngineFailed) and exc.launch_result is not None:
            summary.launch = exc.launch_result
        raise
    finally:
        rundir.close()
        save()
    return summary, rundir


def _bench_step(url: str, opts: BenchOptions, rundir: RunDir, console: Console) -> BenchResult:
    def progress(record) -> None:
        rundir.append_record(record)

    result = bench(url, opts, on_record=progress)
    render_levels(console, result)
    return result
