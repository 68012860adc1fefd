"""What `compare` and `report` read: a run from the store, a run directory, or literal baseline figures.

All three become a RunData, so nothing downstream cares where a run came from. A run directory may hold a
RunSummary (`servelab run`) or a BenchResult (`servelab bench --out`); `cell.json` beside it names the
experiment cell it measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from servelab.errors import UserError
from servelab.records import (BenchResult, Figure, LaunchResult, LintFinding, Provenance, RequestRecord,
                              RunSummary, Summary, VerifyResult)
from servelab.store.db import Store
from servelab.store.rundir import read_records
from servelab.store.runs import load_run, resolve_run_id


@dataclass
class RunData:
    name: str  # how tables and charts label it: the cell's name, else the run id
    ref: str  # the run id, the directory, or "literal"
    status: str = "complete"
    single: BenchResult | None = None
    sweep: BenchResult | None = None
    headline: dict[str, Figure] = field(default_factory=dict)
    records: list[RequestRecord] = field(default_factory=list)
    launch: LaunchResult | None = None
    verify: VerifyResult | None = None
    provenance: Provenance | None = None
    error: str | None = None
    literal: bool = False  # figures typed by hand: no records, no workload, no interval

    @property
    def benches(self) -> list[BenchResult]:
        return [b for b in (self.single, self.sweep) if b is not None]

    @property
    def levels(self) -> list[Summary]:
        return [s for b in self.benches for s in b.levels]

    @property
    def serious(self) -> list[LintFinding]:
        return [f for f in (self.launch.lint if self.launch else []) if f.severity == "serious"]

    def records_of(self, tag: str) -> list[RequestRecord]:
        """The measured, successful requests of one level (the ones its figures are computed from)."""
        return [r for r in self.records if r.tag == tag and not r.warmup and r.ok]


def from_summary(summary: RunSummary, records: list[RequestRecord], name: str | None, ref: str) -> RunData:
    return RunData(name=name or summary.run_id, ref=ref, status=summary.status, single=summary.single,
                   sweep=summary.sweep, headline=dict(summary.headline), records=records, launch=summary.launch,
                   verify=summary.verify, provenance=summary.provenance, error=summary.error)


def literal_run(name: str, figures: dict[str, float]) -> RunData:
    from servelab.compare.metrics import KEY_METRICS  # units and definitions of the keys typed

    headline = {}
    for key, value in figures.items():
        metric = KEY_METRICS.get(key)
        headline[key] = Figure(value=value, unit=metric.unit if metric else "", definition=metric.definition
                               if metric else "", note="literal")
    return RunData(name=name, ref="literal", headline=headline, literal=True)


def load_run_dir(path: Path) -> RunData:
    summary_path = path / "summary.json"
    if not summary_path.is_file():
        raise UserError(f"{path} has no summary.json: not a run directory")
    try:
        doc = json.loads(summary_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise UserError(f"{summary_path}: not valid JSON ({exc})") from None
    records = read_records(path / "records.jsonl") if (path / "records.jsonl").exists() else []
    cell = _cell_name(path)
    try:
        if "levels" in doc:  # a BenchResult (`servelab bench --out`)
            result = BenchResult.model_validate(doc)
            return RunData(name=cell or path.name, ref=str(path), status="interrupted" if result.interrupted
                           else "complete", single=result if result.mode == "single" else None,
                           sweep=None if result.mode == "single" else result, headline=dict(result.headline),
                           records=records)
        return from_summary(RunSummary.model_validate(doc), records, cell, str(path))
    except ValueError as exc:
        raise UserError(f"{summary_path}: not a servelab summary ({str(exc).splitlines()[0]})") from None


def _cell_name(path: Path) -> str | None:
    try:
        return json.loads((path / "cell.json").read_text(encoding="utf-8")).get("cell")
    except (OSError, ValueError, AttributeError):
        return None


def resolve(ref: str, store: Store | None) -> RunData:
    """A run directory if `ref` is one, else a run id (or unique prefix) in the store."""
    path = Path(ref)
    if path.is_dir():
        return load_run_dir(path)
    if store is not None:
        run_id = resolve_run_id(store, ref)
        if run_id is not None:
            summary, records, meta = load_run(store, run_id)
            return from_summary(summary, records, meta["cell_name"], run_id)
    where = f" nor a run in {store.path}" if store is not None else ""
    raise UserError(f"'{ref}' is neither a run directory{where}", hint="`servelab runs` lists stored runs")
