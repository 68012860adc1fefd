"""Reading a run back: one place that opens a run from what a command line names, for compare, report, export and
the experiment runner alike.

A reference is a run directory (summary.json beside its records file), or a run id (or unique prefix) in the
store. Either way the result is one shape: the run's summary and its records, streamed from the records file or
the store's chunks each time they are iterated, never all held (`len()` where the store knows the count). Another
tool's result file (vllm bench serve, AIPerf, GuideLLM) is read by compare/peers, which lies above the store, so
compare/sources.resolve tries it before calling here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from servelab.errors import UserError
from servelab.records import BenchResult, RequestRecord, RunSummary
from servelab.store.db import Store, no_store_error
from servelab.store.rundir import RecordsFile, records_file
from servelab.store.runs import load_run, resolve_run_id

STORE_HINT = "`servelab runs` lists stored runs"


@dataclass
class OpenedRun:
    """A run as read back. `summary` is the RunSummary of `servelab run` (or a stored run), or the BenchResult a
    `servelab bench --out` directory holds as its summary.json. `records` may be iterated more than once; each time
    reads them again one at a time."""

    summary: RunSummary | BenchResult
    records: Iterable[RequestRecord]
    ref: str  # the run id, or the directory as named
    cell_name: str | None = None
    experiment_id: str | None = None
    run_dir: Path | None = None
    records_missing: str | None = None  # the records file the store points at is gone: a sentence saying so

    @property
    def count(self) -> int | None:
        """How many records, when known without reading them (a stored run); None for a run directory."""
        return len(self.records) if hasattr(self.records, "__len__") else None  # type: ignore[arg-type]


def open_run(ref: str, store: Store | None = None, store_path: Path | None = None, *,
             unknown_hint: str | None = STORE_HINT) -> OpenedRun:
    """The run `ref` names: a run directory if it is one, else a run id (or unique prefix) in `store`, or in the
    store at `store_path` when no open store is given (opened read-only for the look-up; the records are read
    from it then, so it may be closed). `store_path` also names where the store was looked for when there is
    none, for the error."""
    path = Path(ref)
    if path.is_dir():
        return open_run_dir(path)
    if store is None and store_path is not None and Path(store_path).exists():
        with Store.open(Path(store_path), readonly=True) as opened:
            return _open_ref(opened, ref, Path(store_path), unknown_hint)
    if store is not None:
        return _open_ref(store, ref, store.path, unknown_hint)
    raise no_store_error(ref, store_path)


def _open_ref(store: Store, ref: str, where: Path, hint: str | None) -> OpenedRun:
    run_id = resolve_run_id(store, ref)
    if run_id is None:
        raise UserError(f"'{ref}' is neither a run directory nor a run in {where}", hint=hint)
    return open_stored(store, run_id)


def open_stored(store: Store, run_id: str) -> OpenedRun:
    """The stored run of exactly `run_id` (UserError when there is none)."""
    summary, records, meta = load_run(store, run_id)
    return OpenedRun(summary=summary, records=records, ref=run_id, cell_name=meta["cell_name"],
                     experiment_id=meta["experiment_id"],
                     run_dir=Path(meta["run_dir"]) if meta["run_dir"] else None,
                     records_missing=meta["records_missing"])


def open_run_dir(path: Path) -> OpenedRun:
    """A run directory: its summary.json (a RunSummary or a BenchResult) and records file; `cell.json` beside them
    names the experiment cell it measured."""
    summary_path = path / "summary.json"
    if not summary_path.is_file():
        raise UserError(f"{path} has no summary.json: not a run directory")
    try:
        doc = json.loads(summary_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise UserError(f"{summary_path}: not valid JSON ({exc})") from None
    try:
        summary: RunSummary | BenchResult = (BenchResult.model_validate(doc) if "levels" in doc
                                             else RunSummary.model_validate(doc))
    except ValueError as exc:
        raise UserError(f"{summary_path}: not a servelab summary ({str(exc).splitlines()[0]})") from None
    return _dir_run(path, summary)


def open_cell_dir(path: Path) -> OpenedRun:
    """A cell's run directory, as the experiment runner reads it when its store failed: summary.json must be a
    RunSummary. Raises OSError or ValueError as they come, so the runner's error can name the run."""
    return _dir_run(path, RunSummary.model_validate_json((path / "summary.json").read_text(encoding="utf-8")))


def _dir_run(path: Path, summary: RunSummary | BenchResult) -> OpenedRun:
    return OpenedRun(summary=summary, records=RecordsFile(records_file(path)), ref=str(path),
                     cell_name=_cell_json(path, "cell"), experiment_id=_cell_json(path, "experiment_id"),
                     run_dir=path)


def _cell_json(path: Path, key: str) -> str | None:
    try:
        return json.loads((path / "cell.json").read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None
