"""What `compare` and `report` read: a run from the store, a run directory, another tool's result file
(compare/peers: vllm bench serve, AIPerf, GuideLLM), or literal baseline figures.

All of them become a RunData (compare/run_data.py), so nothing downstream cares where a run came from. A stored
run and a run directory are opened by store/read.py, the one reader of a run for every command; a run directory
may hold a RunSummary (`servelab run`) or a BenchResult (`servelab bench --out`); `cell.json` beside it names the
experiment cell it measured.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from servelab.bench.trials import counted_trials, pooled_steps, run_headline
from servelab.compare.metrics import KEY_METRICS
from servelab.compare.peers import load_peer
from servelab.compare.run_data import RunData
from servelab.records import BenchResult, Figure, RequestRecord, RunSummary, Step, Trial
from servelab.store.db import Store
from servelab.store.read import OpenedRun, open_run, open_run_dir


def from_summary(summary: RunSummary, records: Iterable[RequestRecord], name: str | None, ref: str,
                 experiment_id: str | None = None, run_dir: Path | None = None) -> RunData:
    # The one place a run's records are held in a list: every figure, interval and resample goes over them again
    # and again (records_of per level and trial), so they are read from the stream once, here.
    records = list(records)
    counted, excluded = counted_trials(summary.trials)
    steps = pooled_steps(counted, records)
    return RunData(name=name or summary.run_id, ref=ref, status=summary.status, steps=steps,
                   headline=run_headline(steps) if counted else dict(summary.headline), records=records,
                   launch=summary.launch, verify=summary.verify, provenance=summary.provenance,
                   error=summary.error, trials=list(summary.trials), counted=[t.index for t in counted],
                   excluded=[t.index for t in excluded], experiment_id=experiment_id, run_dir=run_dir)


def literal_run(name: str, figures: dict[str, float]) -> RunData:
    headline = {}
    for key, value in figures.items():
        metric = KEY_METRICS.get(key)
        headline[key] = Figure(value=value, unit=metric.unit if metric else "", definition=metric.definition
                               if metric else "", note="literal")
    return RunData(name=name, ref="literal", headline=headline, literal=True)


def run_data(opened: OpenedRun, name: str | None = None) -> RunData:
    """The RunData of a run read back by store/read.py (`name`: how to label it, default the cell's name)."""
    summary = opened.summary
    if isinstance(summary, BenchResult):  # a `servelab bench --out` directory: one trial
        steps = [Step(name=summary.mode, result=summary)]
        return RunData(name=name or opened.cell_name or Path(opened.ref).name, ref=opened.ref,
                       status="interrupted" if summary.interrupted else "complete", steps=steps,
                       headline=dict(summary.headline), records=list(opened.records),
                       trials=[Trial(index=0, steps=steps)], run_dir=opened.run_dir)
    return from_summary(summary, opened.records, name or opened.cell_name, opened.ref, opened.experiment_id,
                        opened.run_dir)


def load_run_dir(path: Path) -> RunData:
    return run_data(open_run_dir(path))


def resolve(ref: str, store: Store | None, store_path: Path | None = None) -> RunData:
    """A run directory if `ref` is one, else a run id (or unique prefix) in the store (`store_path`: where the
    store was looked for, when there is none, for the error)."""
    if Path(ref).is_file():  # another tool's result (vllm bench serve, AIPerf, GuideLLM): compare/peers
        return load_peer(Path(ref))
    return run_data(open_run(ref, store, store_path))
