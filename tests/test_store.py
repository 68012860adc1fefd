"""The run store: a run goes in whole and comes back the same; an older store is migrated without losing a row;
two processes writing at once leave a consistent database."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from servelab.errors import UserError
from servelab.store.db import Store
from servelab.store.experiments import CellState, cell_states, latest_experiment, record_cell, start_experiment
from servelab.store.migrations import LATEST
from servelab.store.runs import list_runs, load_run, resolve_run_id, save_run
from synthetic_runs import synthetic_run


def test_a_run_comes_back_as_it_went_in(tmp_path: Path) -> None:
    summary, records = synthetic_run("exp/one", serious=True)
    with Store.open(tmp_path / "s.db") as store:
        save_run(store, summary, records, tmp_path, cell_name="one", experiment_id="exp")
        save_run(store, summary, records, tmp_path, cell_name="one", experiment_id="exp")  # saved again: replaced
        back, back_records, meta = load_run(store, "exp/one")
        assert back == summary
        # Everything a record keeps on disk comes back (events as columns, the answer's text whole: each
        # event's own text only with --keep-events-text), and so does every figure computed from it.
        assert [r.model_dump_json() for r in back_records] == [r.model_dump_json() for r in records]
        assert [(r.text, r.output_tokens, [e.t_ns for e in r.events]) for r in back_records] == \
            [(r.text, r.output_tokens, [e.t_ns for e in r.events]) for r in records]
        assert meta["cell_name"] == "one"
        rows = list_runs(store)
        assert len(rows) == 1 and not rows[0].representative
        assert rows[0].peak_output_tok_s == summary.headline["peak.output_tok_s"].value
        lint = store.db.execute("SELECT setting, severity FROM lint WHERE run_id = 'exp/one'").fetchall()
        assert [tuple(r) for r in lint] == [("parallel=1", "serious")]
        assert resolve_run_id(store, "exp/o") == "exp/one"
        assert resolve_run_id(store, "nothing") is None


def test_a_levels_cancelled_requests_are_a_column(tmp_path: Path) -> None:
    summary, records = synthetic_run("exp/ctrl-c")
    summary.trials[0].sweep.levels[-1].cancelled = 3
    with Store.open(tmp_path / "s.db") as store:
        save_run(store, summary, records, tmp_path)
        rows = store.db.execute("SELECT tag, cancelled FROM levels WHERE bench = 'sweep' ORDER BY seq").fetchall()
    assert [r[1] for r in rows] == [0] * (len(rows) - 1) + [3]


def _v1_store(path: Path) -> None:
    """A store as servelab wrote it at schema version 1, made by hand (not with today's code)."""
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE schema_version (version INTEGER NOT NULL);
        INSERT INTO schema_version VALUES (1);
        CREATE TABLE runs (run_id TEXT PRIMARY KEY, run_dir TEXT, status TEXT NOT NULL, error TEXT,
            started_at TEXT, engine TEXT, engine_version TEXT, model TEXT, url TEXT, provenance TEXT NOT NULL,
            summary TEXT NOT NULL, saved_at TEXT NOT NULL);
        CREATE TABLE launches (run_id TEXT PRIMARY KEY, engine TEXT, url TEXT, ready_s REAL, verdict_state TEXT,
            verdict_reason TEXT, log_path TEXT);
        CREATE TABLE phases (run_id TEXT, seq INTEGER, name TEXT, start_s REAL, end_s REAL, progress REAL,
            detail TEXT, PRIMARY KEY (run_id, seq));
        CREATE TABLE lint (run_id TEXT, seq INTEGER, setting TEXT, severity TEXT, why TEXT,
            PRIMARY KEY (run_id, seq));
        CREATE TABLE checks (run_id TEXT, seq INTEGER, check_id TEXT, outcome TEXT, reason TEXT, duration_ms REAL,
            request TEXT, response_excerpt TEXT, PRIMARY KEY (run_id, seq));
        CREATE TABLE levels (run_id TEXT, bench TEXT, seq INTEGER, tag TEXT, mode TEXT, concurrency INTEGER,
            requests INTEGER, ok INTEGER, failed INTEGER, window_s REAL, summary TEXT NOT NULL,
            PRIMARY KEY (run_id, bench, seq));
        CREATE TABLE figures (run_id TEXT, key TEXT, value REAL, unit TEXT, definition TEXT, counted_by TEXT,
            note TEXT, PRIMARY KEY (run_id, key));
        CREATE TABLE records (run_id TEXT, seq INTEGER, tag TEXT, warmup INTEGER, ok INTEGER, output_tokens INTEGER,
            record TEXT NOT NULL, PRIMARY KEY (run_id, seq));
    """)
    old, records = synthetic_run("old-run", serious=True)
    db.execute("INSERT INTO runs VALUES ('old-run', '/x', 'complete', NULL, '2026-01-01', 'llamacpp', NULL, "
               "'smollm2', NULL, ?, ?, '2026-01-01')", (old.provenance.model_dump_json(), old.model_dump_json()))
    db.execute("INSERT INTO lint VALUES ('old-run', 0, 'parallel=1', 'serious', 'one slot')")
    db.executemany("INSERT INTO records VALUES ('old-run', ?, ?, 0, 1, ?, ?)",
                   [(i, r.tag, r.output_tokens, r.model_dump_json()) for i, r in enumerate(records)])
    db.execute("INSERT INTO figures VALUES ('old-run', 'peak.output_tok_s', 42.0, 'tok/s', 'x', NULL, NULL)")
    db.commit()
    db.close()


def test_a_store_written_by_an_older_version_is_migrated_and_keeps_its_runs(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _v1_store(path)
    with Store.open(path) as store:
        assert store.version() == LATEST > 1
        back, records, _ = load_run(store, "old-run")
        assert back.run_id == "old-run" and len(records) > 0
        row = list_runs(store)[0]
        assert row.run_id == "old-run" and row.peak_output_tok_s == 42.0
        assert not row.representative  # back-filled from the serious lint row by the migration
        cancelled = store.db.execute("SELECT DISTINCT cancelled FROM levels").fetchall()
        assert [tuple(c) for c in cancelled] in ([], [(0,)])  # the column exists; old levels cancelled nothing
        # and the new tables work on the migrated store
        start_experiment(store, "e1", "exp", "file.yaml", str(tmp_path))
        record_cell(store, "e1", CellState("k", "cell", 0, "old-run", "complete", None))
        assert cell_states(store, "e1")["k"].run_id == "old-run"
    # opening again is a no-op
    with Store.open(path) as store:
        assert store.version() == LATEST and len(list_runs(store)) == 1


def test_a_store_from_a_newer_servelab_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    db = sqlite3.connect(path)
    db.executescript(f"CREATE TABLE schema_version (version INTEGER); INSERT INTO schema_version VALUES "
                     f"({LATEST + 1});")
    db.close()
    with pytest.raises(UserError, match="newer servelab"):
        Store.open(path)


WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[3])
    from pathlib import Path
    from servelab.store.db import Store
    from servelab.store.runs import save_run
    from synthetic_runs import synthetic_run
    summary, records = synthetic_run("template", single_requests=4, max_concurrency=2, level_s=0.5)
    with Store.open(Path(sys.argv[1])) as store:
        for i in range(int(sys.argv[4])):
            run = summary.model_copy(update={"run_id": f"{sys.argv[2]}-{i}"})
            save_run(store, run, records)
""")


