"""What `compare` and `report` read: a run from the store, a run directory, another tool's result file
(compare/peers: vllm bench serve, AIPerf, GuideLLM), or literal baseline figures.

All of them become a RunData (compare/run_data.py), so nothing downstream cares where a run came from. A run
directory may hold a RunSummary (`servelab run`) or a BenchResult (`servelab bench --out`); `cell.json` beside it
names the experiment cell it measured.
"""

from __future__ import annotations

import json
from pathlib import Path

from servelab.bench.trials import counted_trials, pooled_steps, run_headline
from servelab.compare.metrics import KEY_METRICS
from servelab.compare.peers import load_peer
from servelab.compare.run_data import RunData
from servelab.errors import UserError
from servelab.records import BenchResult, Figure, RequestRecord, RunSummary, Step, Trial
from servelab.store.db import Store, no_store_error
from servelab.store.rundir import read_records
from servelab.store.runs import load_run, resolve_run_id

def from_summary(summary: RunSummary, records: list[RequestRecord], name: str | None, ref: str,
                 experiment_id: str | None = None) -> RunData:
    records = list(records)  # read for every figure and interval: held once (a stored run's arrive streamed)
    counted, excluded = counted_trials(summary.trials)
    steps = pooled_steps(counted, records)
    return RunData(name=name or summary.run_id, ref=ref, status=summary.status, steps=steps,
                   headline=run_headline(steps) if counted else dict(summary.headline), records=records,
                   launch=summary.launch, verify=summary.verify, provenance=summary.provenance,
                   error=summary.error, trials=list(summary.trials), counted=[t.index for t in counted],
                   excluded=[t.index for t in excluded], experiment_id=experiment_id)


def literal_run(name: str, figures: dict[str, float]) -> RunData:
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
    records = read_records(path)
    cell, experiment_id = _cell_json(path, "cell"), _cell_json(path, "experiment_id")
    try:
        if "levels" in doc:  # a BenchResult (`servelab bench --out`): one trial
            result = BenchResult.model_validate(doc)
            steps = [Step(name=result.mode, result=result)]
            return RunData(name=cell or path.name, ref=str(path), status="interrupted" if result.interrupted
                           else "complete", steps=steps, headline=dict(result.headline),
                           records=records, trials=[Trial(index=0, steps=steps)])
        return from_summary(RunSummary.model_validate(doc), records, cell, str(path), experiment_id)
    except ValueError as exc:
        raise UserError(f"{summary_path}: not a servelab summary ({str(exc).splitlines()[0]})") from None


def _cell_json(path: Path, key: str) -> str | None:
    try:
        return json.loads((path / "cell.json").read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def resolve(ref: str, store: Store | None, store_path: Path | None = None) -> RunData:
    """A run directory if `ref` is one, else a run id (or unique prefix) in the store (`store_path`: where the
    store was looked for, when there is none, for the error)."""
    path = Path(ref)
    if path.is_dir():
        return load_run_dir(path)
    if path.is_file():  # another tool's result (vllm bench serve, AIPerf, GuideLLM): compare/peers
        return load_peer(path)
    if store is not None:
        run_id = resolve_run_id(store, ref)
        if run_id is not None:
            summary, records, meta = load_run(store, run_id)
            return from_summary(summary, records, meta["cell_name"], run_id, meta["experiment_id"])
        raise UserError(f"'{ref}' is neither a run directory nor a run in {store.path}",
                        hint="`servelab runs` lists stored runs")
    raise no_store_error(ref, store_path)
