"""What the GPUs did per level, in the store: columns of `levels` written on save, and back-filled from the level
JSON when a store of schema version 5 is opened (migration 6)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpu_runs import expected_j_per_token, with_gpu, without_gpu
from servelab.store.db import Store
from servelab.store.migrations import LATEST, MIGRATIONS
from servelab.store.runs import level_rows, list_runs, load_run, save_run
from synthetic_runs import synthetic_run

GPU_COLUMNS = ("gpu_measured, gpu_reason, gpu_energy_j, gpu_j_per_output_token, gpu_output_tokens_per_j, "
               "gpu_power_w_mean, gpu_sm_active_pct_mean, gpu_contended")


def _gpu_run(run_id: str):
    """A run whose sweep's levels were measured on 2 GPUs at 300 W each, and whose single-stream level had no
    GPU telemetry."""
    summary, records = synthetic_run(run_id)
    for level in summary.trials[0].sweep.levels:
        with_gpu(level)
    without_gpu(summary.trials[0].single.levels[0])
    return summary, records


def _rows(store: Store, run_id: str) -> dict[str, sqlite3.Row]:
    return {row["tag"]: row for row in store.db.execute(
        f"SELECT tag, {GPU_COLUMNS} FROM levels WHERE run_id = ? ORDER BY bench, seq", (run_id,))}


def test_a_levels_gpu_figures_are_columns_and_the_run_comes_back_whole(tmp_path: Path) -> None:
    summary, records = _gpu_run("gpu/one")
    with Store.open(tmp_path / "s.db") as store:
        save_run(store, summary, records, tmp_path)
        back, _, _ = load_run(store, "gpu/one")
        assert back == summary  # Summary.gpu included, per GPU
        rows = _rows(store, "gpu/one")
    for level in summary.trials[0].sweep.levels:
        row = rows[level.tag]
        assert row["gpu_measured"] == 1 and row["gpu_reason"] is None and row["gpu_contended"] == 0
        assert row["gpu_energy_j"] == pytest.approx(2 * 300.0 * level.window_s)
        assert row["gpu_j_per_output_token"] == pytest.approx(expected_j_per_token(level))
        assert row["gpu_output_tokens_per_j"] == pytest.approx(1 / expected_j_per_token(level))
        assert row["gpu_power_w_mean"] == pytest.approx(600.0)
        assert row["gpu_sm_active_pct_mean"] == pytest.approx(80.0)
    single = rows["single"]  # not measured: the reason, and no figure at all (never 0)
    assert single["gpu_measured"] == 0 and single["gpu_reason"] == "no GPU telemetry source"
    assert [single[c] for c in ("gpu_energy_j", "gpu_j_per_output_token", "gpu_power_w_mean")] == [None] * 3


def test_a_level_from_before_gpu_telemetry_has_no_gpu_columns(tmp_path: Path) -> None:
    summary, records = synthetic_run("old-style")
    with Store.open(tmp_path / "s.db") as store:
        save_run(store, summary, records, tmp_path)
        rows = _rows(store, "old-style")
    assert rows and all(row["gpu_measured"] is None and row["gpu_j_per_output_token"] is None
                        for row in rows.values())


def _v5_store(path: Path, summary, records) -> None:
    """A store at schema version 5 (the shipped migrations 1 to 5) holding one run, its levels' rows as version 5
    wrote them: no GPU columns, the level JSON with `gpu` in it."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for migration in MIGRATIONS[:5]:
        migration(db)
    db.execute("INSERT INTO schema_version VALUES (5)")
    db.execute("INSERT INTO runs (run_id, status, provenance, summary, saved_at) VALUES (?, 'complete', ?, ?, "
               "'2026-01-01')", (summary.run_id, summary.provenance.model_dump_json(), summary.model_dump_json()))
    db.executemany("INSERT INTO levels (run_id, bench, seq, tag, mode, concurrency, requests, ok, failed, window_s, "
                   "summary, cancelled, trial) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", level_rows(summary))
    db.commit()
    db.close()


def test_a_version_5_store_is_migrated_and_its_levels_gpu_columns_back_filled(tmp_path: Path) -> None:
    summary, records = _gpu_run("gpu/v5")
    path = tmp_path / "v5.db"
    _v5_store(path, summary, records)
    with Store.open(path) as store:
        assert store.version() == LATEST >= 6
        rows = _rows(store, "gpu/v5")
        assert [r.run_id for r in list_runs(store)] == ["gpu/v5"]
        back, _, _ = load_run(store, "gpu/v5")
    assert back == summary
    for level in summary.trials[0].sweep.levels:
        assert rows[level.tag]["gpu_measured"] == 1
        assert rows[level.tag]["gpu_j_per_output_token"] == pytest.approx(expected_j_per_token(level))
        assert rows[level.tag]["gpu_power_w_mean"] == pytest.approx(600.0)
    assert rows["single"]["gpu_measured"] == 0 and rows["single"]["gpu_reason"] == "no GPU telemetry source"
    assert rows["single"]["gpu_j_per_output_token"] is None
    # saved again by today's code, the same columns
    with Store.open(path) as store:
        save_run(store, summary, records, tmp_path)
        again = _rows(store, "gpu/v5")
    assert {k: tuple(v) for k, v in again.items()} == {k: tuple(v) for k, v in rows.items()}
