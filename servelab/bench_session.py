"""One `bench` against a server, from options to kept results: the run directory and the store when an out
directory is given, the live progress, the measurement, then the results written, in that order.

`servelab bench` (cli.py) and `servelab.bench()` (servelab/api.py) both run a bench through here, so a bench from
a notebook writes, stores and gates exactly what the command does; each only renders the outcome its own way.

Nothing measured is lost to storage: a damaged store stops the bench before it measures anything; afterwards the
run directory is written first, and a store or disk that fails then is a line in `write_errors`, not an exception.
"""

from __future__ import annotations

import dataclasses

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from servelab.bench.failures import error_gate
from servelab.bench.runner import BenchOptions, bench
from servelab.errors import UserError
from servelab.records import BenchResult, Figure
from servelab.report.progress import PIPE_PROGRESS_S, LevelProgress
from servelab.store.rundir import RunDir


RUN_FILE = "run.json"


@dataclass(frozen=True)
class BenchOutput:
    """Where a bench is kept. `out` None: nowhere (the result is only returned or printed)."""

    out: Path | None = None
    store: Path | None = None  # None: <out>/servelab.db (or $SERVELAB_STORE)
    csv: bool = False  # also records.csv and levels.csv in the run directory
    keep_events_text: bool = False  # each token event's text in records.jsonl.gz, not only each answer's

    def __post_init__(self) -> None:
        if self.csv and self.out is None:
            raise UserError("--csv writes next to the run's JSON: give --out DIR too")

    @property
    def store_path(self) -> Path | None:
        from servelab.store.db import default_store_path

        if self.out is None:
            return None
        return Path(self.store) if self.store is not None else default_store_path(Path(self.out))


@dataclass
class BenchRun:
    """A bench's result and what became of it."""

    result: BenchResult
    # Why the error gate (max_error_rate) failed the bench, one line per level; empty: it passed.
    error_gate: list[str] = field(default_factory=list)
    run_dir: Path | None = None  # the run directory (summary.json, records.jsonl.gz), when an out dir was given
    run_id: str | None = None  # the run's id in the store (`servelab show RUN_ID`)
    stored_in: Path | None = None  # the store the run is in; None: not stored (no out dir, or the store failed)
    # What could not be written (a full or read-only disk, a failing store), one line each.
    write_errors: list[str] = field(default_factory=list)

    @property
    def headline(self) -> dict[str, Figure]:
        """The bench's key figures, e.g. "single.decode_tok_s", "peak.output_tok_s"."""
        return self.result.headline

    @property
    def failed(self) -> bool:
        """The error gate failed the bench (the command exits 1)."""
        return bool(self.error_gate)


