"""Run an experiment: every cell's trials in the experiment's order (experiment/schedule.py) through
pipeline.CellSession, each cell saved to the store after every trial, then the comparison and the HTML report.

Layout: <out>/<UTC time>-<experiment>/ holds experiment.json, comparison.json and report.html, and one run
directory per cell (<cell name>, or <cell name>-2, … when a cell is run again on resume). A run's id is its
directory relative to <out>, e.g. `20261129-155519-default/well-configured`.

Resume: an experiment that did not complete (Ctrl-C, a crash) is picked up by running the same file again: cells
whose key (a hash of their definition and settings) completed are skipped; failed and interrupted ones run again.

One at a time: an experiment is locked (fcntl.flock on `<store>.<name>.lock`, beside the store whose records
decide what resumes) for as long as it runs, so a second `run` of it says which process holds it and exits 2
instead of resuming into the same directory. The kernel releases the lock when its holder exits, however it ends.

Nothing measured is lost to storage: the store is checked before anything is measured (a damaged one is a
UserError, exit 2); each cell's run directory is written first and the store after it, and a store that fails
later is reported (`write_errors`) while the run directories stay complete and the comparison is made from them.
A full or read-only disk during the run is reported the same way (store/rundir.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field
from rich.console import Console

from servelab import SCHEMA_VERSION
from servelab.compare.compare import Comparison, compare_runs
from servelab.compare.run_data import RunData
from servelab.compare.sources import from_summary, literal_run
from servelab.errors import UserError
from servelab.experiment.contention import ContentionGuard, MachineBusy, needs_rerun
from servelab.experiment.model import Cell, Experiment
from servelab.experiment.schedule import trial_schedule
from servelab.pipeline import CellPlan, CellSession, VerifyPlan
from servelab.records import RequestRecord, RunSummary
from servelab.store.db import Store
from servelab.store.experiments import (CellState, cell_states, finish_experiment, latest_experiment,
                                        record_cell, start_experiment)
from servelab.store.db import os_error_words
from servelab.store.read import open_cell_dir, open_stored
from servelab.store.rundir import ensure_writable
from servelab.store.runs import save_run
from servelab.textsafe import inert_markup

ResumeMode = Literal["auto", "require", "never"]


class CellOutcome(BaseModel):
    name: str
    key: str
    status: str  # complete, failed, interrupted, not run
    run_id: str | None = None
    run_dir: str | None = None
    reason: str | None = None
    skipped: bool = False  # complete in an earlier attempt of this experiment


class ExperimentResult(BaseModel):
    schema_version: int = SCHEMA_VERSION
    experiment_id: str
    name: str
    source: str
    # contended: stopped early because the machine stayed busy (experiment/contention.py); it resumes like an
    # interrupted one.
    status: Literal["complete", "interrupted", "contended"]
    stop_reason: str | None = None  # why it stopped early (status contended)
    out_dir: str
    cells: list[CellOutcome] = Field(default_factory=list)
    comparison: Comparison | None = None
    comparison_error: str | None = None  # why there is no comparison (fewer than two complete cells, …)
    report: str | None = None
    runs: list[RunSummary] = Field(default_factory=list)  # the cells' summaries, in cell order
    # What could not be written (a full or read-only disk, a store that failed mid-run), one line each; the
    # measurements are complete in memory and in whatever was written (docs/output.md#disk-full).
    write_errors: list[str] = Field(default_factory=list)

    @property
    def any_failed(self) -> bool:
        return any(c.status == "failed" for c in self.cells) or any(
            s.verify is not None and s.verify.failed for s in self.runs)


@dataclass
class ExperimentOptions:
    out_root: Path = Path("runs")
    store_path: Path | None = None  # None: <out_root>/servelab.db (or SERVELAB_STORE)
    resume: ResumeMode = "auto"
    source: str = "embedded default"
    write_report: bool = True


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:40] or "cell"


def _new_dir(parent: Path, name: str) -> Path:
    for n in range(1, 1000):
        candidate = parent / (name if n == 1 else f"{name}-{n}")
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a directory for {name} under {parent}")


def run_experiment(experiment: Experiment, options: ExperimentOptions, console: Console) -> ExperimentResult:
    from servelab.store.db import default_store_path

    store_path = Path(options.store_path or default_store_path(options.out_root))
    ensure_writable(options.out_root, "output directory")
    with experiment_lock(store_path, experiment.name):
        store = Store.open(store_path)
        try:
            store.check()
            return _run(experiment, options, StoreWrites(store, console), console)
        finally:
            store.close()


def lock_path(store_path: Path, name: str) -> Path:
    """Where the lock of experiment `name` lives: beside the store that says what resumes."""
    digest = hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return store_path.with_name(f"{store_path.name}.{_slug(name)}-{digest}.lock")


@contextlib.contextmanager
def experiment_lock(store_path: Path, name: str) -> Iterator[Path]:
    """Hold the experiment's lock, or raise a UserError naming the process that holds it (exit 2)."""
    path = lock_path(store_path, name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise UserError(f"cannot create the experiment's lock file {path}: {os_error_words(exc)}",
                        hint="point --out or --store somewhere writable") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
            raise UserError(f"experiment '{name}' is already running ({holder}); a second run of it would measure "
                            f"the same cells into the same directory",
                            hint=f"wait for it to end, or give this run another name (lock: {path})") from None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}, since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
                          .encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock (the kernel does too when the process dies)


