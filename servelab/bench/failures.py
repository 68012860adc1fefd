"""Failing loudly: which errors a level met and how often, and the gate that turns a broken level into exit code 1
(docs/metrics.md#errors). Pure functions of records and summaries."""

from __future__ import annotations

from collections.abc import Sequence

from servelab.bench.tally import LevelTally
from servelab.records import ErrorCount, RequestRecord, Summary

TOP_ERRORS = 5


def top_errors(records: Sequence[RequestRecord], limit: int = TOP_ERRORS) -> list[ErrorCount]:
    """The most common failures among `records` (cancelled requests are no failures), most frequent first.
    Requests are grouped by error kind, HTTP status and detail with its numbers masked (a timeout's detail names
    how long it waited: bench/request_figures.py error_key); each group keeps the first request's detail as its
    excerpt."""
    tally = records if isinstance(records, LevelTally) else LevelTally.from_records(records)
    return tally.top_errors(limit)


def error_line(e: ErrorCount, width: int = 160) -> str:
    """`2,279 × HTTP 501: Unsupported method ('POST')`: the count, then the detail (which names the status for an
    HTTP error), or the kind when the detail does not say it."""
    detail = e.detail or ""
    if e.kind != "http" and not detail.startswith(e.kind):
        detail = f"{e.kind}: {detail}" if detail else e.kind
    if len(detail) > width:
        detail = detail[:width - 1] + "…"
    return f"{e.count:,} × {detail}"


def error_rate(level: Summary) -> float | None:
    """Failed over finished requests (ok + failed; cancelled ones are neither)."""
    finished = level.ok + level.failed
    return level.failed / finished if finished else None


def error_gate(levels: Sequence[Summary], max_error_rate: float | None = None) -> list[str]:
    """Why a bench failed its error gate, one reason per level that broke it (empty: it passed).

    Without `max_error_rate`, a level breaks the gate when every request it finished failed; with it, when the
    share of failed requests is above that fraction (0 tolerates none). Whatever the fraction, a level breaks it
    when the client ran out of file descriptors (the load asked for was never offered) or when the server stopped
    accepting connections during it."""
    reasons: list[str] = []
    for level in levels:
        rate = error_rate(level)
        if rate is None or level.failed == 0:
            continue
        ended_by = level.steady.ended_by if level.steady is not None else None
        if level.errors.get("fd_limit"):
            reasons.append(f"{level.tag}: {level.errors['fd_limit']:,} requests could not open a socket: the client "
                           f"ran out of file descriptors (`ulimit -n`), so the load asked for was not offered")
        elif ended_by == "stalled" and level.steady is not None:
            reasons.append(f"{level.tag}: {level.steady.reason}")
        elif ended_by == "gone":
            reasons.append(f"{level.tag}: the server stopped accepting connections ({level.failed:,} of "
                           f"{level.ok + level.failed:,} requests failed)")
        elif max_error_rate is None:
            if level.ok == 0:
                reasons.append(f"{level.tag}: every request failed ({level.failed:,} of {level.failed:,})")
        elif rate > max_error_rate:
            reasons.append(f"{level.tag}: {level.failed:,} of {level.ok + level.failed:,} requests failed "
                           f"({rate:.0%}), above --max-error-rate {max_error_rate:g}")
    return reasons
