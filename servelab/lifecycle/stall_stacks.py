"""Stacks for a start-up that has gone quiet: read in the background while the watch goes on, named in its verdict.

`up` (lifecycle/launch.py) asks for the engine's stacks (lifecycle/stacks/) when a phase has been silent for half
its budget and again when it calls a stall. Reading them takes seconds (a few py-spy samples of every process of
the tree), so it runs on a thread of its own: the watch keeps probing and sampling meanwhile, and a stall waits for
the capture to end before it stops the engine, so the verdict can say what the stacks showed ("8 of 8 ranks
loading weights ..., stacks unchanged for 2.0 s"). At most one capture is in flight, and a new one starts only
MIN_GAP_S after the last one ended: an engine that stays quiet is not sampled without end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from servelab.records import StackReport, Verdict

SAMPLES = 3
INTERVAL_S = 1.0  # three samples two seconds apart in all: long enough to see a stack that moves
DEADLINE_S = 8.0  # the capture's own deadline (read_stacks never runs past it)
MIN_GAP_S = 2.0
LINES_IN_MESSAGE = 6  # per-process lines a stall message shows; the verdict's evidence keeps them all


def _default_reader(pid: int, adapter: Any) -> StackReport:
    from servelab.lifecycle.stacks import read_stacks

    return read_stacks(pid, adapter, samples=SAMPLES, interval_s=INTERVAL_S, deadline_s=DEADLINE_S)


class StallStacks:
    """The engine's stacks, captured on request off the caller's thread."""

    def __init__(self, pid: int, adapter: Any, enabled: bool = True,
                 reader: Callable[[int, Any], StackReport] | None = None, clock: Callable[[], float] = time.monotonic):
        self.pid, self.adapter, self.enabled = pid, adapter, enabled
        self._reader = reader or _default_reader
        self._clock = clock
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ended_at = float("-inf")
        self.report: StackReport | None = None  # the latest finished capture
        self.reason: str | None = None  # why it was taken: "half the budget", "stall"
        self.started_at: float | None = None  # when the latest finished capture began (on `clock`)
        self.captures = 0

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def request(self, reason: str) -> bool:
        """Start a capture unless one is in flight or one ended under MIN_GAP_S ago; whether one started."""
        if not self.enabled:
            return False
        with self._lock:
            if self.in_flight or self._clock() - self._ended_at < MIN_GAP_S:
                return False
            self.captures += 1
            self._thread = threading.Thread(target=self._capture, args=(reason, self._clock()),
                                            name="servelab-stacks", daemon=True)
            self._thread.start()
            return True

    def _capture(self, reason: str, started_at: float) -> None:
        try:
            report = self._reader(self.pid, self.adapter)
        except Exception as exc:  # read_stacks does not raise; a reader of ours that does must not kill the watch
            report = StackReport(unavailable=f"stacks could not be read: {type(exc).__name__}",
                                 summary="stacks could not be read")
        with self._lock:
            self.report, self.reason, self.started_at = report, reason, started_at
            self._ended_at = self._clock()

    def wait(self, timeout_s: float) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)


def summary_of(report: StackReport) -> str:
    return f"stacks: {report.unavailable}" if report.unavailable else f"stacks: {report.summary}"


def with_stacks(verdict: Verdict, report: StackReport) -> Verdict:
    """The verdict whose reason ends with what the stacks showed and whose evidence holds the report."""
    named = verdict.model_copy(deep=True)
    named.reason = f"{verdict.reason}; {summary_of(report)}"
    named.evidence["stacks"] = report.model_dump(mode="json", exclude={"raw"})
    return named


def message_lines(report: StackReport) -> list[str]:
    """A few per-process lines for a stall message: the ranks' first (their disagreement is the story)."""
    if report.unavailable:
        return []
    ranks_first = sorted(report.processes, key=lambda p: 0 if p.role and "TP" in p.role else 1)
    lines = [p.line for p in ranks_first if p.line]
    if len(lines) <= LINES_IN_MESSAGE:
        return lines
    return lines[:LINES_IN_MESSAGE] + [f"... {len(lines) - LINES_IN_MESSAGE} more processes (in the verdict's "
                                       f"evidence)"]