@dataclass
class StoreWrites:
    """The store while an experiment runs: reads pass through; a write that fails (a damaged page found late, a
    full disk) is reported once and never stops the run, whose run directories keep every result."""

    store: Store
    console: Console
    errors: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.store.path

    @property
    def failed(self) -> bool:
        return bool(self.errors)

    def write(self, what: str, fn: Callable[..., object], *args: object, **kwargs: object) -> None:
        try:
            fn(self.store, *args, **kwargs)
        except (sqlite3.Error, OSError) as exc:
            line = f"the run store {self.store.path} could not be written ({what}): {exc}"
            if not self.errors:
                self.console.print(f"[bold red]store error:[/bold red] {inert_markup(line)}; the run directories "
                                   f"keep every result", highlight=False)
            self.errors.append(line)


def _run(experiment: Experiment, options: ExperimentOptions, store: StoreWrites, console: Console
         ) -> ExperimentResult:
    exp_id, out_dir, states = _open_experiment(experiment, options, store.store, console)
    result = ExperimentResult(experiment_id=exp_id, name=experiment.name, source=options.source,
                              status="interrupted", out_dir=str(out_dir))
    sessions: dict[str, tuple[int, str, CellSession]] = {}  # cell name -> (seq, key, session)
    for seq, cell in enumerate(experiment.cells):
        key = experiment.cell_key(cell)
        done = states.get(key)
        if done is not None and done.status == "complete" and done.run_id:
            console.rule(inert_markup(f"cell {cell.name}: complete in {done.run_id}, skipped"))
            continue
        try:
            run_dir = _new_dir(out_dir, _slug(cell.name))
            (run_dir / "cell.json").write_text(json.dumps({"experiment": experiment.name, "experiment_id": exp_id,
                                                           "cell": cell.name, "cell_key": key,
                                                           "definition": redacted_cell(cell)}, indent=2) + "\n")
        except OSError as exc:  # before anything was measured: stop here
            raise UserError(f"cannot write the cell's run directory under {out_dir}: {os_error_words(exc)}",
                            hint="free some space, or point --out somewhere writable") from None
        run_id = f"{out_dir.name}/{run_dir.name}"
        plan = _plan(experiment, cell, run_id, run_dir)
        host = experiment.host_of(cell)
        if host is not None:  # the same cell, run by servelab on that host (its trials there, back to back)
            from servelab.remote.cell import RemoteCellSession
            from servelab.remote.controller import RemoteOptions

            python, root = experiment.reached_by(cell)
            sessions[cell.name] = (seq, key, RemoteCellSession(plan, experiment.one_cell_there(cell), host,
                                                               console, RemoteOptions(remote_python=python,
                                                                                      remote_dir=root)))
        else:
            sessions[cell.name] = (seq, key, CellSession(plan, console))
    interrupted = False
    try:
        _run_schedule(experiment, sessions, console, lambda name: _save(store, exp_id, sessions[name], name))
    except KeyboardInterrupt:
        interrupted = True
        console.print("[yellow]interrupted: the engines were stopped and partial results were written[/yellow]")
    except MachineBusy as exc:
        interrupted = True
        result.status, result.stop_reason = "contended", exc.message
        console.print(f"[bold yellow]stopped early:[/bold yellow] {inert_markup(exc.message)}", highlight=False)
    finally:
        for name, entry in sessions.items():
            entry[2].finish()
            _save(store, exp_id, entry, name)
    for seq, cell in enumerate(experiment.cells):
        key = experiment.cell_key(cell)
        if cell.name in sessions:
            summary = sessions[cell.name][2].summary
            result.cells.append(CellOutcome(name=cell.name, key=key, status=summary.status, run_id=summary.run_id,
                                            run_dir=str(sessions[cell.name][2].rundir.path), reason=summary.error))
        else:
            result.cells.append(CellOutcome(name=cell.name, key=key, status="complete",
                                            run_id=states[key].run_id, skipped=True))
    _write_state(out_dir, result, sessions, store)
    if interrupted or any(c.status == "interrupted" for c in result.cells):
        store.write("finish the experiment", finish_experiment, exp_id, "interrupted")
        what = "stopped on a busy machine" if result.status == "contended" else "interrupted"
        console.print(f"[yellow]experiment {what}: run it again to resume ({exp_id})[/yellow]")
        result.runs = _summaries(store, result, options.out_root)
        _write_state(out_dir, result, sessions, store)
        return result
    result.status = "complete"
    store.write("finish the experiment", finish_experiment, exp_id, "complete")
    result.runs = _summaries(store, result, options.out_root)
    _conclude(experiment, result, store, out_dir, options, console)
    _write_state(out_dir, result, sessions, store)
    return result


