"""A run's per-request records in the store: pointed at in its run directory's records file, or held compressed.

A run directory under the store's own directory and on the same filesystem (the default layout: runs/servelab.db
beside runs/<experiment>/<cell>/, and `bench --out DIR`) already holds every record in its records file, so the
store keeps that file's path, relative to the store (the two move together), and how many of its records the run
had when it was saved. Otherwise (a store on another disk or elsewhere, records that come from no run directory)
the store holds the records itself: zlib-compressed JSON lines, CHUNK_RECORDS records to a row of `records`.
Records the disk refused to write into the run directory (docs/output.md#disk-full) are held compressed either way.

A run directory's records are only ever appended, so saving its run again (after each trial of a cell) writes only
the records that came since the last save. Reading gives the records one at a time, however many there are.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from servelab.records import RequestRecord
from servelab.store.rundir import RunDirRecords, iter_record_lines, unwritten_lines

CHUNK_RECORDS = 256  # a few hundred kB of JSON: well compressed, and decoded one chunk at a time
CHUNK_BYTES = 1 << 20
LEVEL = 6  # zlib's default; a store write is once per trial, not once per request


def encode_chunks(lines: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """(records, compressed JSON lines) per chunk of at most CHUNK_RECORDS records or about CHUNK_BYTES."""
    batch: list[bytes] = []
    size = 0
    for line in lines:
        batch.append(line)
        size += len(line) + 1
        if len(batch) >= CHUNK_RECORDS or size >= CHUNK_BYTES:
            yield len(batch), zlib.compress(b"\n".join(batch), LEVEL)
            batch, size = [], 0
    if batch:
        yield len(batch), zlib.compress(b"\n".join(batch), LEVEL)


def decode_chunk(data: bytes) -> Iterator[bytes]:
    """The JSON lines of one chunk (a record's JSON never holds a raw newline)."""
    return (line for line in zlib.decompress(data).split(b"\n") if line)


def insert_chunks(db: sqlite3.Connection, run_id: str, lines: Iterable[bytes], first: int) -> int:
    """Write `lines` as chunks whose first record is number `first` of the run; returns how many were written."""
    written = 0
    for count, data in encode_chunks(lines):
        db.execute("INSERT INTO records (run_id, first, count, data) VALUES (?, ?, ?, ?)",
                   (run_id, first + written, count, data))
        written += count
    return written


def _beside(store_path: Path, file: Path) -> Path | None:
    """`file` relative to the store's directory when it lies under it on the same filesystem, else None."""
    base = Path(store_path).resolve().parent
    try:
        relative = file.resolve().relative_to(base)
        same_disk = os.stat(base).st_dev == os.stat(file).st_dev
    except (ValueError, OSError):
        return None
    return relative if same_disk else None


def _located(store_path: Path, name: str | None) -> Path | None:
    """Where a stored records_file name points: relative names are relative to the store's directory."""
    if not name:
        return None
    path = Path(name)
    return path if path.is_absolute() else Path(store_path).resolve().parent / path


def save_records(db: sqlite3.Connection, store_path: Path, run_id: str,
                 records: Iterable[RequestRecord]) -> None:
    """The records of `run_id` (whose runs row exists) into the store, inside the caller's transaction. A run
    directory's records (RunDir.iter_records()) are pointed at when the store lies above them, and only those
    not stored by an earlier save of the same run are written; any other iterable replaces what was stored."""
    if not isinstance(records, RunDirRecords) or records.file is None:
        db.execute("DELETE FROM records WHERE run_id = ?", (run_id,))
        db.execute("UPDATE runs SET records_file = NULL, records_in_file = 0 WHERE run_id = ?", (run_id,))
        unwritten = records.unwritten if isinstance(records, RunDirRecords) else records
        keep_text = isinstance(records, RunDirRecords) and records.keep_events_text
        insert_chunks(db, run_id, unwritten_lines(unwritten, keep_text), 0)
        return
    source = records.file.resolve()
    relative = _beside(store_path, source)
    in_file = records.in_file if relative is not None else 0  # read from the file; the chunks hold the rest
    before = db.execute("SELECT records_file, records_in_file FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    start, end, count = db.execute("SELECT MIN(first), MAX(first + count), COALESCE(SUM(count), 0) FROM records "
                                   "WHERE run_id = ?", (run_id,)).fetchone()
    stored_file = _located(store_path, before[0]) if before else None
    # What an earlier save of this run from the same file stored still stands when it is one unbroken run of
    # records right after those read from the file, and no more than there are now.
    same = (stored_file is not None and stored_file.resolve() == source and before[1] == in_file
            and (count == 0 or (start == in_file and end - start == count)) and in_file + count <= len(records))
    if not same:
        db.execute("DELETE FROM records WHERE run_id = ?", (run_id,))
        count = 0
    skip = in_file + count
    insert_chunks(db, run_id, records.lines(skip), skip)
    db.execute("UPDATE runs SET records_file = ?, records_in_file = ? WHERE run_id = ?",
               (str(relative) if relative is not None else str(source), in_file, run_id))


class StoredRecords(Iterable[RequestRecord]):
    """A stored run's records, read one at a time each time they are iterated: the first `in_file` of the
    records file `file`, then those the store holds (compressed chunks, read when the run was loaded, so the
    store may be closed by then). `missing` says when the file the store points at is gone."""

    def __init__(self, file: Path | None, in_file: int, chunks: list[tuple[int, bytes]]):
        self.file, self.in_file, self.chunks = file, in_file, chunks
        self.missing: str | None = None
        if in_file and (file is None or not file.is_file()):
            self.missing = (f"{in_file} record(s) of this run were in {file}, which is gone: its figures stand, "
                            f"intervals that need its records do not")

    def __len__(self) -> int:
        return self.in_file + sum(count for count, _ in self.chunks)

    def __iter__(self) -> Iterator[RequestRecord]:
        # `in_file` counts the file's lines as the save read them (RunDirRecords.lines): take that many lines,
        # then parse. Counting parsed records instead would run past a line that does not parse and yield again
        # the first record the chunks hold.
        if self.in_file and self.missing is None:
            yield from _parsed(itertools.islice(iter_record_lines(self.file), self.in_file))
        for _, data in self.chunks:
            yield from _parsed(decode_chunk(data))


def _parsed(lines: Iterable[bytes]) -> Iterator[RequestRecord]:
    for line in lines:
        try:
            yield RequestRecord.model_validate_json(line)
        except ValueError:
            continue


def load_records(db: sqlite3.Connection, store_path: Path, run_id: str) -> StoredRecords:
    row = db.execute("SELECT records_file, records_in_file FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    chunks = [(r[0], r[1]) for r in db.execute("SELECT count, data FROM records WHERE run_id = ? ORDER BY first",
                                                (run_id,))]
    in_file = int(row[1] or 0) if row else 0
    return StoredRecords(_located(store_path, row[0]) if row and in_file else None, in_file, chunks)
