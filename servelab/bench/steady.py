"""Steady state or no figure: when a load level ran long enough for its aggregate figures to mean something
(docs/metrics.md#steady-state). Pure functions of records and times; the load modes apply the rule while a level
runs (bench/loads/control.py), and the runner judges the finished level with the same rule.

The rule, for a closed-loop (concurrency) or open-loop (rate) level:
- its measurement window holds at least `min_completed` successful requests that ended inside it, and
- the window lasts at least `latency_multiple` x the E2E p50 of those requests.
A level with a duration runs at least that long, then on until the rule holds, but never past its cap
(`max_level_duration_s`; default max(4 x duration, 60 s)). A level bounded by a request budget sends exactly
its budget and the rule only decides whether its figures are measured. A level the cap ended (or a request
budget, or failures) before the rule held is *not measured*: its output tok/s, requests/s and goodput have no
value, with the reason instead, never a 0 for a window that simply finished no request.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from servelab.bench.figures import GPU_FIGURES, WITHHELD_KEYS
# The window rates (bench/figures.py): they mean nothing without a steady window, while per-request latencies stay
# (they are real measurements of the requests that finished). Pooled across trials by bench/trials.py.
from servelab.bench.figures import AGGREGATE_KEYS as AGGREGATE_KEYS
from servelab.bench.request_figures import NS_PER_S
from servelab.bench.sketch import percentile
from servelab.bench.tally import as_tally
from servelab.records import RequestRecord, SteadyState, Summary

KEEP_UP_FRACTION = 0.5  # open loop: completions in the window below this share of those due in it
KEEP_UP_MIN_DUE = 4  # fewer due than this: too few to say
TOLERANCE_S = 1e-6  # a window that ends where K x p50 is reached is long enough, whatever the float rounding


@dataclass(frozen=True)
class SteadyRule:
    min_completed: int = 10  # N: successful requests that ended inside the window
    latency_multiple: float = 3.0  # K: the window lasts at least K x E2E p50
    max_level_duration_s: float | None = None  # the cap (None: max(4 x duration, 60 s) for a timed level)
    drain_grace_s: float = 2.0  # at the cap, requests still in flight this long after it are cancelled
    give_up_after: int = 20  # M: a level whose first M finished requests all failed ends early
    backoff_start_s: float = 0.05  # closed loop: a worker's wait after a failure, doubling ...
    backoff_max_s: float = 2.0  # ... up to this; reset by a success

    def cap_s(self, duration_s: float | None) -> float | None:
        """The longest a level may run. A level bounded only by a request budget has no cap unless one is
        given: the budget is what the user asked for."""
        if self.max_level_duration_s is not None:
            return self.max_level_duration_s
        if duration_s is None:
            return None
        return max(4 * duration_s, 60.0)


def e2e_s(r: RequestRecord) -> float | None:
    return (r.t_end_ns - r.t_send_ns) / NS_PER_S if r.t_end_ns is not None else None


def holds(window_s: float, e2e_sorted_s: Sequence[float], rule: SteadyRule) -> bool:
    """The rule over a window of `window_s` seconds whose completed requests took `e2e_sorted_s` (ascending)."""
    return (len(e2e_sorted_s) >= rule.min_completed
            and window_s + TOLERANCE_S >= rule.latency_multiple * percentile(e2e_sorted_s, 50))


def earliest_end(start_ns: int, lo_ns: int, now_ns: int, done: Sequence[tuple[int, float]], rule: SteadyRule
                 ) -> int | None:
    """The earliest window end t in [lo_ns, now_ns] at which the rule held, or None.

    `done` lists (end time ns, E2E s) of the successful requests so far, in end order. Between two completions the
    set of completed requests (hence their E2E p50) is fixed and the window only grows, so within each such
    stretch the rule first holds at max(stretch start, start + K x p50)."""
    ends = [t for t, _ in done]
    inside = sum(1 for t in ends if t <= lo_ns)
    stretch_start = lo_ns
    while True:
        next_end = ends[inside] if inside < len(ends) else None
        stretch_end = min(next_end, now_ns) if next_end is not None else now_ns
        if inside >= rule.min_completed:
            p50 = percentile(sorted(e for _, e in done[:inside]), 50)
            t = max(stretch_start, start_ns + math.ceil(rule.latency_multiple * p50 * NS_PER_S))
            if t <= stretch_end:
                return t
        if next_end is None or next_end > now_ns:
            return None
        inside += 1
        stretch_start = next_end


def judge(records, window: tuple[int, int], rule: SteadyRule, *, ended_by: str | None,
          cap_s: float | None = None, rate: float | None = None, budget: int | None = None,
          stall_reason: str | None = None) -> SteadyState:
    """Whether a finished level reached a steady state. `ended_by` says what stopped it sending: "steady" (the
    rule held after its duration), "budget", "schedule", "cap", "failures" (its first requests all failed),
    "failing" (most had failed when its duration ran out), "gone" (connections refused in a row), "fd_limit"
    (the client ran out of file descriptors), "stalled" (the server stopped answering: `stall_reason` says how),
    "duration" (no rule applied), "interrupted"."""
    tally = as_tally(records)
    ok, failed = tally.ok, tally.failed
    ws, we = window
    window_s = max(we - ws, 0) / NS_PER_S
    done = list(tally.ok_e2e_s())
    inside = sorted(e for t, e in done if ws <= t <= we)
    every = sorted(e for _, e in done)
    p50 = percentile(inside or every, 50) if (inside or every) else None
    capped = ended_by == "cap"
    measured = holds(window_s, inside, rule) and ended_by not in ("cap", "failures", "failing", "gone", "fd_limit",
                                                                      "stalled")
    steady = SteadyState(measured=measured, completed_in_window=len(inside), min_completed=rule.min_completed,
                         latency_multiple=rule.latency_multiple, e2e_p50_s=p50, window_s=window_s,
                         ended_by=ended_by, capped=capped, cap_s=cap_s)
    if rate is not None and window_s > 0:
        completed_rate = len(inside) / window_s
        steady.offered_rate = rate
        steady.completed_rate = completed_rate
        # Completions lag sends by a latency, so they are set against the requests sent early enough to finish
        # inside the window had each taken the level's shortest E2E (its service time without a queue).
        if every:
            due = sum(1 for t in tally.t_send if t + every[0] * NS_PER_S <= we)
            if due >= KEEP_UP_MIN_DUE:
                steady.kept_up = len(inside) >= KEEP_UP_FRACTION * due
    if measured:
        return steady
    stopped = {"failures": f"the first {rule.give_up_after} requests all failed, so the level stopped early",
               "failing": "most requests had failed when its duration ran out, so it was not extended",
               "gone": f"{rule.give_up_after} requests in a row could not connect (the server is gone?), so the "
                       f"level stopped early",
               "fd_limit": "the client ran out of file descriptors (`ulimit -n`), so the level stopped early: the "
                           "load asked for could not be offered",
               "stalled": f"{stall_reason or 'the server stopped answering'}, so the level stopped early"}
    if ended_by in ("gone", "fd_limit", "stalled"):
        reason = f"{stopped[ended_by]} ({ok} succeeded, {failed} failed)"
    elif not ok and failed:
        reason = f"no request succeeded ({failed} failed)"
        if ended_by in stopped:
            reason += f": {stopped[ended_by]}"
    else:
        latency = (f"E2E p50 {p50:.1f} s" if p50 is not None
                   else f"none finished within {window_s:.1f} s" if window_s > 0 else "none finished")
        reason = f"too short for steady state ({len(inside)} requests in the window, {latency})"
        needs = (f"needs at least {rule.min_completed} completed in a window of at least "
                 f"{rule.latency_multiple:g}x E2E p50")
        if capped and cap_s is not None:
            reason += f": {needs}; the level's {cap_s:g} s cap ended it first"
        elif ended_by == "budget" and budget is not None:
            reason += f": {needs}; the budget of {budget} requests was spent first"
        elif ended_by in stopped:
            reason += f": {needs}; {stopped[ended_by]}"
        else:
            reason += f": {needs}"
    if steady.kept_up is False:
        reason += "; " + keep_up_note(steady)
    steady.reason = reason
    return steady


def keep_up_note(steady: SteadyState) -> str:
    return (f"the server did not keep up: offered {steady.offered_rate:g} req/s, completed "
            f"{steady.completed_rate:.2g} req/s in the window")


def apply(summary: Summary, steady: SteadyState) -> None:
    """Attach the judgement to the level; when it is not measured, withhold its aggregate figures."""
    summary.steady = steady
    if steady.measured:
        if steady.kept_up is False:
            summary.warnings.append(keep_up_note(steady))
    elif summary.ok:
        summary.warnings.append(f"not measured: {steady.reason}; the latency figures describe the {summary.ok} "
                                f"requests that finished, not a steady state")
    else:
        summary.warnings.append(f"not measured: {steady.reason}")
    withhold(summary)


def withhold(summary: Summary) -> None:
    """Blank the aggregate figures of a level that is not measured (again after figures were added to it)."""
    if summary.steady is None or summary.steady.measured:
        return
    for key in WITHHELD_KEYS + GPU_PER_TOKEN_KEYS:
        fig = summary.figures.get(key)
        if fig is not None:
            fig.value = None
            fig.note = f"not measured: {summary.steady.reason}"
    gpu = summary.gpu
    if gpu is not None and gpu.measured:  # the tokens it divides by are those output tok/s counts: none
        gpu.output_tokens = gpu.answer_tokens = None
        gpu.j_per_output_token = gpu.j_per_answer_token = gpu.output_tokens_per_j = None


# The GPU figures per token (J/token, tok/J) divide by the tokens output tok/s counts: withheld with it, whichever
# of the GPU figures and the level's judgement came first.
GPU_PER_TOKEN_KEYS: tuple[str, ...] = tuple(f.key for f in GPU_FIGURES if f.counts_tokens)


def is_measured(summary: Summary) -> bool:
    """Levels written before the rule existed (steady None) count as measured, as they were read then."""
    return summary.steady is None or summary.steady.measured