def _run_schedule(experiment: Experiment, sessions: dict[str, tuple[int, str, CellSession]], console: Console,
                  saved) -> None:
    """Every trial of every cell still to run, in the experiment's order (experiment/schedule.py)."""
    names = list(sessions)
    total = len(experiment.cells)
    many = experiment.trials > 1
    if experiment.servers == "all-up":
        for name in names:
            seq, _, session = sessions[name]
            console.rule(f"[bold]cell {seq + 1}/{total}: {inert_markup(name)}[/bold]")
            session.start()
            saved(name)
    schedule = trial_schedule(names, experiment.trials, experiment.order, experiment.seed)
    guard = ContentionGuard(experiment.contention, planned=len(experiment.cells) * experiment.trials)
    extra = {name: 0 for name in names}  # reruns of contended trials so far, per cell (their indices follow)
    up: CellSession | None = None
    for slot, (name, trial) in enumerate(schedule):
        seq, _, session = sessions[name]
        if session.failed:
            continue
        if experiment.servers == "one-at-a-time" and up is not session:
            if up is not None:
                up.stop()
            up = session
        heading = inert_markup(f"cell {seq + 1}/{total}: {name}"
                               + (f", trial {trial + 1}/{experiment.trials}" if many else ""))
        if many or not session.running:  # all-up with one trial: the cell's heading was printed at its start
            console.rule(heading if session.running else f"[bold]{heading}[/bold]")
        if not session.start():
            saved(name)
            continue
        done = session.bench_trial(trial, slot)
        saved(name)
        while done is not None and needs_rerun(done) and not getattr(session, "reruns_itself", False):
            words = f"trial {trial + 1}/{experiment.trials} of {name}" if many else f"the trial of {name}"
            engine = session.engine
            if not guard.after_contended(name, trial, [engine.pid] if engine else [],
                                         None if engine else session.url, words,
                                         lambda line: console.print(inert_markup(line), highlight=False)):
                break
            extra[name] += 1
            console.rule(heading + f" (run again, {extra[name]})")
            done = session.bench_trial(experiment.trials + extra[name] - 1, slot, round=trial)
            saved(name)
    if up is not None:
        up.stop()


