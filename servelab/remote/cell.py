"""An experiment's cell on another host (`on: ssh://…`, or `on: ray:GPU=8` for a Ray node with those resources,
held for all of the cell's trials): its trials run there, as a one-cell experiment of `servelab run`, and come
back as this cell's run directory, trials, records and verdicts.

Why all of a remote cell's trials at once, not interleaved with the other cells' trials: interleaving spreads one
machine's noise over every cell that shares it. A cell on another host shares no machine with the local cells, so
running its trials back to back there is as fair, and the far side still interleaves, reruns contended trials
and resets the prefix cache as a local cell does, since it is the same code. Files the experiment names (a
dataset, a trace) are read on the far side, at the paths the experiment gives.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from rich.console import Console

from servelab.errors import UserError
from servelab.pipeline import CellPlan
from servelab.records import RunSummary
from servelab.remote.controller import RemoteOptions
from servelab.store.rundir import RunDir

EXPERIMENT_FILE = "experiment.yaml"  # JSON, which is YAML
INTERRUPTED = (130, 143, 129)  # the far side's exit after Ctrl-C, SIGTERM, SIGHUP (servelab/interrupts.py)


class RemoteCellSession:
    """CellSession's interface (start, bench_trial, stop, finish, summary, rundir) for a cell run elsewhere."""

    reruns_itself = True  # the far side reran its contended trials already

    def __init__(self, plan: CellPlan, experiment_doc: dict, host: str, console: Console,
                 options: RemoteOptions | None = None):
        self.plan, self.experiment_doc, self.host, self.console = plan, experiment_doc, host, console
        self.options = options or RemoteOptions()
        self.rundir = RunDir(plan.run_dir)
        self.summary = RunSummary(run_id=plan.run_id, status="interrupted",
                                  provenance=_placeholder_provenance(host))
        self.engine = None
        self.url: str | None = None
        self.failed = False
        self._ran = False

    @property
    def running(self) -> bool:
        return self._ran

    def start(self) -> bool:
        if self.failed:
            return False
        if not self._ran:
            self._ran = True
            try:
                self._run_there()
            except UserError as exc:
                self.fail(exc)
                return False
        return not self.failed

    def _run_there(self) -> None:
        from servelab.remote.commands import run_remote
        from servelab.report.live import launch_view
        from servelab.report.tables import make_console

        err = make_console(stderr=True)
        staging = Path(tempfile.mkdtemp(prefix="remote-cell-", dir=self.plan.run_dir.parent))
        try:
            code, job, _lines, copied = run_remote(
                self.host, ["run", EXPERIMENT_FILE, "--out", "results"], self.options, self.console, err,
                view=launch_view(self.console), fetch=("results", staging),
                files={EXPERIMENT_FILE: json.dumps(self.experiment_doc, indent=1)})
            cell_dir = _the_cell_dir(staging, copied)
            if cell_dir is None:
                raise UserError(f"the cell ran on {self.host} (exit status {code}) but left no run directory",
                                hint=f"its output is in {job.dir} there")
            for item in cell_dir.iterdir():
                if item.name == "cell.json":  # this experiment's own (its id, the cell's key here) stays
                    continue
                target = self.plan.run_dir / item.name
                if target.is_dir():
                    shutil.rmtree(target)
                shutil.move(str(item), target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        summary = RunSummary.model_validate_json((self.plan.run_dir / "summary.json").read_bytes())
        summary.run_id = self.plan.run_id
        summary.provenance.ran_on = self.host
        self.summary = summary
        self.url = summary.launch.url if summary.launch else None
        self.rundir = RunDir(self.plan.run_dir)  # counts the records copied in
        if summary.status == "failed":
            self.failed = True
        self.save()
        if job.stop_requested or code in INTERRUPTED:
            # Ctrl-C here stopped the cell there: the experiment stops as it would for a local cell, with what
            # was measured kept (a KeyboardInterrupt is how the runner hears of it)
            raise KeyboardInterrupt

    def bench_trial(self, trial: int, slot: int = 0, round: int | None = None):
        matching = [t for t in self.summary.trials if t.index == trial]
        return matching[0] if matching else None

    def stop(self) -> None:
        pass

    def fail(self, exc: UserError) -> None:
        self.failed = True
        self.summary.status = "failed"
        self.summary.error = exc.message + (f" ({exc.hint})" if exc.hint else "")
        self.console.print(f"cell failed: {self.summary.error}", markup=False, highlight=False)
        self.save()

    def finish(self) -> RunSummary:
        self.rundir.close()
        self.save()
        return self.summary

    def save(self, final: bool = False) -> None:
        self.rundir.write_json("summary.json", self.summary)


def _placeholder_provenance(host: str):
    """Until the far side's run comes back: servelab's version and the time, no host (this machine is not where
    the cell runs), ran_on the far host."""
    from servelab import __version__
    from servelab.provenance import utc_now_iso
    from servelab.records import Provenance

    return Provenance(started_at=utc_now_iso(), servelab_version=__version__, ran_on=host)


def _the_cell_dir(staging: Path, copied: list[str]) -> Path | None:
    """The one cell run directory among the copied files: the directory holding a summary.json and cell.json."""
    for name in sorted(copied):
        path = staging / name
        if path.name == "cell.json" and (path.parent / "summary.json").is_file():
            return path.parent
    return None
