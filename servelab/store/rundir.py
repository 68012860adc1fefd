"""A run directory: everything one `servelab run` (or `bench --out`) produced, written as it happens.

    <root>/<run-id>/
        summary.json      RunSummary or BenchResult (rewritten atomically after every step)
        records.jsonl.gz  one RequestRecord per line, gzip-compressed, appended and flushed as each request
                          completes; token events as columns (servelab/event_columns.py); `zcat` reads it.
                          Directories written before issue 14 have records.jsonl (plain, one object per
                          event): both read the same.
        engine.log        the engine's own output, when servelab launched it

Each record is followed by a gzip sync flush, so the file is readable up to the last whole record at any moment,
and after a crash (a reader stops at the torn end). ~5 bytes per streamed token, against ~66 for the older plain
file with one object per event (docs/output.md#records).

Appending records as they complete and rewriting the summary atomically after each step means Ctrl-C or a crash
loses at most the requests that were in flight.

A disk that fills up (or turns read-only) during a run costs no measurement: a write that fails is never an
exception here. The directory keeps what it could write (a torn record line is cut back off, a half-written
summary's `.tmp` removed), the records it could not write stay in memory (`iter_records()` yields them after the
file's), and `write_errors`
says, one line each, what could not be written and why, for the command to print (docs/output.md#disk-full).
A directory that cannot be created or written at all is a UserError before anything is measured.
"""

from __future__ import annotations

import gzip
import itertools
import os
import re
import time
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import BaseModel

from servelab.errors import UserError, os_error_words
from servelab.records import RequestRecord


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:40] or "run"


def ensure_writable(path: Path, what: str = "directory") -> None:
    """Create `path` if needed and write (and remove) a small file in it: a UserError naming the path and the
    errno when that fails, so a read-only or full disk stops a command before it measures anything."""
    probe = Path(path) / f".servelab-write-test-{os.getpid()}"
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(b"servelab\n" * 512)  # a few kB: a full disk refuses the data, not only the name
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise UserError(f"cannot write to the {what} {path}: {os_error_words(exc)}",
                        hint="free some space, or point it somewhere writable") from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass


