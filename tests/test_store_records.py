"""A run's records in the store: pointed at in a run directory beside the store, held compressed otherwise, written
only once however often the run is saved, and read back one at a time."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from servelab.records import RequestRecord
from servelab.store.db import Store
from servelab.store.migrations import LATEST, MIGRATIONS
from servelab.store.rundir import RunDir, records_file
from servelab.store.runs import load_run, save_run
from synthetic_runs import synthetic_run


def _same(back, records: list[RequestRecord]) -> bool:
    return [r.model_dump_json() for r in back] == [r.model_dump_json() for r in records]


def _record_inserts(store: Store) -> list[str]:
    seen: list[str] = []
    store.db.set_trace_callback(lambda sql: seen.append(sql) if sql.startswith("INSERT INTO records") else None)
    return seen


def test_a_run_directory_beside_the_store_is_pointed_at_not_copied(tmp_path: Path) -> None:
    summary, records = synthetic_run("exp/beside")
    run = RunDir(tmp_path / "exp" / "beside")
    for r in records:
        run.append_record(r)
    with Store.open(tmp_path / "servelab.db") as store:
        inserts = _record_inserts(store)
        save_run(store, summary, run.iter_records(), run.path)
        assert inserts == []  # not one record copied
        row = store.db.execute("SELECT records_file, records_in_file FROM runs").fetchone()
        assert tuple(row) == ("exp/beside/records.jsonl.gz", len(records))  # relative: the two move together
        back, stored, meta = load_run(store, "exp/beside")
        assert len(stored) == len(records) and _same(stored, records) and _same(stored, records)  # again
        assert meta["records_missing"] is None
    run.close()
    # the records file gone: the summary stands, and the store says what is missing
    records_file(run.path).unlink()
    with Store.open(tmp_path / "servelab.db", readonly=True) as store:
        back, stored, meta = load_run(store, "exp/beside")
        assert back == summary and list(stored) == []
        assert "is gone" in meta["records_missing"]


def test_a_store_elsewhere_holds_the_records_compressed_and_saving_again_adds_only_new_ones(tmp_path: Path) -> None:
    summary, records = synthetic_run("exp/elsewhere")
    half = len(records) // 2
    run = RunDir(tmp_path / "runs" / "elsewhere")
    with Store.open(tmp_path / "stores" / "s.db") as store:
        for r in records[:half]:
            run.append_record(r)
        save_run(store, summary, run.iter_records(), run.path)
        first_chunks = store.db.execute("SELECT first, count, data FROM records ORDER BY first").fetchall()
        assert sum(c[1] for c in first_chunks) == half
        for r in records[half:]:
            run.append_record(r)
        inserts = _record_inserts(store)
        save_run(store, summary, run.iter_records(), run.path)  # after the next trial
        save_run(store, summary, run.iter_records(), run.path)  # and when the run ends: nothing new
        chunks = store.db.execute("SELECT first, count, data FROM records ORDER BY first").fetchall()
        assert [tuple(c) for c in chunks[:len(first_chunks)]] == [tuple(c) for c in first_chunks]  # kept as they were
        assert len(inserts) == len(chunks) - len(first_chunks)  # only the second half was written
        stored_bytes = sum(len(c[2]) for c in chunks)
        assert stored_bytes < sum(len(r.model_dump_json()) for r in records) / 3  # compressed
        assert _same(load_run(store, "exp/elsewhere")[1], records)
    run.close()
    records_file(run.path).unlink()  # the store stands alone
    with Store.open(tmp_path / "stores" / "s.db", readonly=True) as store:
        assert _same(load_run(store, "exp/elsewhere")[1], records)


def test_records_the_disk_refused_are_held_after_those_in_the_file(tmp_path: Path) -> None:
    summary, records = synthetic_run("exp/full")
    run = RunDir(tmp_path / "full")
    for r in records[:3]:
        run.append_record(r)
    run.unwritten.extend(records[3:])  # as after a write that failed with ENOSPC
    with Store.open(tmp_path / "servelab.db") as store:
        save_run(store, summary, run.iter_records(), run.path)
        assert store.db.execute("SELECT records_in_file FROM runs").fetchone()[0] == 3
        assert store.db.execute("SELECT SUM(count) FROM records").fetchone()[0] == len(records) - 3
        inserts = _record_inserts(store)
        save_run(store, summary, run.iter_records(), run.path)
        assert inserts == []
        assert _same(load_run(store, "exp/full")[1], records)


def test_a_version_4_store_keeps_its_records_compressed(tmp_path: Path) -> None:
    summary, records = synthetic_run("old")
    path = tmp_path / "v4.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for migration in MIGRATIONS[:4]:
        migration(db)
    db.execute("INSERT INTO schema_version VALUES (4)")
    db.execute("INSERT INTO runs (run_id, status, provenance, summary, saved_at) VALUES ('old', 'complete', ?, ?, "
               "'2026-01-01')", (summary.provenance.model_dump_json(), summary.model_dump_json()))
    db.executemany("INSERT INTO records (run_id, seq, tag, warmup, ok, output_tokens, record, trial) "
                   "VALUES ('old', ?, ?, 0, 1, ?, ?, ?)",
                   [(i, r.tag, r.output_tokens, r.model_dump_json(), r.trial) for i, r in enumerate(records)])
    db.close()
    with Store.open(path, readonly=True) as store:  # migrated in memory, the file untouched
        assert _same(load_run(store, "old")[1], records)
    with Store.open(path) as store:
        assert store.version() == LATEST
        assert _same(load_run(store, "old")[1], records)
        assert "records_v4" not in {r[0] for r in store.db.execute("SELECT name FROM sqlite_master")}


def test_a_line_of_the_records_file_that_does_not_parse_never_repeats_a_record(tmp_path: Path) -> None:
    """The store counts the file's lines (what a save read); a line that does not parse counts there too, so
    reading back takes exactly those lines and then the chunks, each record once."""
    import gzip

    from servelab.store.stored_records import StoredRecords, encode_chunks

    _, records = synthetic_run("exp/torn")
    r0, r1, r2 = records[:3]
    file = tmp_path / "records.jsonl.gz"
    with gzip.open(file, "wb") as fh:
        for line in (r0.model_dump_json(), '{"not a record', r1.model_dump_json(), r2.model_dump_json()):
            fh.write(line.encode() + b"\n")
    # Saved when the file held three lines (r0, the bad one, r1); r2 went to the chunks.
    chunks = list(encode_chunks([r2.model_dump_json().encode()]))
    back = StoredRecords(file, 3, chunks)
    assert [r.model_dump_json() for r in back] == [r.model_dump_json() for r in (r0, r1, r2)]
