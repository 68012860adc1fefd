"""When a load level stops sending, and what happens to the requests still in flight then.

A LevelControl is given to one closed-loop or open-loop level. The load mode asks it before every send
(`may_send`) and tells it about every send and every finished request; it decides, with the steady-state rule of
bench/steady.py, when the level has run long enough, and records why it stopped (`ended_by`) and where the
measurement window ends (`window_end_ns`):

- budget: a request budget (`--requests`) was spent: the window ends at the last send.
- steady: the level ran its duration and then until the rule held: the window ends at the earliest moment it
  held (closed loop) or at the last scheduled send (open loop).
- cap: the cap came first: the window ends at the cap (closed loop) or the last scheduled send (open loop); the
  requests still in flight `drain_grace_s` after the cap are cancelled and recorded as cancelled, their
  error_detail saying the cap ended them.
- failures: the first `give_up_after` requests all failed: the level ends early, whatever its duration.
- failing: most requests had failed when the duration ran out: the level is not extended.
- gone: `give_up_after` requests in a row could not connect (connection refused: the server died mid-level):
  the level ends at once, and the bench with it (bench/levels.py).
- stalled: the level's first requests reached the same deadline before anything else (STALL_AFTER in a row
  timed out before their first token, or went idle, and none succeeded): the server stopped answering. The level
  ends at once, the rest of it is not sent, and the bench stops with it (bench/levels.py): a request more would
  only wait out its deadline again (bench/loads/closed.py's single stream uses the same StallWatch).
- fd_limit: a request could not open a socket because the client ran out of file descriptors (EMFILE): the
  load asked for cannot be offered, so the level ends at once, and the bench with it.
Without a rule (a load mode used directly, as the tests do) a level ends at its duration or its budget, as
before, and nothing is ever cancelled.

Closed-loop workers back off after a failure (`Backoff`), so a server that refuses everything at once is not
hammered; after an HTTP 429 or 503 with Retry-After they wait at least that long (at most 600 s, and never past
the level's end).
"""

from __future__ import annotations

import asyncio
import bisect
import re
import time
from collections.abc import Sequence

from servelab.bench.steady import SteadyRule, e2e_s, earliest_end, holds
from servelab.records import RequestRecord

NS_PER_S = 1_000_000_000
TICK_S = 0.1  # after the duration, the rule is looked at this often even when no request finishes
STALL_AFTER = 2  # this many requests in a row reaching the same deadline, none succeeded: the server stopped
STALL_KINDS = {"timeout_first_byte": "first-byte", "timeout_idle": "idle"}
_DEADLINE_IS = re.compile(r"the deadline is ([0-9.]+) s")


class StallWatch:
    """Whether a server stopped answering: the first requests of a level (none succeeded yet) reached the same
    deadline (first byte, or idle) STALL_AFTER times in a row. Any other outcome breaks the run of them."""

    def __init__(self, after: int = STALL_AFTER):
        self.after = after
        self.ok = 0
        self.in_a_row = 0
        self.kind: str | None = None
        self.deadline_s: str | None = None
        self.not_sent = 0  # set by a load that stopped on it: the requests it did not send

    def see(self, record: RequestRecord) -> None:
        if record.error_kind == "cancelled":
            return
        if record.ok:
            self.ok += 1
            self.in_a_row, self.kind = 0, None
            return
        kind = record.error_kind
        if kind in STALL_KINDS and kind == self.kind:
            self.in_a_row += 1
        elif kind in STALL_KINDS:
            self.kind, self.in_a_row = kind, 1
        else:
            self.kind, self.in_a_row = None, 0
        if kind in STALL_KINDS:
            found = _DEADLINE_IS.search(record.error_detail or "")
            self.deadline_s = found.group(1) if found else None

    @property
    def stalled(self) -> bool:
        return self.ok == 0 and self.kind is not None and self.in_a_row >= self.after

    def reason(self, not_sent: int | None = None) -> str:
        name = STALL_KINDS.get(self.kind or "", "same")
        deadline = f" of {float(self.deadline_s):g} s" if self.deadline_s else ""
        text = f"the server stopped answering: {self.in_a_row} requests in a row reached the {name} deadline{deadline}"
        if not_sent:
            text += f"; the {not_sent:,} requests left were not sent"
        return text


