"""What `bench` shows while it runs: the level now running (or the warm-up), how long it has run and how long it
is meant to, its requests and tokens so far, how busy the client itself is (its CPU: the headroom left before
the client, not the server, limits what is measured) and, where servelab knows the engine's processes, the
engine's CPU beside it.

Live in a terminal (refreshed every second, whether or not a request finished), and as one plain line every
`every_s` seconds when the output is a pipe or a file (CI logs), so a long soak is never silent.

The counts come from the records as they finish (`add`, called for every record), the level's start and plan
from the runner (`begin`, bench/runner.py begin_level and warm_up), and the CPU from psutil, sampled by the
printing thread. Nothing here touches the event loop that times the requests.

The client is this process and its descendants (the --workers processes) less the engine's process trees: under
`servelab run` the engine servelab launched is a child too, and its threads are not the client's. The engine's
roots come from the launcher (`engine_pids`) or from the bench's environment sampler (`watch_engine`, given
what it found listening on the URL's port); each process's CPU is counted by its own difference between two
looks, so a process that exits or appears between them never makes the total jump.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable

NS_PER_S = 1_000_000_000
PIPE_PROGRESS_S = 10.0  # into a pipe or a file: a line this often


class LevelProgress:
    def __init__(self, engine_pids: Iterable[int] = ()) -> None:
        self.tag, self.n, self.failed, self.tokens = "", 0, 0, 0
        self.items: int | None = None  # non-streamed requests (embeddings, rerank): their inputs or documents
        self.label: str | None = None  # shown instead of the tag (the warm-up: "warming up: 8 concurrent + 1")
        self.started: float | None = None  # time.monotonic() when the level began
        self.planned_s: float | None = None  # the level's duration (it may run on until steady, to its cap)
        self.cap_s: float | None = None
        self.planned_requests: int | None = None
        self.cpu: float | None = None  # the client's CPU over the last interval, in cores
        self.engine_cpu: float | None = None  # the engine's, where its processes are known
        self._lock = threading.Lock()
        self._me = os.getpid()
        self._engine_roots: list[int] = []
        self._cpu_last: dict[int, float] = {}  # pid -> CPU seconds at the last look
        self._last: tuple[float, float] | None = None  # (monotonic, wall) of the last look
        self.watch_engine(engine_pids)

    def watch_engine(self, pids: Iterable[int]) -> None:
        """These processes (and their descendants) are the engine's: their CPU is shown as the engine's, never as
        the client's. This process itself is never the engine's (an engine in this process is the client's)."""
        with self._lock:
            for pid in pids:
                pid = int(pid)
                if pid != self._me and pid not in self._engine_roots:
                    self._engine_roots.append(pid)

    # ---- fed by the runner and the records ----
    def begin(self, tag: str, planned_s: float | None = None, cap_s: float | None = None,
              planned_requests: int | None = None, warmup: str | None = None) -> None:
        """A level (or, with `warmup`, its description, the warm-up) begins: count afresh."""
        with self._lock:
            self.tag, self.n, self.failed, self.tokens, self.items = tag, 0, 0, 0, None
            self.label = f"warming up: {warmup}" if warmup else None
            self.started = time.monotonic()
            self.planned_s, self.cap_s, self.planned_requests = planned_s, cap_s, planned_requests

    def add(self, record) -> str:
        with self._lock:
            # A level the runner did not announce: count it afresh (a warm-up record counts to the warm-up).
            if record.tag != self.tag and not (record.warmup and self.label):
                self.tag, self.n, self.failed, self.tokens, self.label = record.tag, 0, 0, 0, None
                self.items = None
                self.started, self.planned_s, self.cap_s, self.planned_requests = time.monotonic(), None, None, None
            self.n += 1
            self.failed += 0 if record.ok or record.error_kind == "cancelled" else 1
            self.tokens += record.output_tokens
            if not record.stream:  # no tokens to count: the items it carried
                self.items = (self.items or 0) + ((record.items or 0) if record.ok else 0)
            return self._line()

    # ---- read ----
    def line(self) -> str:
        with self._lock:
            return self._line()

    def _line(self) -> str:
        parts = [self.label or self.tag or "starting"]
        if self.started is not None:
            elapsed = time.monotonic() - self.started
            when = f"{_clock(elapsed)}"
            if self.planned_s:
                if elapsed <= self.planned_s:
                    when += f" of {_clock(self.planned_s)} ({_clock(self.planned_s - elapsed)} left)"
                else:
                    cap = f", cap {_clock(self.cap_s)}" if self.cap_s else ""
                    when += f", past its {_clock(self.planned_s)}: running on until steady{cap}"
            parts.append(when)
        failed = f" ({self.failed:,} failed)" if self.failed else ""
        of = f"/{self.planned_requests:,}" if self.planned_requests else ""
        parts.append(f"{self.n:,}{of} request{'' if self.n == 1 and not of else 's'}{failed}")
        count, what = (self.items, "items") if self.items is not None else (self.tokens, "tokens")
        rate = ""
        if self.started is not None and count:
            elapsed = time.monotonic() - self.started
            if elapsed > 0:
                rate = f" ({count / elapsed:,.0f}/s)"
        parts.append(f"{count:,} {what}{rate}")
        if self.cpu is not None:
            parts.append(f"client CPU {self.cpu:.0%} of a core")
        if self.engine_cpu is not None:
            parts.append(f"engine CPU {self.engine_cpu:.0%}")
        return " · ".join(parts)

    def _sample_cpu(self) -> None:
        """The client's CPU (this process and its descendants but the engine's trees) and the engine's (its
        trees) since the last look, in cores."""
        try:
            import psutil

            now, wall = time.monotonic(), time.time()
            with self._lock:
                roots = list(self._engine_roots)
            client, engine = _trees(psutil, self._me, roots)
            first, last = self._last is None, self._last
            client_s = engine_s = 0.0
            seen: dict[int, float] = {}
            for pids, is_engine in ((client, False), (engine, True)):
                for pid in pids:
                    with contextlib.suppress(psutil.Error, OSError):
                        proc = psutil.Process(pid)
                        t = proc.cpu_times()
                        used = seen[pid] = t.user + t.system
                        before = self._cpu_last.get(pid)
                        if before is None:  # new since the last look: all of it if it was born since, else none
                            before = 0.0 if last is not None and proc.create_time() >= last[1] else used
                        if is_engine:
                            engine_s += max(used - before, 0.0)
                        else:
                            client_s += max(used - before, 0.0)
            self._cpu_last, self._last = seen, (now, wall)
            if not first and now > last[0]:
                self.cpu = client_s / (now - last[0])
                self.engine_cpu = engine_s / (now - last[0]) if roots else None
        except Exception:
            self.cpu = self.engine_cpu = None

    # ---- showing it ----
    def printing(self, ui, every_s: float | None, status=None):
        """A context in which a thread refreshes `status` (a rich Status, in a terminal) every second, and, when
        `every_s` is given (a pipe), prints the line every `every_s` seconds."""

        @contextlib.contextmanager
        def run():
            stop = threading.Event()

            def loop() -> None:
                next_print = time.monotonic() + (every_s or 0)
                while not stop.wait(1.0):
                    self._sample_cpu()
                    line = self.line()
                    if status is not None:
                        with contextlib.suppress(Exception):
                            status.update(line)
                    if every_s is not None and time.monotonic() >= next_print:
                        next_print += every_s
                        ui.print(line, highlight=False, markup=False)

            thread = threading.Thread(target=loop, name="bench-progress", daemon=True)
            thread.start()
            try:
                yield
            finally:
                stop.set()
                thread.join(timeout=2)
        return run()


def _trees(psutil, me: int, engine_roots: list[int]) -> tuple[set[int], set[int]]:
    """(the client's pids: `me` and its descendants outside the engine's trees, the engine's: `engine_roots` and
    their descendants), from one look at every process's parent."""
    children: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info.get("ppid")
        if ppid is not None:
            children.setdefault(ppid, []).append(proc.pid)

    def tree(roots, stop: set[int]) -> set[int]:
        found: set[int] = set()
        todo = [r for r in roots if r not in stop]
        while todo:
            pid = todo.pop()
            if pid not in found and pid not in stop:
                found.add(pid)
                todo.extend(children.get(pid, ()))
        return found

    engine = tree(engine_roots, {me})
    return tree([me], engine), engine


def _clock(seconds: float | None) -> str:
    """12 s, 4 min 05 s, 1 h 02 min."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"