def test_two_processes_writing_at_once_leave_every_run_intact(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    Store.open(path).close()  # created and migrated before the race, as `servelab run` would leave it
    n = 15
    tests_dir = str(Path(__file__).parent)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), name, tests_dir, str(n)],
                              stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    with Store.open(path) as store:
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        ids = {r.run_id for r in list_runs(store)}
        assert ids == {f"{w}-{i}" for w in "ab" for i in range(n)}
        counts = {row[0] for row in store.db.execute("SELECT COUNT(*) FROM records GROUP BY run_id")}
        assert len(counts) == 1  # every run has all of its records, none lost or doubled
    # both may also race on creating and migrating a fresh store
    fresh = tmp_path / "fresh.db"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(fresh), name, tests_dir, "2"],
                              stderr=subprocess.PIPE, text=True) for name in ("c", "d")]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    with Store.open(fresh) as store:
        assert store.version() == LATEST and len(list_runs(store)) == 4


def test_experiments_remember_their_cells(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.db") as store:
        assert latest_experiment(store, "exp") is None
        start_experiment(store, "20260101-exp", "exp", "exp.yaml", str(tmp_path / "20260101-exp"))
        record_cell(store, "20260101-exp", CellState("k1", "a", 0, "20260101-exp/a", "complete", None))
        record_cell(store, "20260101-exp", CellState("k2", "b", 1, "20260101-exp/b", "failed", "no model"))
        assert latest_experiment(store, "exp") == ("20260101-exp", str(tmp_path / "20260101-exp"), "running")
        states = cell_states(store, "20260101-exp")
        assert states["k1"].status == "complete" and states["k2"].reason == "no model"
