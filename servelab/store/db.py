"""The run store: one SQLite file that indexes every run (the run directories stay the human-readable copy).

Safe for several servelab processes at once: WAL mode lets readers proceed while one process writes, every write
is one `BEGIN IMMEDIATE` transaction (the write lock is taken up front, so two writers queue instead of failing
half-way), and a busy timeout makes a writer wait for the lock instead of erroring.

The schema is versioned (store/migrations.py): opening a store written by an older servelab migrates it in
place; a store written by a newer servelab is refused, never modified.

Reading commands (runs, show, compare, report, export) open the store read-only (`readonly=True`: SQLite's
`mode=ro`, else `immutable=1` where even the WAL's side files cannot be made), so an archived store, a CI
artifact or a store on a read-only mount can be read; one written by an older servelab is then migrated in a copy
in memory, never in place. Writing commands check the store before measuring anything (`check()`: SQLite's
quick_check and the tables the schema needs), so a damaged store stops a run before it spends any time, not
when the first result is saved.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from servelab.errors import UserError, os_error_words
from servelab.store.migrations import LATEST, MIGRATIONS

DEFAULT_NAME = "servelab.db"
RECORDS_COMPRESSED = 5  # the schema version from which records are no longer kept uncompressed
BUSY_TIMEOUT_MS = 30_000  # a run's whole write takes well under a second; 30 s covers a queue of writers


def _use_wal(db: sqlite3.Connection) -> None:
    """Switch the store to WAL. Two processes creating the same store at once can both ask; SQLite answers the
    loser "database is locked" at once, without waiting on its busy timeout, so wait here as the timeout would."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def default_store_path(out_root: Path) -> Path:
    """`SERVELAB_STORE` when set, else servelab.db next to the run directories."""
    env = os.environ.get("SERVELAB_STORE")
    return Path(env) if env else Path(out_root) / DEFAULT_NAME


SQLITE_FULL = 13  # "database or disk is full"


def disk_full(exc: BaseException) -> bool:
    """SQLite (or the OS) says the disk is full: a full disk, not a damaged store."""
    if isinstance(exc, OSError):
        return exc.errno == errno.ENOSPC
    return getattr(exc, "sqlite_errorcode", None) == SQLITE_FULL or "disk is full" in str(exc)


def store_hint(exc: BaseException, damaged: str) -> str:
    """What to do about a store that failed: free space when the disk is full, else `damaged`."""
    if disk_full(exc):
        return ("the disk is full: free some space (the run directories keep every result written before it "
                "filled) or point --store at another disk")
    return damaged


def store_write_failure(path: Path, exc: BaseException) -> str:
    """One line for a run that could not be written into the store at `path`: a full disk called by its name."""
    if disk_full(exc):
        return (f"the run store {path} could not be written: the disk is full (free some space, or point --store "
                f"at another disk; the run directory keeps every result written before it filled)")
    return f"the run store {path} could not be written: {exc}"


def no_store_error(ref: str, store_path: Path | None) -> UserError:
    """`show RUN` (or compare, report, export) where there is no run store, e.g. from another directory."""
    where = f" at {Path(store_path).absolute()}" if store_path is not None else ""
    return UserError(f"'{ref}' is not a run directory, and there is no run store{where} to look it up in",
                     hint="run servelab from the directory that holds runs/, give --out DIR or --store FILE, or "
                          "set SERVELAB_STORE")


