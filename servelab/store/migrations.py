"""The run store's schema, as an ordered list of migrations. Never edit a migration that has shipped: add one.

A database records the number of the last migration applied in `schema_version` (one row). Opening a store
applies every later migration in order, each in its own transaction, so a store written by an older servelab is
brought up to date without losing a row, and a crash mid-migration leaves the previous version intact.

Version 1: runs with their launch (phases, lint), verify checks, bench levels, headline figures and per-request
           records. Each run also keeps its whole RunSummary as JSON, so reading a run back gives exactly the
           document its run directory holds.
Version 2: experiments and their cells (which run measured which cell, keyed by a hash of the cell's definition,
           so an interrupted experiment resumes), and a `representative` flag on runs (0 when a serious lint
           finding applies), back-filled from the lint rows of existing runs.
Version 3: a `cancelled` count on levels.
Version 4: a `trial` column on levels and records (a cell measured as several trials); 0 for older rows.
Version 5: records are no longer kept again as uncompressed JSON, one row each: a run points at its run
           directory's records file (`runs.records_file`, `runs.records_in_file`) or the store holds them as
           zlib-compressed chunks (`records`: run_id, first, count, data; store/stored_records.py). Older rows are
           compressed into chunks.
Version 6: what the GPUs did per level (Summary.gpu; docs/metrics.md#gpu) as columns of `levels`, so a query can
           rank levels by energy per token without parsing JSON: gpu_measured (NULL: the level has no `gpu`, as
           every level stored before; 0: not measured, gpu_reason says why), gpu_energy_j,
           gpu_j_per_output_token, gpu_output_tokens_per_j, gpu_power_w_mean, gpu_sm_active_pct_mean,
           gpu_contended. Back-filled from each level's Summary JSON.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable


def _v1_runs(db: sqlite3.Connection) -> None:
    _execute(db, """
        CREATE TABLE runs (
            run_id        TEXT PRIMARY KEY,
            run_dir       TEXT,
            status        TEXT NOT NULL,
            error         TEXT,
            started_at    TEXT,
            engine        TEXT,
            engine_version TEXT,
            model         TEXT,
            url           TEXT,
            provenance    TEXT NOT NULL,      -- Provenance JSON
            summary       TEXT NOT NULL,      -- the whole RunSummary JSON (what summary.json holds)
            saved_at      TEXT NOT NULL
        );
        CREATE TABLE launches (
            run_id   TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
            engine   TEXT, url TEXT, ready_s REAL, verdict_state TEXT, verdict_reason TEXT, log_path TEXT
        );
        CREATE TABLE phases (
            run_id TEXT REFERENCES runs(run_id) ON DELETE CASCADE,
            seq INTEGER, name TEXT, start_s REAL, end_s REAL, progress REAL, detail TEXT,
            PRIMARY KEY (run_id, seq)
        );
        CREATE TABLE lint (
            run_id TEXT REFERENCES runs(run_id) ON DELETE CASCADE,
            seq INTEGER, setting TEXT, severity TEXT, why TEXT,
            PRIMARY KEY (run_id, seq)
        );
        CREATE TABLE checks (
            run_id TEXT REFERENCES runs(run_id) ON DELETE CASCADE,
            seq INTEGER, check_id TEXT, outcome TEXT, reason TEXT, duration_ms REAL,
            request TEXT, response_excerpt TEXT,
            PRIMARY KEY (run_id, seq)
        );
        CREATE TABLE levels (
            run_id TEXT REFERENCES runs(run_id) ON DELETE CASCADE,
            bench TEXT, seq INTEGER, tag TEXT, mode TEXT, concurrency INTEGER, requests INTEGER, ok INTEGER,
            failed INTEGER, window_s REAL,
            summary TEXT NOT NULL,             -- the level's Summary JSON
            PRIMARY KEY (run_id, bench, seq)
        );
        CREATE TABLE figures (
            run_id TEXT REFERENCES runs(run_id) ON DELETE CASCADE,
            key TEXT, value REAL, unit TEXT, definition TEXT, counted_by TEXT, note TEXT,
            PRIMARY KEY (run_id, key)
        );
        CREATE TABLE records (
            run_id TEXT REFERENCES runs(run_id) ON DELETE CASCADE,
            seq INTEGER, tag TEXT, warmup INTEGER, ok INTEGER, output_tokens INTEGER,
            record TEXT NOT NULL,              -- the RequestRecord JSON, events included
            PRIMARY KEY (run_id, seq)
        );
        CREATE INDEX records_by_tag ON records(run_id, tag);
    """)


def _v2_experiments(db: sqlite3.Connection) -> None:
    _execute(db, """
        CREATE TABLE experiments (
            experiment_id TEXT PRIMARY KEY,    -- the experiment directory's name
            name          TEXT NOT NULL,
            source        TEXT,                -- the experiment file, or 'embedded default'
            out_dir       TEXT,
            status        TEXT NOT NULL,       -- running, complete, interrupted
            started_at    TEXT NOT NULL,
            updated_at    TEXT NOT NULL
        );
        CREATE TABLE experiment_cells (
            experiment_id TEXT REFERENCES experiments(experiment_id) ON DELETE CASCADE,
            cell_key      TEXT NOT NULL,       -- hash of the cell's definition and its bench settings
            cell_name     TEXT NOT NULL,
            seq           INTEGER NOT NULL,    -- the cell's position in the file
            run_id        TEXT,
            status        TEXT NOT NULL,       -- complete, failed, interrupted
            reason        TEXT,
            updated_at    TEXT NOT NULL,
            PRIMARY KEY (experiment_id, cell_key)
        );
        ALTER TABLE runs ADD COLUMN cell_name TEXT;
        ALTER TABLE runs ADD COLUMN experiment_id TEXT;
        ALTER TABLE runs ADD COLUMN representative INTEGER NOT NULL DEFAULT 1;
        UPDATE runs SET representative = 0
            WHERE run_id IN (SELECT run_id FROM lint WHERE severity = 'serious');
    """)


def _v3_cancelled(db: sqlite3.Connection) -> None:
    # Requests cancelled in flight (Ctrl-C) are counted apart from failures; older levels had none recorded.
    _execute(db, """
        ALTER TABLE levels ADD COLUMN cancelled INTEGER NOT NULL DEFAULT 0;
        UPDATE levels SET cancelled = COALESCE(json_extract(summary, '$.cancelled'), 0)
    """)


def _v4_trials(db: sqlite3.Connection) -> None:
    # A cell is measured as trials (docs/metrics.md#trials): each level and record says which one it ran in.
    # Runs stored before hold one trial, 0. Level seq stays unique per (run, bench) across trials.
    _execute(db, """
        ALTER TABLE levels ADD COLUMN trial INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE records ADD COLUMN trial INTEGER NOT NULL DEFAULT 0
    """)


def _v5_records_compressed(db: sqlite3.Connection) -> None:
    # The per-record rows made a store 4x its run directories' records files: they become compressed chunks.
    from servelab.store.stored_records import insert_chunks

    _execute(db, """
        ALTER TABLE runs ADD COLUMN records_file TEXT;        -- where records_in_file of its records are read
        ALTER TABLE runs ADD COLUMN records_in_file INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE records RENAME TO records_v4;
        CREATE TABLE records (
            run_id TEXT REFERENCES runs(run_id) ON DELETE CASCADE,
            first  INTEGER NOT NULL,           -- the chunk's first record: its position among the run's records
            count  INTEGER NOT NULL,           -- records in the chunk
            data   BLOB NOT NULL,              -- zlib: the RequestRecords' JSON, one line each
            PRIMARY KEY (run_id, first)
        )
    """)
    run_ids = [row[0] for row in db.execute("SELECT DISTINCT run_id FROM records_v4")]
    for run_id in run_ids:
        rows = db.execute("SELECT record FROM records_v4 WHERE run_id = ? ORDER BY seq", (run_id,))
        insert_chunks(db, run_id, (row[0].encode("utf-8") for row in rows), 0)
    db.execute("DROP TABLE records_v4")


# Summary.gpu's fields that become `levels` columns, and the column each becomes (store/runs.py writes them).
GPU_LEVEL_COLUMNS = {"measured": "gpu_measured", "reason": "gpu_reason", "energy_j": "gpu_energy_j",
                     "j_per_output_token": "gpu_j_per_output_token",
                     "output_tokens_per_j": "gpu_output_tokens_per_j", "power_w_mean": "gpu_power_w_mean",
                     "sm_active_pct_mean": "gpu_sm_active_pct_mean", "contended": "gpu_contended"}


def _v6_gpu_columns(db: sqlite3.Connection) -> None:
    # The GPU figures of a level, as columns; older levels have no `gpu` in their JSON and keep NULLs.
    db.execute("ALTER TABLE levels ADD COLUMN gpu_measured INTEGER")
    db.execute("ALTER TABLE levels ADD COLUMN gpu_reason TEXT")
    for column in ("gpu_energy_j", "gpu_j_per_output_token", "gpu_output_tokens_per_j", "gpu_power_w_mean",
                   "gpu_sm_active_pct_mean"):
        db.execute(f"ALTER TABLE levels ADD COLUMN {column} REAL")
    db.execute("ALTER TABLE levels ADD COLUMN gpu_contended INTEGER")
    # json_extract gives JSON true/false as 1/0 and a missing or null field as NULL, as the columns want them.
    assignments = ", ".join(f"{column} = json_extract(summary, '$.gpu.{field}')"
                            for field, column in GPU_LEVEL_COLUMNS.items())
    db.execute(f"UPDATE levels SET {assignments} WHERE json_type(summary, '$.gpu') = 'object'")


def _execute(db: sqlite3.Connection, script: str) -> None:
    """Statement by statement: `executescript` would commit the migration's transaction before it runs."""
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


# In order: MIGRATIONS[i] takes a store from version i to version i + 1.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1_runs, _v2_experiments, _v3_cancelled, _v4_trials,
                                                           _v5_records_compressed, _v6_gpu_columns]
LATEST = len(MIGRATIONS)
