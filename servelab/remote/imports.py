"""Run directories copied back from the far side, kept in this side's store as if they had been run here.

Each copied run directory holds run.json (the run as the far side's store kept it, its provenance naming the far
host) beside summary.json and the records; the store gets that run, marked `ran_on` the ssh:// URL. A directory
without run.json (a bench interrupted before it wrote its results) is left on disk, not stored, and said so.
"""

from __future__ import annotations

from pathlib import Path

from servelab.bench_session import RUN_FILE
from servelab.errors import UserError
from servelab.records import RunSummary


def copied_run_dirs(out: Path, copied: list[str]) -> list[Path]:
    tops = sorted({name.split("/", 1)[0] for name in copied if "/" in name})
    return [out / top for top in tops if (out / top).is_dir()]


def store_copied_runs(out: Path, copied: list[str], store_path: Path, *, ran_on: str,
                      remote_dir: str) -> list[Path]:
    from servelab.store.db import Store
    from servelab.store.rundir import iter_records, records_file
    from servelab.store.runs import save_run

    kept: list[Path] = []
    for run_dir in copied_run_dirs(out, copied):
        path = run_dir / RUN_FILE
        if not path.is_file():
            continue
        try:
            summary = RunSummary.model_validate_json(path.read_bytes())
        except ValueError as exc:
            raise UserError(f"{path} copied back from {ran_on} is not a run: {exc}") from None
        summary.provenance.ran_on = ran_on
        path.write_text(summary.model_dump_json(indent=2))
        records = records_file(run_dir)
        with Store.open(store_path) as db:
            save_run(db, summary, iter_records(records) if records is not None else iter(()), run_dir)
        kept.append(run_dir)
    return kept
