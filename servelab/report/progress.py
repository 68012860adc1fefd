"""What `bench` shows while it runs: the level now running, how long it has run and how long it is meant to, its
requests and tokens so far, and how busy the client itself is (its CPU: the headroom left before the client,
not the server, limits what is measured).

Live in a terminal (refreshed every second, whether or not a request finished), and as one plain line every
`every_s` seconds when the output is a pipe or a file (CI logs), so a long soak is never silent.

The counts come from the records as they finish (`add`, called for every record), the level's start and plan
from the runner (`begin`, bench/runner.py begin_level), and the CPU from psutil, sampled by the printing thread.
Nothing here touches the event loop that times the requests.
"""

from __future__ import annotations

import contextlib
import threading
import time

NS_PER_S = 1_000_000_000
PIPE_PROGRESS_S = 10.0  # into a pipe or a file: a line this often


class LevelProgress:
    def __init__(self) -> None:
        self.tag, self.n, self.failed, self.tokens = "", 0, 0, 0
        self.started: float | None = None  # time.monotonic() when the level began
        self.planned_s: float | None = None  # the level's duration (it may run on until steady, to its cap)
        self.cap_s: float | None = None
        self.planned_requests: int | None = None
        self.cpu: float | None = None  # the client's CPU over the last interval, in cores
        self._lock = threading.Lock()
        self._process = None

    # ---- fed by the runner and the records ----
    def begin(self, tag: str, planned_s: float | None = None, cap_s: float | None = None,
              planned_requests: int | None = None) -> None:
        with self._lock:
            self.tag, self.n, self.failed, self.tokens = tag, 0, 0, 0
            self.started = time.monotonic()
            self.planned_s, self.cap_s, self.planned_requests = planned_s, cap_s, planned_requests

    def add(self, record) -> str:
        with self._lock:
            if record.tag != self.tag:  # a level the runner did not announce (warm-up): count it afresh
                self.tag, self.n, self.failed, self.tokens = record.tag, 0, 0, 0
                self.started, self.planned_s, self.cap_s, self.planned_requests = time.monotonic(), None, None, None
            self.n += 1
            self.failed += 0 if record.ok or record.error_kind == "cancelled" else 1
            self.tokens += record.output_tokens
            return self._line()

    # ---- read ----
    def line(self) -> str:
        with self._lock:
            return self._line()

    def _line(self) -> str:
        parts = [self.tag or "starting"]
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
        rate = ""
        if self.started is not None and self.tokens:
            elapsed = time.monotonic() - self.started
            if elapsed > 0:
                rate = f" ({self.tokens / elapsed:,.0f}/s)"
        parts.append(f"{self.tokens:,} tokens{rate}")
        if self.cpu is not None:
            parts.append(f"client CPU {self.cpu:.0%} of a core")
        return " · ".join(parts)

    def _sample_cpu(self) -> None:
        """The client's CPU (this process and its children: --workers) since the last sample, in cores."""
        try:
            import psutil

            if self._process is None:
                self._process = psutil.Process()
                self._last = (time.monotonic(), self._cpu_seconds())
                return
            now, used = time.monotonic(), self._cpu_seconds()
            then, before = self._last
            self._last = (now, used)
            if now > then:
                self.cpu = max(used - before, 0.0) / (now - then)
        except Exception:
            self.cpu = None

    def _cpu_seconds(self) -> float:
        total = 0.0
        for p in [self._process, *self._process.children(recursive=True)]:
            with contextlib.suppress(Exception):
                t = p.cpu_times()
                total += t.user + t.system
        return total

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
