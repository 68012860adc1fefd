"""Runs in the store: save one (everything it measured), list them, read one back.

A run is saved whole in one transaction, replacing any earlier copy under the same id (a run is saved again when
it ends, after being saved interrupted, and after each trial of a cell). Reading it back gives the RunSummary its
run directory holds and its per-request records, so `compare` and `report` work the same from the store or from a
directory. The records are pointed at in the run directory's records file or held compressed
(store/stored_records.py); saved again, a run writes only the records that came since.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from servelab.errors import UserError
from servelab.records import BenchResult, RequestRecord, RunSummary, Step, Trial
from servelab.store.db import Store
from servelab.store.migrations import GPU_LEVEL_COLUMNS
from servelab.store.stored_records import StoredRecords, load_records, save_records


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def is_representative(summary: RunSummary) -> bool:
    """False when a serious lint finding applies: the numbers do not show what the engine can do."""
    return not (summary.launch and any(f.severity == "serious" for f in summary.launch.lint))


def save_bench(store: Store, result: BenchResult, records: Iterable[RequestRecord], run_dir: Path, run_id: str,
               *, status: str = "complete", error: str | None = None) -> RunSummary:
    """A `servelab bench --out` run in the store: a run with no launch and one trial holding the bench as its one
    step, named by its mode, so `runs`, `show`, `compare`, `report` and `export` read it as they read a cell of
    `servelab run`. Its run directory keeps the BenchResult as summary.json."""
    summary = bench_run_summary(result, run_id, status=status, error=error)
    save_run(store, summary, records, run_dir)
    return summary


def bench_run_summary(result: BenchResult, run_id: str, *, status: str = "complete",
                      error: str | None = None) -> RunSummary:
    """The run a bench is in the store, with this host's provenance (where the client ran)."""
    from servelab.provenance import build_provenance

    trial = Trial(index=0, status=status, steps=[Step(name=result.mode, result=result)])
    summary = RunSummary(run_id=run_id, status=status, error=error, trials=[trial], headline=dict(result.headline),
                         provenance=build_provenance(engine=result.workload.get("engine_detected"),
                                                     model=result.model))
    summary.provenance.workers = list(result.workers)  # --workers/--ray: every worker's host and clock offset
    return summary


def save_run(store: Store, summary: RunSummary, records: Iterable[RequestRecord], run_dir: Path | None = None,
             *, cell_name: str | None = None, experiment_id: str | None = None) -> None:
    prov = summary.provenance
    url = summary.launch.url if summary.launch else (summary.verify.url if summary.verify else None)
    if url is None:
        benches = [b for t in summary.trials for b in t.benches]
        url = benches[0].url if benches else None
    with store.write() as db:
        # The run's row stays (its records, kept apart, are written anew only where they changed); every other
        # row of it is replaced.
        for table in ("launches", "phases", "lint", "checks", "levels", "figures"):
            db.execute(f"DELETE FROM {table} WHERE run_id = ?", (summary.run_id,))
        db.execute(
            "INSERT INTO runs (run_id, run_dir, status, error, started_at, engine, engine_version, model, url, "
            "provenance, summary, saved_at, cell_name, experiment_id, representative) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET "
            "run_dir = excluded.run_dir, status = excluded.status, error = excluded.error, "
            "started_at = excluded.started_at, engine = excluded.engine, engine_version = excluded.engine_version, "
            "model = excluded.model, url = excluded.url, provenance = excluded.provenance, "
            "summary = excluded.summary, saved_at = excluded.saved_at, cell_name = excluded.cell_name, "
            "experiment_id = excluded.experiment_id, representative = excluded.representative",
            (summary.run_id, str(run_dir) if run_dir else None, summary.status, summary.error, prov.started_at,
             prov.engine, prov.engine_version, prov.model, url, prov.model_dump_json(), summary.model_dump_json(),
             _now(), cell_name, experiment_id, int(is_representative(summary))))
        if summary.launch:
            launch = summary.launch
            db.execute("INSERT INTO launches VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (summary.run_id, launch.engine, launch.url, launch.ready_s, launch.verdict.state,
                        launch.verdict.reason, launch.log_path))
            db.executemany("INSERT INTO phases VALUES (?, ?, ?, ?, ?, ?, ?)",
                           [(summary.run_id, i, p.name, p.start_s, p.end_s, p.progress, p.detail)
                            for i, p in enumerate(launch.phases)])
            db.executemany("INSERT INTO lint VALUES (?, ?, ?, ?, ?)",
                           [(summary.run_id, i, f.setting, f.severity, f.why) for i, f in enumerate(launch.lint)])
        if summary.verify:
            db.executemany("INSERT INTO checks VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           [(summary.run_id, i, c.id, c.outcome, c.reason, c.duration_ms,
                             json.dumps(c.request) if c.request is not None else None, c.response_excerpt)
                            for i, c in enumerate(summary.verify.checks)])
        columns = LEVEL_ROW_COLUMNS + tuple(GPU_LEVEL_COLUMNS.values())
        db.executemany(f"INSERT INTO levels ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})",
                       [row + gpu_cells(s) for row, s in zip(level_rows(summary), _levels(summary))])
        db.executemany("INSERT INTO figures VALUES (?, ?, ?, ?, ?, ?, ?)",
                       [(summary.run_id, key, fig.value, fig.unit, fig.definition, fig.counted_by, fig.note)
                        for key, fig in summary.headline.items()])
        save_records(db, store.path, summary.run_id, records)  # streamed: never all in memory at once