class RunDir:
    def __init__(self, path: Path, keep_events_text: bool = False):
        self.path = path
        # Each event's text in the records file, not only the answer's whole text (`--keep-events-text`).
        self.keep_events_text = keep_events_text
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create the run directory {path}: {os_error_words(exc)}",
                            hint="free some space, or point --out somewhere writable") from None
        self._records = None  # the gzip stream
        self._raw = None  # the file under it
        self._records_good = 0  # bytes of the records file known whole: a failed append is cut back to here
        # Whole records in the file: those appended here, after any a directory opened again already held.
        existing = records_file(self.path)
        self.written = sum(1 for _ in iter_record_lines(existing)) if existing is not None else 0
        self.unwritten: list[RequestRecord] = []  # records the disk refused, kept for the summary and the store
        self._errors: dict[str, str] = {}  # file name -> why its last write failed

    @classmethod
    def create(cls, root: Path, *parts: str, keep_events_text: bool = False) -> RunDir:
        """A new directory named <UTC time>-<parts...>, never reusing an existing one."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        base = "-".join([stamp, *(_slug(p) for p in parts if p)])
        ensure_writable(root, "output directory")
        for n in range(1000):
            candidate = root / (base if n == 0 else f"{base}-{n}")
            try:
                candidate.mkdir()
                return cls(candidate, keep_events_text=keep_events_text)
            except FileExistsError:
                continue
            except OSError as exc:
                raise UserError(f"cannot create a run directory under {root}: {os_error_words(exc)}",
                                hint="free some space, or point --out somewhere writable") from None
        raise RuntimeError(f"could not create a run directory under {root}")

    def open_records(self) -> None:
        """Open records.jsonl for appending now rather than at the first record: a load that later uses every
        file descriptor the process may have (bench/limits.py) can still write what it measured."""
        if self._records is None:
            try:
                self._open_records()
            except OSError:
                pass  # the first append tries again, and says why if it fails

    def discard_if_empty(self) -> bool:
        """Remove the directory when nothing was written to it (a run that failed before its first record,
        an empty records.jsonl aside); True if it was removed."""
        self.close()
        try:
            if self.written == 0 and self.records_path.exists():
                self.records_path.unlink()  # no record: only the gzip header and trailer
        except OSError:
            pass
        try:
            self.path.rmdir()  # only succeeds on an empty directory
        except OSError:
            return False
        return True

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def records_path(self) -> Path:
        return self.path / RECORDS_FILE

    def _open_records(self) -> None:
        self._raw = open(self.records_path, "ab")
        self._records_good = self._raw.tell()
        self._records = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=1)

    @property
    def engine_log(self) -> Path:
        return self.path / "engine.log"

    def append_record(self, record: RequestRecord) -> None:
        """Append and flush one record. Once the disk refused one, the rest stay in memory (`unwritten`): the file
        keeps only whole lines, in order."""
        if self.unwritten:
            self.unwritten.append(record)
            return
        try:
            if self._records is None:
                self._open_records()
            line = record.model_dump_json(context={"events_text": self.keep_events_text} if self.keep_events_text
                                          else None)
            self._records.write(line.encode("utf-8") + b"\n")
            self._records.flush(zlib.Z_SYNC_FLUSH)  # readable up to here, whatever happens next
            self._records_good = self._raw.tell()
            self.written += 1
        except OSError as exc:
            self.unwritten.append(record)
            self._errors[self.records_path.name] = os_error_words(exc)
            self._drop_records_file()

    def _drop_records_file(self) -> None:
        """After a failed append: close the file without flushing the rest, and cut off a torn last line."""
        fh, raw, self._records, self._raw = self._records, self._raw, None, None
        for f in (fh, raw):
            if f is not None:
                try:
                    f.close()  # may write more of the failed line: cut off below with the rest of it
                except (OSError, ValueError):
                    pass
        try:
            if self.records_path.exists() and self.records_path.stat().st_size > self._records_good:
                os.truncate(self.records_path, self._records_good)
        except OSError:
            pass

    def all_records(self) -> list[RequestRecord]:
        """Every record of the run in a list: those in the records file, then those the disk refused."""
        return list(self.iter_records())

    def iter_records(self) -> RunDirRecords:
        """The same, one at a time (memory stays flat however many there are). The iterator also says where they
        are, so the store can point at the records file instead of copying it (store/runs.py)."""
        if self._records is not None:
            try:
                self._records.flush(zlib.Z_SYNC_FLUSH)
            except (OSError, ValueError):
                pass
        return RunDirRecords(records_file(self.path), self.written, list(self.unwritten), self.keep_events_text)

    def write_json(self, name: str, doc: BaseModel) -> Path | None:
        """Write atomically: a reader (or a crash) never sees half a file. None when the disk refused it (the
        previous version, if any, stays; no `.tmp` is left; `write_errors` says why)."""
        target = self.path / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        try:
            tmp.write_text(doc.model_dump_json(indent=2) + "\n", encoding="utf-8")
            os.replace(tmp, target)
        except OSError as exc:
            self._errors[name] = os_error_words(exc)
            try:
                tmp.unlink()
            except OSError:
                pass
            return None
        self._errors.pop(name, None)
        return target

    @property
    def write_errors(self) -> list[str]:
        """What could not be written, one line each (empty when everything was)."""
        lines = []
        for name, why in self._errors.items():
            if name == self.records_path.name and self.unwritten:
                lines.append(f"could not write {self.records_path}: {why}; {len(self.unwritten)} record(s) were "
                             f"kept in memory only")
            else:
                lines.append(f"could not write {self.path / name}: {why}")
        return lines

    def close(self) -> None:
        if self._records is not None:
            try:
                self._records.close()  # the gzip trailer
                self._raw.close()
            except OSError as exc:
                self._errors[self.records_path.name] = os_error_words(exc)
            self._records = self._raw = None


class RunDirRecords(Iterator[RequestRecord]):
    """A run directory's records as of one moment: the `in_file` whole records of its records file `file` (None
    when it has none), then the ones the disk refused (`unwritten`). Iterating reads the file one record at a time;
    `lines()` gives the same records as JSON lines, those of the file as they are on disk (nothing parsed)."""

    def __init__(self, file: Path | None, in_file: int, unwritten: list[RequestRecord],
                 keep_events_text: bool = False):
        self.file, self.in_file, self.unwritten = file, in_file, unwritten
        self.keep_events_text = keep_events_text
        self._iterator: Iterator[RequestRecord] | None = None

    def __iter__(self) -> RunDirRecords:
        return self

    def __next__(self) -> RequestRecord:
        if self._iterator is None:
            self._iterator = itertools.chain(iter_records(self.file) if self.file is not None else (),
                                             self.unwritten)
        return next(self._iterator)

    def __len__(self) -> int:
        return self.in_file + len(self.unwritten)

    def lines(self, skip: int = 0) -> Iterator[bytes]:
        """The records after the first `skip`, one JSON line each (no newline)."""
        if self.file is not None and skip < self.in_file:
            yield from itertools.islice(iter_record_lines(self.file), skip, self.in_file)
        yield from unwritten_lines(self.unwritten[max(0, skip - self.in_file):], self.keep_events_text)


def unwritten_lines(records: Iterable[RequestRecord], keep_events_text: bool = False) -> Iterator[bytes]:
    """Records as the records file holds them, one JSON line each."""
    context = {"events_text": True} if keep_events_text else None
    for record in records:
        yield record.model_dump_json(context=context).encode("utf-8")


RECORDS_FILE = "records.jsonl.gz"
LEGACY_RECORDS_FILE = "records.jsonl"  # run directories written before issue 14


def records_file(run_dir: Path) -> Path | None:
    """The records file of a run directory (either name), or None when it has none."""
    for name in (RECORDS_FILE, LEGACY_RECORDS_FILE):
        if (Path(run_dir) / name).exists():
            return Path(run_dir) / name
    return None


def read_records(path: Path) -> list[RequestRecord]:
    """Read a records file back (records.jsonl.gz, or an older records.jsonl; a run directory finds its file);
    a torn last line (a crash mid-write) is skipped, not fatal."""
    return list(iter_records(path))


def iter_records(path: Path) -> Iterator[RequestRecord]:
    """The records of a records file, one at a time."""
    for line in iter_record_lines(path):
        try:
            yield RequestRecord.model_validate_json(line)
        except ValueError:
            continue


def iter_record_lines(path: Path) -> Iterator[bytes]:
    """The lines of a records file (or a run directory's), unparsed, up to where the stream ends or is torn."""
    path = Path(path)
    if path.is_dir():
        found = records_file(path)
        if found is None:
            return
        path = found
    fh = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    with fh:
        while True:
            try:
                line = fh.readline()
            except (EOFError, zlib.error, gzip.BadGzipFile):
                return  # the stream ends torn (a crash, or a writer still at work): what came before stands
            if not line:
                return
            line = line.strip()
            if line:
                yield line


class RecordsFile(Iterable[RequestRecord]):
    """A records file read again from its start each time it is iterated: records for a reader that goes over
    them more than once without holding them all."""

    def __init__(self, path: Path | None):
        self.path = path

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter_records(self.path) if self.path is not None else iter(())