def _save(store: StoreWrites, exp_id: str, entry: tuple[int, str, CellSession], name: str) -> None:
    """The cell into the store, after its run directory (CellSession.save wrote it): a store that fails is
    reported and skipped from then on, never the end of the run. Only the records that came since the cell was
    last saved are written (store/stored_records.py): saving after each trial costs that trial's records."""
    if store.failed:
        return
    seq, key, session = entry
    summary = session.summary
    records = session.rundir.iter_records()
    store.write(f"cell {name}", save_run, summary, records, session.rundir.path, cell_name=name,
                experiment_id=exp_id)
    store.write(f"cell {name}", record_cell, exp_id, CellState(cell_key=key, cell_name=name, seq=seq,
                                                              run_id=summary.run_id, status=summary.status,
                                                              reason=summary.error))


def _open_experiment(experiment: Experiment, options: ExperimentOptions, store: Store, console: Console
                     ) -> tuple[str, Path, dict[str, CellState]]:
    latest = latest_experiment(store, experiment.name) if options.resume != "never" else None
    resumable = latest is not None and (options.resume == "require" or latest[2] != "complete")
    if options.resume == "require" and latest is None:
        raise UserError(f"no experiment named '{experiment.name}' to resume in {store.path}")
    if resumable:
        exp_id, out_dir = latest[0], Path(latest[1])
        states = cell_states(store, exp_id)
        done = sum(1 for s in states.values() if s.status == "complete")
        console.print(f"resuming experiment {exp_id}: {done} cell(s) complete", highlight=False)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        out_dir = _new_dir(options.out_root, f"{stamp}-{_slug(experiment.name)}")
        exp_id, states = out_dir.name, {}
    try:
        start_experiment(store, exp_id, experiment.name, options.source, str(out_dir))
    except sqlite3.Error as exc:  # before anything was measured: stop here
        raise UserError(f"cannot write the run store {store.path}: {exc}",
                        hint="free some space, or point --store elsewhere") from None
    return exp_id, out_dir, states


def redacted_cell(cell: Cell) -> dict:
    """The cell's definition for cell.json, with secret flag values and secret-looking environment values
    replaced, as provenance writes them, and URL credentials hidden (servelab/redaction.py)."""
    from servelab.redaction import redact_command, redact_env, redact_url

    doc = cell.model_dump(mode="json")
    if doc.get("extra_args"):
        doc["extra_args"] = redact_command(doc["extra_args"])
    if doc.get("env"):
        doc["env"] = redact_env(doc["env"])
    if doc.get("url"):
        doc["url"] = redact_url(doc["url"])
    if doc.get("options"):
        doc["options"] = redact_env(doc["options"])  # e.g. the command engine's url option
    return doc


def _plan(experiment: Experiment, cell: Cell, run_id: str, run_dir: Path) -> CellPlan:
    bench = experiment.bench_for(cell)
    verify = experiment.verify_for(cell)
    steps = bench.step_options(model=cell.model if cell.url else None)
    return CellPlan(run_id=run_id, run_dir=run_dir, steps=steps, spec=cell.spec(), url=cell.url,
                    model=cell.model if cell.url else None, ready_timeout_s=experiment.ready_timeout_s,
                    # reruns off: nothing would run a stopped trial again, so every trial runs to its end
                    stop_when_contended_s=experiment.contention.stop_after_s if experiment.contention.reruns else None,
                    verify=VerifyPlan(enabled=verify.enabled, only=verify.only, skip=list(verify.skip),
                                      check_timeout_s=verify.check_timeout_s), trials=experiment.trials,
                    cache_reset=experiment.cache_reset)


