"""One look at a starting engine, the same for the launcher's watch (launch.py) and for doctor (doctor.py): the
log's new lines into the phase tracker, then an evidence sample that the judge weighs.

Lines that repeat on a timer (the adapter's `heartbeat_lines`) move the phase tracker but are not counted as the
log moving: they prove the process is alive, not that start-up advances.
"""

from __future__ import annotations

from servelab.engines.base import EngineAdapter
from servelab.lifecycle.diagnose import StartupJudge
from servelab.lifecycle.evidence import EvidenceSampler, LogCounters
from servelab.lifecycle.phases import PhaseTracker
from servelab.records import EvidenceSample


class StartupObserver:
    def __init__(self, adapter: EngineAdapter, tracker: PhaseTracker, sampler: EvidenceSampler,
                 judge: StartupJudge):
        self.adapter, self.tracker, self.sampler, self.judge = adapter, tracker, sampler, judge
        self.counters = LogCounters()

    def feed(self, lines: list[str], now: float) -> None:
        heartbeat = self.adapter.heartbeat_lines
        for line in lines:
            self.tracker.feed(line, now)
            if heartbeat is None or not heartbeat.search(line):
                self.counters.lines += 1

    def sample(self, now: float, probe: str | None, phase: str | None = None) -> EvidenceSample:
        """Sample the evidence and let the judge weigh it. `phase`: what to call the phase when the tracker cannot
        know it (no log); `probe` None: nothing is probed, so the port is not judged from it."""
        current = self.tracker.current
        self.counters.phase = current.name if phase is None else phase
        self.counters.progress = current.progress
        sample = self.sampler.sample(now, self.counters, probe)
        if probe is not None:
            sample.port = "closed" if probe == "down" else "open"  # the probe's connect says it without another
        self.judge.observe(sample)
        return sample
