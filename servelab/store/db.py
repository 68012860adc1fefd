"""The run store: one SQLite file that indexes every run (the run directories stay the human-readable copy).

Safe for several servelab processes at once: WAL mode lets readers proceed while one process writes, every write
is one `BEGIN IMMEDIATE` transaction (the write lock is taken up front, so two writers queue instead of failing
half-way), and a busy timeout makes a writer wait for the lock instead of erroring.

The schema is versioned (store/migrations.py): opening a store written by an older servelab migrates it in
place; a store written by a newer servelab is refused, never modified.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from servelab.errors import UserError
from servelab.store.migrations import LATEST, MIGRATIONS

DEFAULT_NAME = "servelab.db"
BUSY_TIMEOUT_MS = 30_000  # a run's whole write takes well under a second; 30 s covers a queue of writers


def default_store_path(out_root: Path) -> Path:
    """`SERVELAB_STORE` when set, else servelab.db next to the run directories."""
    env = os.environ.get("SERVELAB_STORE")
    return Path(env) if env else Path(out_root) / DEFAULT_NAME


class Store:
    def __init__(self, path: Path, connection: sqlite3.Connection):
        self.path = path
        self.db = connection

    @classmethod
    def open(cls, path: Path) -> Store:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # isolation_level=None: transactions are ours (BEGIN IMMEDIATE), never the sqlite3 module's implicit ones
            db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            db.row_factory = sqlite3.Row
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute("PRAGMA foreign_keys = ON")
        except sqlite3.DatabaseError as exc:
            raise UserError(f"cannot open the run store {path}: {exc}",
                            hint="is it a servelab store? point --store elsewhere") from None
        store = cls(path, db)
        store.migrate()
        return store

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taking the write lock at its start (waiting up to the busy timeout)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # ---- schema ----
    def version(self) -> int:
        has_table = self.db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
        if not has_table:
            return 0
        row = self.db.execute("SELECT version FROM schema_version").fetchone()
        return int(row[0]) if row else 0

    def migrate(self) -> None:
        """Apply the migrations this store has not seen, each in its own transaction."""
        if self.version() > LATEST:
            raise UserError(f"the run store {self.path} was written by a newer servelab (schema "
                            f"{self.version()}; this one knows up to {LATEST})", hint="upgrade servelab")
        while True:
            with self.write() as db:
                # Read the version inside the lock: another process may have migrated meanwhile.
                current = self.version()
                if current >= LATEST:
                    return
                if current == 0:
                    db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
                MIGRATIONS[current](db)
                db.execute("DELETE FROM schema_version")
                db.execute("INSERT INTO schema_version (version) VALUES (?)", (current + 1,))