class LevelControl:
    def __init__(self, rule: SteadyRule | None, *, duration_s: float | None, max_requests: int | None = None,
                 open_loop: bool = False):
        if duration_s is None and max_requests is None:
            raise ValueError("a level needs a duration, a request count, or both")
        self.rule, self.duration_s, self.max_requests, self.open_loop = rule, duration_s, max_requests, open_loop
        self.cap_s = rule.cap_s(duration_s) if rule is not None else None
        self.start_ns = 0
        self.deadline_ns: int | None = None
        self.cap_ns: int | None = None
        self.sent = 0
        self.last_send_ns: int | None = None
        self.done: list[tuple[int, float]] = []  # successful requests: (end ns, E2E s), in end order
        self.ok = 0
        self.failed = 0
        self.connect_failures_in_a_row = 0  # since the last request that connected
        self.fd_limit = 0  # requests that could not open a socket (EMFILE)
        self.cancelled_at_cap = 0
        self.stall = StallWatch()
        self.ended_by: str | None = None
        self.window_end_ns: int | None = None
        self._stop: asyncio.Event | None = None

    # ---- the level's life ----
    def begin(self, start_ns: int) -> None:
        self.start_ns = start_ns
        if self.duration_s is not None:
            self.deadline_ns = start_ns + int(self.duration_s * NS_PER_S)
        if self.cap_s is not None:
            self.cap_ns = start_ns + int(self.cap_s * NS_PER_S)
        self._stop = asyncio.Event()

    @property
    def ended(self) -> bool:
        return self.ended_by is not None

    def may_send(self, now_ns: int | None = None) -> bool:
        self.evaluate(time.perf_counter_ns() if now_ns is None else now_ns)
        return not self.ended

    def sending(self, t_ns: int) -> None:
        self.sent += 1
        # the latest send, even when a scheduled time is reported after a later actual one (open-loop
        # conversations): the window's end, and the tally's floor, never move back
        self.last_send_ns = t_ns if self.last_send_ns is None else max(self.last_send_ns, t_ns)

    def finished(self, record: RequestRecord) -> None:
        if record.ok:
            self.ok += 1
            e2e = e2e_s(record)
            if e2e is not None and record.t_end_ns is not None:
                bisect.insort(self.done, (record.t_end_ns, e2e))
        elif record.error_kind != "cancelled":
            self.failed += 1
        if record.error_kind == "connect":
            self.connect_failures_in_a_row += 1
        elif record.error_kind == "fd_limit":
            self.fd_limit += 1
        elif record.error_kind != "cancelled":
            self.connect_failures_in_a_row = 0
        self.stall.see(record)
        self.evaluate(time.perf_counter_ns())

    def stall_reason(self) -> str | None:
        """What a level that ended `stalled` says: the deadline its requests reached, and what was not sent."""
        if self.ended_by != "stalled":
            return None
        left = self.max_requests - self.sent if self.max_requests is not None else None
        return self.stall.reason(left)

    def window_floor_ns(self) -> int:
        """A time before which the window's end can no longer fall: the latest send (every way a level ends puts
        its window's end at or after it: the last send, a moment the rule held after it, the cap, or now), or
        the deadline when no rule runs (the window then ends there, and sends stop by it). A level's tally
        counts the token events before it at once, and keeps only the later ones until the window is known."""
        floor = self.last_send_ns if self.last_send_ns is not None else self.start_ns
        if self.rule is None and self.deadline_ns is not None and not self.open_loop:
            floor = min(floor, self.deadline_ns)
        if self.ended and self.window_end_ns is not None:
            floor = self.window_end_ns + 1  # known: events after it are outside; before it, inside
        return floor

    def window(self) -> tuple[int, int]:
        end = self.window_end_ns if self.window_end_ns is not None else (self.last_send_ns or self.start_ns)
        return self.start_ns, end

    # ---- the decision ----
    def evaluate(self, now_ns: int) -> None:
        if self.ended:
            return
        rule = self.rule
        if rule is not None and self.fd_limit:
            self._end("fd_limit", self._last_send_or(now_ns))
        elif rule is not None and self.connect_failures_in_a_row >= rule.give_up_after:
            self._end("gone", self._last_send_or(now_ns))
        elif rule is not None and self.stall.stalled:
            self._end("stalled", self._last_send_or(now_ns))
        elif rule is not None and self.ok == 0 and self.failed >= rule.give_up_after:
            self._end("failures", self._last_send_or(now_ns))
        elif self.max_requests is not None and self.sent >= self.max_requests:
            self._end("budget", self.last_send_ns or now_ns)
        elif self.deadline_ns is not None and now_ns >= self.deadline_ns:
            if rule is None:
                if not self.open_loop:  # an open loop without a rule ends with its schedule
                    self._end("duration", self.deadline_ns)
                return
            horizon = min(now_ns, self.cap_ns) if self.cap_ns is not None else now_ns
            steady_end = self._steady_end(horizon)
            if steady_end is not None:
                self._end("steady", steady_end)
            elif self.failed > self.ok:
                self._end("failing", self._last_send_or(now_ns))
            elif self.cap_ns is not None and now_ns >= self.cap_ns:
                self._end("cap", self._last_send_or(self.cap_ns))
        elif self.cap_ns is not None and now_ns >= self.cap_ns:  # a budget level with an explicit cap
            self._end("cap", self._last_send_or(self.cap_ns))

    def _last_send_or(self, t_ns: int) -> int:
        """Where the window ends when the level stops at `t_ns`: there (closed loop), or at the last scheduled
        send (open loop: its window is first .. last scheduled send)."""
        if self.open_loop:
            return self.last_send_ns if self.last_send_ns is not None else self.start_ns
        return t_ns

    def _steady_end(self, horizon_ns: int) -> int | None:
        assert self.rule is not None
        if self.open_loop:
            end = self.last_send_ns if self.last_send_ns is not None else self.start_ns
            inside = sorted(e for t, e in self.done if t <= end)
            return end if holds((end - self.start_ns) / NS_PER_S, inside, self.rule) else None
        lo = max(self.deadline_ns or self.start_ns, self.last_send_ns or self.start_ns)
        if lo > horizon_ns:
            return None
        return earliest_end(self.start_ns, lo, horizon_ns, self.done, self.rule)

    def _end(self, why: str, window_end_ns: int) -> None:
        self.ended_by, self.window_end_ns = why, window_end_ns
        if self._stop is not None:
            self._stop.set()

    def end_schedule(self) -> None:
        """An open-loop schedule ran out before anything else ended the level."""
        if self.ended:
            return
        if self.rule is not None and self.cap_ns is not None and self.duration_s is not None and \
                (self.max_requests is None or self.sent < self.max_requests):
            self._end("cap", self._last_send_or(self.cap_ns))
        else:
            self._end("budget" if self.max_requests is not None and self.sent >= self.max_requests else "schedule",
                      self.last_send_ns if self.last_send_ns is not None else self.start_ns)

    # ---- waiting ----
    async def watch(self) -> None:
        """Look at the rule from the duration on (and at the cap) even when no request finishes: a level whose
        requests are long, or whose workers are backing off, still ends on time."""
        first = self.deadline_ns if self.deadline_ns is not None else self.cap_ns
        if first is None or self.rule is None:
            return
        await asyncio.sleep(max(first - time.perf_counter_ns(), 0) / NS_PER_S)
        while not self.ended:
            self.evaluate(time.perf_counter_ns())
            if not self.ended:
                await asyncio.sleep(TICK_S)

    async def pause(self, delay_s: float) -> None:
        """Sleep `delay_s`, or less if the level ends meanwhile. Never less otherwise: uvloop's timers count whole
        milliseconds from the time its loop last looked at the clock, so one may fire a fraction of a millisecond
        early; the remainder is waited again (a think time of 10 ms is at least 10 ms)."""
        if delay_s <= 0 or self._stop is None:
            return
        due_ns = time.perf_counter_ns() + int(delay_s * NS_PER_S)
        while not self.ended:
            left_ns = due_ns - time.perf_counter_ns()
            if left_ns <= 0:
                return
            try:
                await asyncio.wait_for(self._stop.wait(), left_ns / NS_PER_S)
            except TimeoutError:
                pass

    async def drain(self, tasks: Sequence[asyncio.Task], client, recorder, measured: list[RequestRecord]) -> None:
        """Wait for the level's tasks. A level that ended normally lets its requests in flight finish (bounded by
        the client's deadlines); one that reached its cap cancels those still running `drain_grace_s` after it,
        and records them as cancelled by the cap."""
        if self.cap_ns is None or self.rule is None:
            await asyncio.gather(*tasks)
            return
        grace_end_ns = self.cap_ns + int(self.rule.drain_grace_s * NS_PER_S)
        done, pending = await asyncio.wait(tasks, timeout=max(grace_end_ns - time.perf_counter_ns(), 0) / NS_PER_S)
        if pending:
            self.evaluate(time.perf_counter_ns())
            if self.ended_by == "cap":
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                taken = recorder.add_cancelled(
                    client, measured, because=f"cancelled by the level's cap: still in flight "
                                              f"{self.rule.drain_grace_s:g} s after the {self.cap_s:g} s cap")
                self.cancelled_at_cap = len(taken)
            else:
                await asyncio.gather(*pending)
        for task in done:
            task.result()  # a worker's own exception (a bug) is not swallowed


class Backoff:
    """A closed-loop worker's wait after a failed request: `backoff_start_s`, doubling up to `backoff_max_s`,
    back to none after a success; at least the answer's Retry-After (HTTP 429 or 503) when it had one."""

    def __init__(self, rule: SteadyRule):
        self.rule = rule
        self.next_s = rule.backoff_start_s

    def after(self, record: RequestRecord) -> float:
        if record.ok or record.error_kind == "cancelled":
            self.next_s = self.rule.backoff_start_s
            return 0.0
        delay = self.next_s
        self.next_s = min(self.next_s * 2, self.rule.backoff_max_s)
        if record.retry_after_s is not None:
            delay = max(delay, record.retry_after_s)
        return delay