class BenchSession:
    """`open()` checks the store and creates the run directory (before anything is sent), `measure()` runs the
    bench with its progress on a console, `keep()` writes the results. Between the last two the caller may hold
    Ctrl-C (interrupts.deferred), as the command does, so the results are written whole."""

    def __init__(self, output: BenchOutput, rundir: RunDir | None):
        self.output, self.rundir = output, rundir

    @classmethod
    def open(cls, output: BenchOutput, mode: str) -> BenchSession:
        from servelab.store.db import Store

        stored_in = output.store_path
        if stored_in is not None and stored_in.exists():  # a damaged store stops the run before it measures
            with Store.open(stored_in) as db:
                db.check()
        rundir = None
        if output.out is not None:
            rundir = RunDir.create(Path(output.out), "bench", mode, keep_events_text=output.keep_events_text)
            rundir.open_records()
        return cls(output, rundir)

    def measure(self, url: str, options: BenchOptions, ui: Console) -> BenchResult:
        """Run the bench, its progress shown on `ui` (live on a terminal, a line every 10 s elsewhere). Ctrl-C
        ends it with the partial result (`interrupted`); a set-up error leaves no empty run directory behind."""
        rundir = self.rundir
        if rundir is not None and options.gpu_series is None:  # what the GPUs did, beside the records
            from servelab.host.gpu_telemetry.sampler import SERIES_FILE

            options = dataclasses.replace(options, gpu_series=rundir.path / SERIES_FILE)
        progress = LevelProgress()
        with ui.status("benchmarking…") as status, \
                progress.printing(ui, every_s=None if ui.is_terminal else PIPE_PROGRESS_S, status=status):
            def on_record(record) -> None:  # records leave memory here: only the run directory keeps them
                status.update(progress.add(record))
                if rundir:
                    rundir.append_record(record)

            try:
                return bench(url, options, on_record=on_record, on_level=progress.begin,
                             on_engine=progress.watch_engine)
            except BaseException:
                if rundir is not None:
                    rundir.discard_if_empty()
                raise

    def keep(self, result: BenchResult, options: BenchOptions) -> BenchRun:
        """Judge the error gate, then write the run directory (first: it never depends on the store), the CSV
        files when asked, and the store."""
        from servelab.store.db import Store, store_write_failure
        from servelab.store.export import export_csv, series_of
        from servelab.store.runs import bench_run_summary, save_run

        broken = error_gate(result.levels, options.max_error_rate)
        kept = BenchRun(result=result, error_gate=broken)
        rundir = self.rundir
        if rundir is None:
            return kept
        not_written: list[str] = []
        rundir.close()
        rundir.write_json("summary.json", result)
        if self.output.csv:
            try:
                export_csv(rundir.iter_records(), result.levels, rundir.path, series_of(rundir.path))
            except UserError as exc:  # store/files.py: the path and the errno
                not_written.append(exc.message)
        stored_in = self.output.store_path
        # run.json: the run as the store keeps it, provenance included, so a run directory copied to another
        # machine (`bench --on`) is stored there as it was here
        run = bench_run_summary(result, rundir.run_id,
                                status="interrupted" if result.interrupted else "failed" if broken else "complete",
                                error="; ".join(broken) if broken else None)
        rundir.write_json(RUN_FILE, run)
        try:
            with Store.open(stored_in) as db:  # listed by `servelab runs`, read by show, compare, report, export
                save_run(db, run, rundir.iter_records(), rundir.path)
        except (UserError, sqlite3.Error, OSError) as exc:
            not_written.append(store_write_failure(stored_in, exc))
            stored_in = None
        kept.run_dir, kept.run_id, kept.stored_in = rundir.path, rundir.run_id, stored_in
        kept.write_errors = rundir.write_errors + not_written
        return kept


def render_bench(console: Console, kept: BenchRun) -> None:
    """The bench's tables as `servelab bench` prints them: levels, headline, SLO verdicts, the search's answer,
    and where the run was written."""
    from servelab.report.terminal import render_headline, render_levels

    result = kept.result
    render_levels(console, result)
    render_headline(console, result.headline)
    for lv in result.levels:
        if lv.slo is not None:
            verdict = ", ".join(f"{k} {t['observed_ms']:.1f}" if t["observed_ms"] is not None else f"{k} inf"
                                for k, t in lv.slo["targets"].items())
            judged = lv.slo.get("judged", True)
            outcome = "met" if lv.slo["passed"] else "not met" if judged else "not judged"
            console.print(f"  {lv.tag}: targets {outcome} ({verdict})"
                          + ("" if judged else f": {lv.slo.get('reason')}"), highlight=False)
    if result.search is not None:
        s, goodput = result.search, result.headline.get("slo.goodput_req_s")
        console.print(f"SLO search ({s['targets']}): highest {s['dimension']} that met them: {s.get('best')}"
                      f", lowest that did not: {s.get('lowest_failing')}"
                      + (f"; goodput there {goodput.value:.2f} req/s" if goodput and goodput.value else "")
                      + f" ({s.get('stop_reason')})", highlight=False)
    if kept.run_dir is not None:
        console.print(f"written to {kept.run_dir}" + (f"; stored as run {kept.run_id} in {kept.stored_in}"
                                                      if kept.stored_in else ""), highlight=False)