@lru_cache(maxsize=1)
def expected_tables() -> frozenset[str]:
    """The tables a store of the latest schema has: every migration applied to an empty database."""
    db = sqlite3.connect(":memory:", isolation_level=None)
    try:
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for migration in MIGRATIONS[:LATEST]:
            migration(db)
        return frozenset(row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    finally:
        db.close()


class Store:
    readonly = False  # opened with readonly=True: reads only

    def __init__(self, path: Path, connection: sqlite3.Connection):
        self.path = path
        self.db = connection

    @classmethod
    def open(cls, path: Path, readonly: bool = False) -> Store:
        path = Path(path)
        if readonly:
            return cls._open_readonly(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create the run store's directory {path.parent}: {os_error_words(exc)}",
                            hint="point --store or --out somewhere writable") from None
        try:
            # isolation_level=None: transactions are ours (BEGIN IMMEDIATE), never the sqlite3 module's implicit ones
            db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            db.row_factory = sqlite3.Row
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            _use_wal(db)
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute("PRAGMA foreign_keys = ON")
        except sqlite3.DatabaseError as exc:
            hint = ("it cannot be written here: reading commands (runs, show, compare, report, export) still can"
                    if "readonly" in str(exc) or "unable to open" in str(exc)
                    else "is it a servelab store? point --store elsewhere")
            raise UserError(f"cannot open the run store {path}: {exc}", hint=hint) from None
        store = cls(path, db)
        try:
            store.migrate()
        except sqlite3.DatabaseError as exc:
            db.close()
            what = "the disk is full" if disk_full(exc) else str(exc)
            raise UserError(f"cannot use the run store {path}: {what}",
                            hint=store_hint(exc, "a damaged store: move it aside (the run directories keep every "
                                                 "result) or point --store elsewhere")) from None
        return store

    @classmethod
    def _open_readonly(cls, path: Path) -> Store:
        """Open for reading only: nothing in the file or its directory is created or changed."""
        if not path.is_file():
            raise UserError(f"no run store at {path}")
        uri = "file:" + urllib.parse.quote(str(path.resolve()))
        db = None
        last: sqlite3.Error | None = None
        # mode=ro reads a WAL store when its -wal/-shm can be opened or made; immutable=1 when nothing can be
        # (a read-only mount without them): then no other process may be writing it, which is the case there.
        for query in ("?mode=ro", "?mode=ro&immutable=1"):
            try:
                db = sqlite3.connect(uri + query, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
                db.execute("SELECT count(*) FROM sqlite_master").fetchone()
                break
            except sqlite3.Error as exc:
                last = exc
                if db is not None:
                    db.close()
                db = None
        if db is None:
            raise UserError(f"cannot read the run store {path}: {last}",
                            hint="is it a servelab store? point --store elsewhere") from None
        db.row_factory = sqlite3.Row
        store = cls(path, db)
        store.readonly = True
        try:
            version = store.version()
            if version > LATEST:
                raise UserError(f"the run store {path} was written by a newer servelab (schema {version}; this "
                                f"one knows up to {LATEST})", hint="upgrade servelab")
            if version < LATEST:  # an older store: bring a copy in memory up to date, leave the file alone
                memory = sqlite3.connect(":memory:", isolation_level=None)
                db.backup(memory)
                db.close()
                memory.row_factory = sqlite3.Row
                store.db = memory
                store.migrate()
        except sqlite3.DatabaseError as exc:
            store.close()
            raise UserError(f"cannot read the run store {path}: {exc}",
                            hint=store_hint(exc, "a damaged store: the run directories keep every result")) from None
        return store

    def check(self) -> None:
        """Before measuring: SQLite's quick_check and every table the schema needs, so that a damaged store is a
        UserError now rather than a lost result later."""
        hint = (f"move {self.path} aside (the run directories keep every result; a new store is made) or point "
                f"--store elsewhere")
        try:
            problems = [row[0] for row in self.db.execute("PRAGMA quick_check").fetchall()]
            tables = {row[0] for row in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            if disk_full(exc):
                raise UserError(f"cannot check the run store {self.path}: the disk is full",
                                hint=store_hint(exc, hint)) from None
            raise UserError(f"the run store {self.path} is damaged: {exc}", hint=hint) from None
        if problems != ["ok"]:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise UserError(f"the run store {self.path} is damaged: {problems[0]}{more}", hint=hint)
        missing = sorted(expected_tables() - tables)
        if missing:
            raise UserError(f"the run store {self.path} is damaged: table(s) {', '.join(missing)} missing",
                            hint=hint)

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
        first = self.version()
        while True:
            with self.write() as db:
                # Read the version inside the lock: another process may have migrated meanwhile.
                current = self.version()
                if current >= LATEST:
                    break
                if current == 0:
                    db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
                MIGRATIONS[current](db)
                db.execute("DELETE FROM schema_version")
                db.execute("INSERT INTO schema_version (version) VALUES (?)", (current + 1,))
        if 0 < first < RECORDS_COMPRESSED <= LATEST and not self.readonly:
            self._reclaim()

    def _reclaim(self) -> None:
        """Give the disk back the pages the uncompressed records held. Best effort: VACUUM needs about the
        store's size free and no other process inside a transaction; without them the space stays with the file
        (SQLite reuses it for later runs)."""
        try:
            self.db.execute("VACUUM")
        except sqlite3.Error:
            pass
