"""Experiments in the store: which cells have run, so an interrupted experiment resumes where it stopped.

A cell is identified by a hash of its definition (experiment/model.py `cell_key`): editing a cell makes it a new
cell that runs again, while cells left untouched and already complete are skipped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from servelab.store.db import Store


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True)
class CellState:
    cell_key: str
    cell_name: str
    seq: int
    run_id: str | None
    status: str  # complete, failed, interrupted
    reason: str | None


def start_experiment(store: Store, experiment_id: str, name: str, source: str, out_dir: str) -> None:
    with store.write() as db:
        db.execute("INSERT INTO experiments VALUES (?, ?, ?, ?, 'running', ?, ?) ON CONFLICT(experiment_id) "
                   "DO UPDATE SET status = 'running', updated_at = excluded.updated_at",
                   (experiment_id, name, source, out_dir, _now(), _now()))


def latest_experiment(store: Store, name: str) -> tuple[str, str, str] | None:
    """(experiment_id, out_dir, status) of the latest experiment called `name`, if any."""
    row = store.db.execute("SELECT experiment_id, out_dir, status FROM experiments WHERE name = ? "
                           "ORDER BY started_at DESC, experiment_id DESC LIMIT 1", (name,)).fetchone()
    return (row["experiment_id"], row["out_dir"], row["status"]) if row else None


def record_cell(store: Store, experiment_id: str, state: CellState) -> None:
    with store.write() as db:
        db.execute("INSERT OR REPLACE INTO experiment_cells VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (experiment_id, state.cell_key, state.cell_name, state.seq, state.run_id, state.status,
                    state.reason, _now()))


def cell_states(store: Store, experiment_id: str) -> dict[str, CellState]:
    """By cell key."""
    rows = store.db.execute("SELECT * FROM experiment_cells WHERE experiment_id = ? ORDER BY seq",
                            (experiment_id,))
    return {r["cell_key"]: CellState(cell_key=r["cell_key"], cell_name=r["cell_name"], seq=r["seq"],
                                     run_id=r["run_id"], status=r["status"], reason=r["reason"]) for r in rows}


def finish_experiment(store: Store, experiment_id: str, status: str) -> None:
    with store.write() as db:
        db.execute("UPDATE experiments SET status = ?, updated_at = ? WHERE experiment_id = ?",
                   (status, _now(), experiment_id))
