"""A run directory: everything one `servelab run` (or `bench --out`) produced, written as it happens.

    <root>/<run-id>/
        summary.json      RunSummary or BenchResult (rewritten atomically after every step)
        records.jsonl     one RequestRecord per line, appended and flushed as each request completes
        engine.log        the engine's own output, when servelab launched it

Appending records as they complete and rewriting the summary atomically after each step means Ctrl-C or a crash
loses at most the requests that were in flight.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from pydantic import BaseModel

from servelab.records import RequestRecord


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:40] or "run"


class RunDir:
    def __init__(self, path: Path):
        self.path = path
        self.path.mkdir(parents=True, exist_ok=True)
        self._records = None

    @classmethod
    def create(cls, root: Path, *parts: str) -> RunDir:
        """A new directory named <UTC time>-<parts...>, never reusing an existing one."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        base = "-".join([stamp, *(_slug(p) for p in parts if p)])
        root.mkdir(parents=True, exist_ok=True)
        for n in range(1000):
            candidate = root / (base if n == 0 else f"{base}-{n}")
            try:
                candidate.mkdir()
                return cls(candidate)
            except FileExistsError:
                continue
        raise RuntimeError(f"could not create a run directory under {root}")

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def records_path(self) -> Path:
        return self.path / "records.jsonl"

    @property
    def engine_log(self) -> Path:
        return self.path / "engine.log"

    def append_record(self, record: RequestRecord) -> None:
        if self._records is None:
            self._records = open(self.records_path, "a", encoding="utf-8")
        self._records.write(record.model_dump_json() + "\n")
        self._records.flush()

    def write_json(self, name: str, doc: BaseModel) -> Path:
        """Write atomically: a reader (or a crash) never sees half a file."""
        target = self.path / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(doc.model_dump_json(indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, target)
        return target

    def close(self) -> None:
        if self._records is not None:
            self._records.close()
            self._records = None


def read_records(path: Path) -> list[RequestRecord]:
    """Read a records.jsonl back; a torn last line (a crash mid-write) is skipped, not fatal."""
    records: list[RequestRecord] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(RequestRecord.model_validate_json(line))
            except ValueError:
                continue
    return records
