"""Follow an engine's log as it grows and turn its lines into a start-up timeline.

Engine-agnostic: which lines start which phase comes from the adapter (`phases`, `ready_line`). Times are the
moments servelab *read* a line (seconds since launch), so they are as precise as the polling interval; engines do
not share a timestamp format worth parsing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import BinaryIO

from servelab.engines.base import EngineAdapter, PhasePattern
from servelab.lifecycle.supervisor import decode_lines
from servelab.records import Phase

_SEPARATORS = re.compile(rb"[\r\n]")
STARTING = "starting"  # the phase before the engine prints anything we recognize (interpreter start, imports)
READY = "ready"


class LogTailer:
    """Incremental reader of a log file that another process appends to.

    `read_lines()` returns the complete lines written since the last call, split on \\n and \\r (tqdm rewrites
    its line with \\r). A partial last line waits for its end. Like `tail -F` it survives the file being
    truncated in place (position past the end: start again at 0) and being rotated (the path names a new file:
    finish the old one, then read the new one from 0). A truncation followed by growth past the old position
    between two reads cannot be told from an append; at a 50 ms poll that window is small.
    """

    def __init__(self, path: Path, start_offset: int = 0, max_line_bytes: int = 64 * 1024):
        self.path = Path(path)
        self._start_offset = start_offset
        self._max_line_bytes = max_line_bytes  # a "line" without separators this long is emitted anyway
        self._fh: BinaryIO | None = None
        self._partial = b""
        self.restarts = 0  # how many times truncation or rotation made us start over

    def read_lines(self) -> list[str]:
        if self._fh is None and not self._open(self._start_offset):
            return []
        assert self._fh is not None
        if os.fstat(self._fh.fileno()).st_size < self._fh.tell():
            self._restart_same_file()
        lines = self._drain()
        if self._rotated():
            lines += self.flush()  # the old file is finished: its unterminated last line is a line
            self._fh.close()
            self._fh = None
            self.restarts += 1
            if self._open(0):
                lines += self._drain()
        return lines

    def flush(self) -> list[str]:
        """The partial last line, once the writer is known to be done (it exited)."""
        rest, self._partial = self._partial, b""
        return decode_lines([rest])

    def pending(self) -> str:
        """The unterminated last piece, without consuming it. tqdm writes `\r` + bar and ends that line only with
        the next update's `\r`, so for a slow bar (one shard a minute) the newest count is always here."""
        return self._partial.decode("utf-8", errors="replace").strip()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    # ---- internals ----
    def _open(self, offset: int) -> bool:
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            return False
        size = os.fstat(fh.fileno()).st_size
        fh.seek(offset if offset <= size else 0)  # shorter than where we were told to start: truncated
        self._fh = fh
        return True

    def _restart_same_file(self) -> None:
        assert self._fh is not None
        self._fh.seek(0)
        self._partial = b""
        self.restarts += 1

    def _rotated(self) -> bool:
        assert self._fh is not None
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return False  # moved away and not yet recreated: keep the old one
        mine = os.fstat(self._fh.fileno())
        return (now.st_ino, now.st_dev) != (mine.st_ino, mine.st_dev)

    def _drain(self) -> list[str]:
        assert self._fh is not None
        data = self._fh.read()
        if not data:
            return []
        parts = _SEPARATORS.split(self._partial + data)
        self._partial = parts.pop()
        if len(self._partial) > self._max_line_bytes:
            parts.append(self._partial)
            self._partial = b""
        return decode_lines(parts)


class PhaseTracker:
    """Builds the `list[Phase]` timeline from log lines and the readiness probe.

    Phases only move forward in the adapter's order: a line matching an earlier phase than the current one (a
    second tensor-parallel rank repeating what rank 0 said) is not a new phase. A line matching the current phase
    again updates its progress and detail (tqdm bars). The timeline ends with "ready" only when `mark_ready` is
    called, which the launcher does on the probe's word, never on a log line alone.
    """

    def __init__(self, adapter: EngineAdapter):
        self._patterns: list[PhasePattern] = list(adapter.phases)
        self._ready_line = adapter.ready_line
        self._rank: dict[str, int] = {}
        for i, pattern in enumerate(self._patterns):
            self._rank.setdefault(pattern.phase, i)  # two patterns may name one phase (old and new log formats)
        self._timeline: list[Phase] = [Phase(name=STARTING, start_s=0.0)]
        self.last_line: str | None = None
        self.last_line_s: float | None = None
        self.ready_line_s: float | None = None  # when the engine *said* it was ready
        self.probe_state: str | None = None
        self.port_answered_s: float | None = None  # first probe answer that was not "down"

    # ---- reading ----
    @property
    def current(self) -> Phase:
        return self._timeline[-1]

    @property
    def phases(self) -> list[Phase]:
        return [p.model_copy() for p in self._timeline]

    @property
    def ready(self) -> bool:
        return self.current.name == READY

    # ---- feeding ----
    def feed(self, line: str, t_s: float) -> bool:
        """Take one log line read at `t_s` seconds after launch. True when the phase, progress or detail changed."""
        if line.strip():
            self.last_line = line
            self.last_line_s = t_s
        if self._ready_line is not None and self.ready_line_s is None and self._ready_line.search(line):
            self.ready_line_s = t_s
        if self.ready:
            return False
        for pattern in self._patterns:
            match = pattern.regex.search(line)
            if match:
                return self._apply(pattern, match, t_s)
        return False

    def feed_partial(self, line: str, t_s: float) -> bool:
        """Take the unterminated piece at the end of the log for progress only: a bar's count can be read before
        its line ends (the patterns require the `[elapsed<remaining` that follows a complete count, so a bar
        cut mid-write is not misread). Starts no phase before its line is complete, except a progress phase."""
        if self.ready or not line:
            return False
        for pattern in self._patterns:
            if not pattern.progress:
                continue
            match = pattern.regex.search(line)
            if match:
                return self._apply(pattern, match, t_s)
        return False

    def observe_probe(self, state: str, t_s: float) -> None:
        self.probe_state = state
        if state != "down" and self.port_answered_s is None:
            self.port_answered_s = t_s

    def mark_ready(self, t_s: float) -> None:
        if not self.ready:
            self._start(Phase(name=READY, start_s=t_s, end_s=t_s), t_s)

    def close(self, t_s: float) -> None:
        """End the open phase (the engine died or start-up was abandoned)."""
        if self.current.end_s is None:
            self.current.end_s = t_s

    # ---- internals ----
    def _apply(self, pattern: PhasePattern, match: re.Match[str], t_s: float) -> bool:
        groups = match.groupdict()
        progress = _progress(groups) if pattern.progress else None
        detail = groups.get("detail")
        current = self.current
        if pattern.phase == current.name:
            before = (current.progress, current.detail)
            if progress is not None:
                current.progress = progress
            if detail:
                current.detail = detail
            return (current.progress, current.detail) != before
        if self._rank[pattern.phase] < self._rank.get(current.name, -1):
            return False  # an earlier phase again: a repeat from another rank, not a step back
        self._start(Phase(name=pattern.phase, start_s=t_s, progress=progress, detail=detail or None), t_s)
        return True

    def _start(self, phase: Phase, t_s: float) -> None:
        if self.current.end_s is None:
            self.current.end_s = t_s
        self._timeline.append(phase)


def _progress(groups: dict[str, str | None]) -> float | None:
    try:
        n, total = int(groups["n"] or ""), int(groups["total"] or "")
    except (KeyError, ValueError):
        return None
    if total <= 0:
        return None
    return min(1.0, max(0.0, n / total))
