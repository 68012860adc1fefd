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
summary's `.tmp` removed), the records it could not write stay in memory (`all_records()`), and `write_errors`
says, one line each, what could not be written and why, for the command to print (docs/output.md#disk-full).
A directory that cannot be created or written at all is a UserError before anything is measured.
"""

from __future__ import annotations

import gzip
import os
import re
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from servelab.errors import UserError
from servelab.records import RequestRecord


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:40] or "run"


def os_error_words(exc: OSError) -> str:
    """'No space left on device (ENOSPC)': the reason and the errno's name, for one-line messages."""
    from servelab.store.db import os_error_words as words

    return words(exc)


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
        self._records_good = 0
        self.written = 0  # records appended to the file  # bytes of records.jsonl known whole: a failed append is cut back to here
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
        """Every record of the run: those in the records file, then those the disk refused."""
        return list(self.iter_records())

    def iter_records(self) -> Iterator[RequestRecord]:
        """The same, one at a time (memory stays flat however many there are)."""
        if self._records is not None:
            try:
                self._records.flush(zlib.Z_SYNC_FLUSH)
            except (OSError, ValueError):
                pass
        found = records_file(self.path)
        if found is not None:
            yield from iter_records(found)
        yield from list(self.unwritten)

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
    path = Path(path)
    if path.is_dir():
        found = records_file(path)
        if found is None:
            return
        path = found
    if path.suffix == ".gz":
        fh = gzip.open(path, "rb")
    else:
        fh = open(path, "rb")
    with fh:
        while True:
            try:
                line = fh.readline()
            except (EOFError, zlib.error, gzip.BadGzipFile):
                return  # the stream ends torn (a crash, or a writer still at work): what came before stands
            if not line:
                return
            line = line.strip()
            if not line:
                continue
            try:
                yield RequestRecord.model_validate_json(line)
            except ValueError:
                continue
