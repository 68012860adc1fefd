"""A run as `compare` and `report` see it, whichever reader made it (compare/sources.py: the store, a run
directory, literal figures; compare/peers: another tool's result file).

It lies below every reader and below compare/metrics.py, which reads figures from it, so none of them needs
another to name it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.bench.trials import clean_trials, is_contended
from servelab.records import (Figure, LaunchResult, LintFinding, Provenance, RequestRecord, Step, Steps, Trial,
                              VerifyResult)


@dataclass
class RunData(Steps):
    """One run as compare and report see it. Its `steps` (and `single`, `sweep`) pool the trials that count
    (bench/trials.py: the quiet ones when there are any), so figures read from them are the run's figures whatever
    its trials."""

    name: str  # how tables and charts label it: the cell's name, else the run id
    ref: str  # the run id, the directory, or "literal"
    status: str = "complete"
    steps: list[Step] = field(default_factory=list)
    headline: dict[str, Figure] = field(default_factory=dict)
    records: list[RequestRecord] = field(default_factory=list)
    launch: LaunchResult | None = None
    verify: VerifyResult | None = None
    provenance: Provenance | None = None
    error: str | None = None
    literal: bool = False  # figures typed by hand: no records, no workload, no interval
    trials: list[Trial] = field(default_factory=list)  # every trial, as run
    counted: list[int] = field(default_factory=lambda: [0])  # indices of the trials single/sweep pool
    excluded: list[int] = field(default_factory=list)  # contended trials left out
    experiment_id: str | None = None  # runs of one experiment ran interleaved: their trials pair by index
    peer: Any = None  # a PeerInfo (compare/peers) when the run is another tool's result file
    run_dir: Path | None = None  # its run directory, where it still is (the report reads its GPU series there)

    @property
    def serious(self) -> list[LintFinding]:
        return [f for f in (self.launch.lint if self.launch else []) if f.severity == "serious"]

    def trial(self, index: int) -> Trial | None:
        return next((t for t in self.trials if t.index == index), None)

    @property
    def all_contended(self) -> bool:
        """Every trial that counts had a contended level: its figures rest on a busy machine."""
        return bool(self.counted) and all((t := self.trial(i)) is not None and is_contended(t)
                                          for i in self.counted)

    def round_of(self, index: int) -> int:
        """The round of the experiment's schedule trial `index` stands for (a rerun of a contended trial stands
        for the round it replaced): interleaved cells' trials pair by it."""
        found = self.trial(index)
        return found.round_index if found is not None else index

    @property
    def clean_trials(self) -> int | None:
        """Trials that ran to the end on a quiet machine; None for figures that are not servelab's measurement
        (literal figures, another tool's file), which are one fixed reference by nature."""
        if self.literal or self.peer is not None:
            return None
        return clean_trials(self.trials) if self.trials else 1

    def records_of(self, tag: str, trial: int | None = None) -> list[RequestRecord]:
        """The measured, successful requests of one level (the ones its figures are computed from), over the
        trials that count, or of one trial."""
        trials = set(self.counted) if trial is None else {trial}
        return [r for r in self.records if r.tag == tag and not r.warmup and r.ok and r.trial in trials]
