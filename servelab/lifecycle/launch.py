"""Bring an engine up: check the port, start it supervised, follow its log, its readiness probe and the evidence
that it is alive, until it is ready, dies, stalls or runs out of time.

Ready means the probe says so (`adapter.probe_state` of GET `probe_path`) while the process is alive: a log line
alone is never trusted (a server can print "listening" and still answer 503, or the line can come from a
different process). The log gives the phases in between; evidence samples (lifecycle/evidence.py) taken about
once a second tell a slow phase from a hung one (lifecycle/diagnose.py). When a phase has been silent for half its
budget, and again when it stalls, the engine's stacks are read in the background (lifecycle/stall_stacks.py) and a
stall verdict ends with what they showed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from servelab.engines import get_engine
from servelab.engines.base import EngineAdapter, EngineSpec, Launch
from servelab.errors import EngineFailed, UserError
from servelab.lifecycle.diagnose import OOM_HINT, StartupJudge, crashed_verdict
from servelab.lifecycle.evidence import EvidenceSampler
from servelab.lifecycle.observe import StartupObserver
from servelab.lifecycle.phases import LogTailer, PhaseTracker
from servelab.lifecycle.ports import ensure_port_free, free_port
from servelab.lifecycle.probe import POLL_S, Prober, ProbeReading
from servelab.lifecycle.running import LOG_TAIL_LINES, RunningEngine
from servelab.lifecycle.stall_stacks import DEADLINE_S as STACKS_DEADLINE_S
from servelab.lifecycle.stall_stacks import StallStacks, message_lines, with_stacks
from servelab.lifecycle.supervisor import SupervisedProcess, start_process
from servelab.provenance import utc_now_iso
from servelab.records import LaunchResult, Verdict

__all__ = ["LaunchStatus", "LaunchView", "PreparedLaunch", "RunningEngine", "STALL_ACTIONS", "prepare_launch",
           "start_engine"]

UPDATE_EVERY_S = 0.5  # on_update is called at least this often, even when nothing changed
SAMPLE_EVERY_S = 1.0  # evidence cadence: cheap (a /proc walk), and a stall budget is tens of seconds at least
STALL_ACTIONS = ("stop", "wait")


@dataclass(frozen=True)
class LaunchStatus:
    """What a live view needs to show, handed to `on_update`."""

    elapsed_s: float
    phase: str
    phase_elapsed_s: float  # time in the current phase: the base of an ETA
    progress: float | None  # 0..1 when the log says n/total
    detail: str | None
    last_line: str | None
    probe: str  # the adapter's reading of the last probe answer: down, loading, ready, unknown
    pid: int
    verdict: Verdict | None = None  # the latest judgement from the evidence (None before the first sample)

    def key(self) -> tuple[Any, ...]:
        """Everything but the clocks: a change here is worth an update."""
        return (self.phase, self.progress, self.detail, self.last_line, self.probe,
                self.verdict.state if self.verdict else None)


class LaunchView(Protocol):
    """Someone watching a start-up: the operator's live view (report/live.py) is one. `start_engine` drives it,
    so drawing the progress never needs the power to start anything."""

    def starting(self, title: str) -> None:
        """The engine is about to start: everything that can be refused before a process exists was checked."""

    def update(self, status: LaunchStatus) -> None:
        """The start-up moved, or UPDATE_EVERY_S passed; raising here stops the engine and propagates."""

    def ended(self, engine: RunningEngine | None) -> None:
        """The start-up is over: ready (`engine`) or failed (None, the exception follows)."""


@dataclass(frozen=True)
class PreparedLaunch:
    """An engine checked and its command built, nothing started yet (`prepare_launch`)."""

    spec: EngineSpec
    adapter: EngineAdapter
    port: int
    launch: Launch


def prepare_launch(spec: EngineSpec) -> PreparedLaunch:
    """Everything that can be refused before a process starts: an unknown or missing engine, a missing model, a
    port in use. Raises UserError; starts nothing."""
    adapter = get_engine(spec.engine)
    port = spec.port or free_port(spec.host)
    ensure_port_free(spec.host, port)
    return PreparedLaunch(spec=spec, adapter=adapter, port=port, launch=adapter.launch(spec, port))


def start_engine(spec: EngineSpec, log_dir: Path, on_update: Callable[[LaunchStatus], None] | None = None,
                 ready_timeout_s: float = 600.0, stop_grace_s: float = 10.0, stall_action: str = "stop",
                 sample_every_s: float = SAMPLE_EVERY_S, view: LaunchView | None = None,
                 stacks: bool = True) -> RunningEngine:
    """Start the engine `spec` describes and return once its probe says ready.

    Raises UserError before anything starts (unknown engine, engine not installed, port in use, missing model),
    EngineFailed when the process dies, stalls (no evidence of progress for its phase's budget; with
    stall_action="wait" a stall is only reported) or is not ready within `ready_timeout_s`. On any failure or
    interruption (Ctrl-C, an exception from `on_update` or the view) the whole process group is stopped before
    the exception propagates. `view` is told of the start-up after those refusals, so a refused launch draws
    nothing; `on_update` alone gets only the statuses. `stacks=False` never reads the engine's stacks (`up
    --no-stacks`); else a phase silent for half its budget, and a stall, have them read and named.
    """
    if stall_action not in STALL_ACTIONS:
        raise UserError(f"unknown stall action '{stall_action}'", hint="use stop or wait")
    prepared = prepare_launch(spec)
    if view is None:
        return _start_prepared(prepared, log_dir, on_update, ready_timeout_s, stop_grace_s, stall_action,
                               sample_every_s, stacks)
    view_update = view.update
    if on_update is not None:
        def both(status: LaunchStatus) -> None:
            on_update(status)
            view_update(status)
        view_update = both
    view.starting(prepared.adapter.title)
    try:
        engine = _start_prepared(prepared, log_dir, view_update, ready_timeout_s, stop_grace_s, stall_action,
                                 sample_every_s, stacks)
    except BaseException:
        view.ended(None)
        raise
    try:
        view.ended(engine)
    except BaseException:
        engine.stop(stop_grace_s)
        raise
    return engine


def _start_prepared(prepared: PreparedLaunch, log_dir: Path, on_update: Callable[[LaunchStatus], None] | None,
                    ready_timeout_s: float, stop_grace_s: float, stall_action: str,
                    sample_every_s: float, stacks: bool = True) -> RunningEngine:
    spec, adapter, port, launch = prepared.spec, prepared.adapter, prepared.port, prepared.launch
    log_path = Path(log_dir) / f"{adapter.name}-{port}.log"
    tracker = PhaseTracker(adapter)
    started_at = utc_now_iso()
    t0 = time.monotonic()
    process = start_process(launch.command, log_path, env=launch.env)
    watch = _StartupWatch(adapter, launch, process, tracker, lambda: time.monotonic() - t0, on_update,
                          ready_timeout_s, spec.stall_budget_s, stall_action, sample_every_s, stacks)
    try:
        ready_s, probe = watch.run()
    except BaseException:
        process.stop(stop_grace_s)
        raise
    finally:
        watch.sampler.close()
    return RunningEngine(spec=spec, adapter=adapter, launch=launch, process=process, tracker=tracker,
                         started_at=started_at, ready_s=ready_s, ready_probe=probe, evidence=watch.sampler.samples,
                         verdicts=watch.verdicts)


class _StartupWatch:
    """The start-up loop: log, probe, evidence, verdict, every POLL_S."""

    def __init__(self, adapter: EngineAdapter, launch: Launch, process: SupervisedProcess, tracker: PhaseTracker,
                 clock: Callable[[], float], on_update: Callable[[LaunchStatus], None] | None,
                 ready_timeout_s: float, stall_budget_s: float | None, stall_action: str, sample_every_s: float,
                 stacks: bool = True):
        self.adapter, self.launch, self.process, self.tracker = adapter, launch, process, tracker
        self.clock, self.on_update, self.ready_timeout_s = clock, on_update, ready_timeout_s
        self.stall_action, self.sample_every_s = stall_action, sample_every_s
        self.sampler = EvidenceSampler(process.pid, process.log_path)
        self.judge = StartupJudge(adapter, launch.extra.get("model_size_bytes"), stall_budget_s)
        self.observer = StartupObserver(adapter, tracker, self.sampler, self.judge)
        self.verdict: Verdict | None = None
        self.verdicts: list[Verdict] = []  # one per change of state, for the record
        self.stacks = StallStacks(process.pid, adapter, enabled=stacks, clock=clock)
        # the silent stretches (by their start) whose stacks were asked for, at half the budget and at the stall
        self._half_budget_for: float | None = None
        self._stall_for: float | None = None
        self._stall: tuple[float, Verdict] | None = None  # a stall being stopped: when, and its verdict

    def run(self) -> tuple[float, ProbeReading]:
        tailer = LogTailer(self.process.log_path, start_offset=self.process.log_offset)
        prober = Prober(self.launch.url, self.adapter.probe_path, self.adapter, self.clock)
        prober.start()
        last_key: tuple[Any, ...] | None = None
        last_update_s = float("-inf")
        last_sample_s = float("-inf")
        try:
            while True:
                now = self.clock()
                self.observer.feed(tailer.read_lines(), now)
                self.tracker.feed_partial(tailer.pending(), now)
                reading = prober.latest
                if reading is not None:
                    self.tracker.observe_probe(reading.state, reading.at_s)
                exited = self.process.poll() is not None
                if reading is not None and reading.state == "ready" and not exited:
                    # The answer came at reading.at_s; a line read later must not make the timeline go backwards.
                    ready_s = max(reading.at_s, self.tracker.current.start_s)
                    self.tracker.mark_ready(ready_s)
                    self._set_verdict(Verdict(state="ready", reason=f"{self.adapter.probe_path} answered "
                                                                    f"{reading.http_status}",
                                              evidence={"probe_status": reading.http_status}))
                    if self.on_update is not None:
                        self.on_update(self._status(self.clock(), "ready"))
                    return ready_s, reading
                if exited:
                    self.observer.feed(tailer.read_lines() + tailer.flush(), now)
                    self.tracker.close(now)
                    raise self._died(now)
                if now >= self.ready_timeout_s:
                    self.tracker.close(now)
                    raise self._timed_out(now)
                probe_state = reading.state if reading else "down"
                if now - last_sample_s >= self.sample_every_s:
                    last_sample_s = now
                    self._sample(now, probe_state)
                if self._stop_for_stall(now):
                    self.tracker.close(now)
                    raise self._stalled(now)
                status = self._status(now, probe_state)
                if self.on_update is not None and (status.key() != last_key or now - last_update_s >= UPDATE_EVERY_S):
                    self.on_update(status)
                    last_key, last_update_s = status.key(), now
                time.sleep(max(0.0, POLL_S - (self.clock() - now)))
        finally:
            prober.stop()
            tailer.close()

    # ---- evidence ----
    def _sample(self, now: float, probe: str) -> None:
        self.observer.sample(now, probe)
        current = self.tracker.current
        verdict = self.judge.verdict(now, phase=current.name, phase_start_s=current.start_s,
                                     progress=current.progress, probe=probe, ready_line_s=self.tracker.ready_line_s,
                                     last_line=self.tracker.last_line)
        self._set_verdict(self._ask_for_stacks(verdict, now))

    # ---- stacks ----
    def _silent_since(self, verdict: Verdict, now: float) -> float | None:
        """When the silence the verdict describes began: the judge's own last-moved time, unrounded. (The
        verdict's quiet_s is rounded to 0.1 s, and now minus it jitters by a tenth from sample to sample, which
        would make every sample a new silence and read the stacks again and again.)"""
        if not isinstance(verdict.evidence.get("quiet_s"), (int, float)) or not self.judge.last_moved:
            return None
        return max(self.judge.last_moved.values())

    def _stacks_of_this_silence(self, verdict: Verdict, now: float):
        """The latest stacks, if they were read during the silence the verdict describes."""
        since = self._silent_since(verdict, now)
        report = self.stacks.report
        if report is None or since is None or self.stacks.started_at is None or self.stacks.started_at < since:
            return None
        return report

    def _ask_for_stacks(self, verdict: Verdict, now: float) -> Verdict:
        """Stacks at half the budget of silence and at a stall; the verdict with them once they are read."""
        if not self.stacks.enabled:
            return verdict
        quiet, budget = verdict.evidence.get("quiet_s"), verdict.evidence.get("budget_s")
        since = self._silent_since(verdict, now)
        if verdict.state == "stalled":
            if since != self._stall_for and (self.stacks.request("stall") or self.stacks.in_flight):
                self._stall_for = since  # taken now, or the one in flight is this stall's
        elif (verdict.state in ("loading", "starting") and isinstance(quiet, (int, float))
              and isinstance(budget, (int, float)) and quiet >= budget / 2 and since != self._half_budget_for):
            if self.stacks.request("half the budget"):
                self._half_budget_for = since
        report = self._stacks_of_this_silence(verdict, now)
        if report is not None and verdict.state == "stalled":
            return with_stacks(verdict, report)
        if report is not None:
            named = verdict.model_copy(deep=True)
            named.evidence["stacks_summary"] = report.unavailable or report.summary
            return named
        return verdict

    def _stop_for_stall(self, now: float) -> bool:
        """A stall stops the engine once its stacks are read (or could not be within their deadline); the watch
        goes on meanwhile, and evidence that moves again calls the stop off."""
        if self.stall_action != "stop" or self.verdict is None or self.verdict.state != "stalled":
            self._stall = None
            return False
        if self._stall is None:
            self._stall = (now, self.verdict)
        started, _ = self._stall
        return not self.stacks.in_flight or now - started > STACKS_DEADLINE_S + 2.0

    def _set_verdict(self, verdict: Verdict) -> None:
        if self.verdict is None or self.verdict.state != verdict.state:
            self.verdicts.append(verdict)
        self.verdict = verdict

    def _status(self, now: float, probe: str) -> LaunchStatus:
        phase = self.tracker.current
        return LaunchStatus(elapsed_s=now, phase=phase.name, phase_elapsed_s=max(0.0, now - phase.start_s),
                            progress=phase.progress, detail=phase.detail, last_line=self.tracker.last_line,
                            probe=probe, pid=self.process.pid, verdict=self.verdict)

    # ---- failures ----
    def _failure_line(self, tail: list[str]) -> str | None:
        pattern = self.adapter.failure_lines
        if pattern is None:
            return None
        matches = [line for line in tail if pattern.search(line)]
        return matches[-1] if matches else None

    def _died(self, now: float) -> EngineFailed:
        process, tracker = self.process, self.tracker
        tail = process.log_tail(LOG_TAIL_LINES)
        how = process.describe_exit()
        message = (f"{self.adapter.title} {how} during start-up after {now:.1f} s (phase '{tracker.current.name}')"
                   + ("; last log lines:\n  " + "\n  ".join(tail) if tail else "; it wrote nothing to its log"))
        hint = OOM_HINT if process.exit_signal == "SIGKILL" else f"full log: {process.log_path}"
        failure = EngineFailed(message, hint, exit_code=process.returncode, log_tail=tail)
        verdict = crashed_verdict(process.returncode, tracker.current.name, tail, self._failure_line(tail))
        self._set_verdict(verdict)
        self._attach_result(failure, verdict)
        return failure

    def _stalled(self, now: float) -> EngineFailed:
        assert self.verdict is not None
        tail = self.process.log_tail(LOG_TAIL_LINES)
        declared_s, declared = self._stall or (now, self.verdict)
        verdict = declared.model_copy(deep=True)  # as it was when the stall was called
        report = self._stacks_of_this_silence(verdict, declared_s) if self.stacks.enabled else None
        if report is not None and "stacks" not in verdict.evidence:
            verdict = with_stacks(verdict, report)
        verdict.evidence["log_tail"] = tail
        verdict.evidence["stopped_by_servelab"] = True
        stack_lines = message_lines(report) if report is not None else []
        message = (f"{self.adapter.title} stalled after {declared_s:.1f} s and was stopped: {verdict.reason}"
                   + ("; its processes:\n  " + "\n  ".join(stack_lines) if stack_lines else "")
                   + ("; last log lines:\n  " + "\n  ".join(tail[-8:]) if tail else ""))
        hint = (f"if it is only slow, allow more with --stall-budget SECONDS or keep waiting with --stall-action "
                f"wait; `servelab doctor --pid PID --stacks` shows where a live one is stuck; full log: "
                f"{self.process.log_path}")
        failure = EngineFailed(message, hint, exit_code=None, log_tail=tail)
        self._attach_result(failure, verdict)
        return failure

    def _timed_out(self, now: float) -> EngineFailed:
        process, tracker = self.process, self.tracker
        tail = process.log_tail(LOG_TAIL_LINES)
        phase = tracker.current
        silent_s = now - tracker.last_line_s if tracker.last_line_s is not None else now
        message = (f"{self.adapter.title} was not ready after {self.ready_timeout_s:.0f} s: phase '{phase.name}' "
                   f"for {now - phase.start_s:.0f} s, log silent for {silent_s:.0f} s, probe "
                   f"{tracker.probe_state or 'down'}" + ("; last log lines:\n  " + "\n  ".join(tail) if tail else ""))
        moving = self.verdict is not None and self.verdict.state == "loading"
        # Evidence that still moves means slow (give it more time); none means it may be hung.
        hint = ("it was still making progress: a larger --ready-timeout may be all it needs" if moving
                else f"nothing was moving: it may be hung; full log: {process.log_path}")
        evidence: dict[str, Any] = dict(self.verdict.evidence) if self.verdict else {}
        evidence.update({"phase": phase.name, "log_silent_s": round(silent_s, 1), "probe": tracker.probe_state,
                         "log_tail": tail, "last_verdict": self.verdict.state if self.verdict else None})
        verdict = Verdict(state="stalled", reason=f"not ready after {self.ready_timeout_s:.0f} s", evidence=evidence)
        failure = EngineFailed(message, hint, exit_code=None, log_tail=tail)
        self._attach_result(failure, verdict)
        return failure

    def _attach_result(self, failure: EngineFailed, verdict: Verdict) -> None:
        """The failed launch as a record, for a run directory's summary."""
        failure.launch_result = LaunchResult(
            engine=self.adapter.name, url=self.launch.url, ready_s=None, phases=self.tracker.phases,
            verdict=verdict, log_path=str(self.process.log_path),
            lint=self.adapter.lint(EngineSpec(engine=self.adapter.name, model="-"), self.launch.command, None))
