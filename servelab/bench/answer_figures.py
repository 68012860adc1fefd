"""Tool-call and structured-output figures of one load level, as a pure function of small per-request rows
(definitions: docs/metrics.md#tool-calls and #structured-output).

A row is what one successful request that declared tools (ToolRow) or asked for a response format (its verdict,
a bool) tells; the level's tally keeps one per such request (bench/tally.py), and a level without any has none of
these figures: absent, never 0.

Figures:
- tool_first_ms: send to the first event that carried a tool_calls piece, over the requests that made a call;
- tool_call_ms: send to the finish_reason that completed the calls (the stream's end without one), same requests;
- tool_call_share: requests that made at least one call ÷ requests that declared tools;
- tool_parse_share: of the requests that made a call, those whose every call's arguments parse as a JSON object;
- tool_valid_share: of the same, those whose every call also names a declared tool and validates against its
  parameters schema;
- schema_valid_share: answers that validate (json_schema) or are a JSON object (json_object) ÷ requests that asked
  for a response format.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from servelab.bench.figures import FIGURES
from servelab.bench.request_figures import tool_call_ns, tool_first_ns
from servelab.bench.sketch import distribution
from servelab.records import Figure, RequestRecord

NS_PER_MS = 1_000_000


class ToolRow(NamedTuple):
    called: bool  # at least one tool call came
    first_ms: float | None  # send to the first tool_calls piece
    done_ms: float | None  # send to the finish_reason that completed the calls
    parse: bool  # every call's arguments parse as a JSON object
    valid: bool  # ... and name a declared tool and validate against its parameters


def tool_row(r: RequestRecord) -> ToolRow:
    """The row of one successful request that declared tools (its `tool_calls` is a list)."""
    # a request whose pieces could not be placed made calls that do not parse (tool_calls_parse False), not none
    called = bool(r.tool_calls) or r.tool_calls_parse is False
    return ToolRow(called, _ms(tool_first_ns(r)), _ms(tool_call_ns(r)), bool(r.tool_calls_parse),
                   bool(r.tool_calls_valid))


def answer_figures(tool_rows: Iterable[ToolRow], schema_verdicts: Iterable[bool]) -> dict[str, Figure]:
    rows = list(tool_rows)
    verdicts = list(schema_verdicts)
    out: dict[str, Figure] = {}
    if rows:
        called = [r for r in rows if r.called]
        declared = f"{len(rows)} requests declared tools, {len(called)} made a call"
        for key, values in (("tool_first_ms", [r.first_ms for r in called if r.first_ms is not None]),
                            ("tool_call_ms", [r.done_ms for r in called if r.done_ms is not None])):
            dist = distribution(values)
            if dist is not None:
                out[key] = FIGURES[key].make(dist.p50, dist=dist, note=declared)
        out["tool_call_share"] = FIGURES["tool_call_share"].make(len(called) / len(rows), note=declared)
        if called:
            for key, field in (("tool_parse_share", "parse"), ("tool_valid_share", "valid")):
                good = sum(1 for r in called if getattr(r, field))
                out[key] = FIGURES[key].make(good / len(called), note=f"{good} of {len(called)} requests that "
                                                                      f"made a call")
    if verdicts:
        good = sum(verdicts)
        out["schema_valid_share"] = FIGURES["schema_valid_share"].make(
            good / len(verdicts), note=f"{good} of {len(verdicts)} answers that asked for a response format")
    return out


def _ms(ns: int | None) -> float | None:
    return ns / NS_PER_MS if ns is not None else None