LEVEL_ROW_COLUMNS = ("run_id", "bench", "seq", "tag", "mode", "concurrency", "requests", "ok", "failed", "window_s",
                     "summary", "cancelled", "trial")


def _levels(summary: RunSummary) -> list:
    """Every level of the run, in level_rows' order."""
    return [s for trial in summary.trials for step in trial.steps for s in step.result.levels]


def gpu_cells(s) -> tuple:
    """A level's GPU columns (store/migrations.py GPU_LEVEL_COLUMNS, in order): NULLs for a level without `gpu`;
    a level whose GPUs were not measured has gpu_measured 0 and its reason, and no figure (never 0)."""
    gpu = s.gpu
    if gpu is None:
        return (None,) * len(GPU_LEVEL_COLUMNS)
    cells = []
    for field in GPU_LEVEL_COLUMNS:
        value = getattr(gpu, field)
        cells.append(int(value) if isinstance(value, bool) else value)
    return tuple(cells)


def level_rows(summary: RunSummary) -> list[tuple]:
    """The `levels` rows of a run: every level of every step of every trial, `bench` holding the step's name
    ("single", "sweep", "slo-search", …) and `seq` counting per step across trials."""
    seq: dict[str, int] = {}
    rows = []
    for trial in summary.trials:
        for step in trial.steps:
            for s in step.result.levels:
                n = seq.get(step.name, 0)
                rows.append((summary.run_id, step.name, n, s.tag, s.mode, s.concurrency, s.requests, s.ok,
                             s.failed, s.window_s, s.model_dump_json(), s.cancelled, trial.index))
                seq[step.name] = n + 1
    return rows


@dataclass(frozen=True)
class RunRow:
    """One line of `servelab runs`."""

    run_id: str
    started_at: str | None
    status: str
    engine: str | None
    model: str | None
    cell_name: str | None
    experiment_id: str | None
    representative: bool
    decode_tok_s: float | None
    peak_output_tok_s: float | None
    run_dir: str | None


def list_runs(store: Store, limit: int | None = None, experiment_id: str | None = None) -> list[RunRow]:
    """Newest first."""
    sql = ("SELECT r.*, (SELECT value FROM figures f WHERE f.run_id = r.run_id AND f.key = 'single.decode_tok_s') "
           "AS decode, (SELECT value FROM figures f WHERE f.run_id = r.run_id AND f.key = 'peak.output_tok_s') "
           "AS peak FROM runs r")
    params: list[object] = []
    if experiment_id:
        sql += " WHERE r.experiment_id = ?"
        params.append(experiment_id)
    sql += " ORDER BY r.started_at DESC, r.run_id DESC"
    if limit:
        sql += " LIMIT ?"
        params.append(limit)
    return [RunRow(run_id=row["run_id"], started_at=row["started_at"], status=row["status"], engine=row["engine"],
                   model=row["model"], cell_name=row["cell_name"], experiment_id=row["experiment_id"],
                   representative=bool(row["representative"]), decode_tok_s=row["decode"],
                   peak_output_tok_s=row["peak"], run_dir=row["run_dir"])
            for row in store.db.execute(sql, params)]


def resolve_run_id(store: Store, ref: str) -> str | None:
    """The run id `ref` names: exact, or a unique prefix. None when nothing matches; UserError when ambiguous."""
    exact = store.db.execute("SELECT run_id FROM runs WHERE run_id = ?", (ref,)).fetchone()
    if exact:
        return exact[0]
    like = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    rows = [r[0] for r in store.db.execute("SELECT run_id FROM runs WHERE run_id LIKE ? ESCAPE '\\' "
                                           "ORDER BY run_id", (like,))]
    if len(rows) > 1:
        raise UserError(f"'{ref}' matches {len(rows)} runs ({', '.join(rows[:3])}…)", hint="give more of the id")
    return rows[0] if rows else None


def load_run(store: Store, run_id: str) -> tuple[RunSummary, StoredRecords, dict[str, str | None]]:
    """(summary, records, {cell_name, experiment_id, run_dir, records_missing}) of a stored run. The records are
    read one at a time each time they are iterated (`len()` says how many); `records_missing` is a sentence when
    the records file the store points at is gone, else None."""
    row = store.db.execute("SELECT summary, cell_name, experiment_id, run_dir FROM runs WHERE run_id = ?",
                           (run_id,)).fetchone()
    if row is None:
        raise UserError(f"no run '{run_id}' in the store {store.path}", hint="`servelab runs` lists them")
    summary = RunSummary.model_validate_json(row["summary"])
    records = load_records(store.db, store.path, run_id)
    return summary, records, {"cell_name": row["cell_name"], "experiment_id": row["experiment_id"],
                              "run_dir": row["run_dir"], "records_missing": records.missing}