def _load(store: Store | StoreWrites, run_id: str, out_root: Path | None = None
          ) -> tuple[RunSummary, Iterable[RequestRecord]]:
    """A run from the store; from its run directory when the store failed during this experiment (or has no
    such run), since the directory was written first and is complete. The records stream either way."""
    if isinstance(store, StoreWrites):
        if not store.failed:
            with contextlib.suppress(sqlite3.Error, UserError):
                opened = open_stored(store.store, run_id)
                return opened.summary, opened.records
        store = None  # type: ignore[assignment]
    if store is not None:
        opened = open_stored(store, run_id)
        return opened.summary, opened.records
    path = Path(out_root or ".") / run_id
    try:
        opened = open_cell_dir(path)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read run {run_id} from its directory {path}: {exc}") from None
    return opened.summary, opened.records


def _summaries(store: StoreWrites, result: ExperimentResult, out_root: Path) -> list[RunSummary]:
    return [_load(store, c.run_id, out_root)[0] for c in result.cells if c.run_id]


def _write_state(out_dir: Path, result: ExperimentResult, sessions: dict[str, tuple[int, str, CellSession]],
                 store: StoreWrites) -> None:
    """experiment.json, atomically; what could not be written (here or in a cell's directory, or the store) is
    gathered into `result.write_errors`."""
    errors = [line for _, _, session in sessions.values() for line in session.rundir.write_errors]
    errors += store.errors
    doc = result.model_dump(mode="json", exclude={"runs"})
    doc["write_errors"] = errors
    tmp = out_dir / "experiment.json.tmp"
    try:
        tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        tmp.replace(out_dir / "experiment.json")
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        errors.append(f"could not write {out_dir / 'experiment.json'}: {os_error_words(exc)}")
    result.write_errors = list(dict.fromkeys(result.write_errors + errors))


def experiment_runs(experiment: Experiment, result: ExperimentResult, store: Store | StoreWrites,
                    out_root: Path | None = None) -> list[RunData]:
    """The runs to compare, baseline first: the named baseline (a cell or literal figures), else the first cell
    that completed; then the other complete cells in file order, then the other literal baselines."""
    runs: list[RunData] = []
    for cell in result.cells:
        if cell.status == "complete" and cell.run_id:
            summary, records = _load(store, cell.run_id, out_root)
            runs.append(from_summary(summary, records, cell.name, cell.run_id, result.experiment_id))
    runs += [literal_run(name, figures) for name, figures in experiment.baselines.items()]
    if experiment.baseline is not None:
        chosen = [r for r in runs if r.name == experiment.baseline]
        runs = chosen + [r for r in runs if r.name != experiment.baseline]
    return runs


def _conclude(experiment: Experiment, result: ExperimentResult, store: StoreWrites, out_dir: Path,
              options: ExperimentOptions, console: Console) -> None:
    from servelab.report.compare_terminal import render_comparison, render_experiment
    from servelab.report.html import write_report

    render_experiment(console, result)
    runs = experiment_runs(experiment, result, store, options.out_root)
    if len(runs) >= 2:
        try:
            result.comparison = compare_runs(runs)
        except UserError as exc:
            result.comparison_error = exc.message
    else:
        result.comparison_error = "fewer than two cells completed: nothing to compare"
    if result.comparison is not None:
        try:
            (out_dir / "comparison.json").write_text(result.comparison.model_dump_json(indent=2) + "\n",
                                                     encoding="utf-8")
        except OSError as exc:
            result.write_errors.append(f"could not write {out_dir / 'comparison.json'}: {os_error_words(exc)}")
        render_comparison(console, result.comparison)
    else:
        console.print(f"[yellow]no comparison: {result.comparison_error}[/yellow]")
    if options.write_report:
        measured = [r for r in runs if not r.literal]
        if measured:
            try:
                path = write_report(measured, result.comparison, out_dir / "report.html",
                                    title=f"servelab experiment {experiment.name}")
            except UserError as exc:  # the disk filled or turned read-only (store/files.py: no .tmp is left)
                result.write_errors.append(exc.message)
            else:
                result.report = str(path)
                console.print(f"report: {path}", highlight=False)
    console.print(f"written to {out_dir}", highlight=False)
