"""What one request's record says on its own: its latencies, token gaps, token counts, failure group and whether it
met latency targets (definitions: docs/metrics.md#per-request-quantities).

Pure functions of one RequestRecord, below everything that folds many of them: the level's tally
(bench/tally.py), its figures (bench/metrics.py), the SLO judgement (bench/slo.py), the failure groups
(bench/failures.py) and the cache rows (bench/cache_figures.py) all use these, so each quantity is defined once and
none of those modules needs another's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from servelab.bench.sketch import percentile
from servelab.protocol.dialects import dialect_for
from servelab.records import RequestRecord

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def token_events(r: RequestRecord) -> list[tuple[int, int]]:
    """(time, tokens) of the events that carried at least one token, in arrival order."""
    return [(e.t_ns, e.tokens) for e in r.events if e.tokens > 0]


def ttft_ns(r: RequestRecord) -> int | None:
    """Time to first token of any kind (reasoning included)."""
    ev = token_events(r)
    return ev[0][0] - r.t_send_ns if ev else None


def ttfo_ns(r: RequestRecord) -> int | None:
    """Time to first answer (non-reasoning) token."""
    for e in r.events:
        if e.tokens > 0 and e.kind == "answer":
            return e.t_ns - r.t_send_ns
    return None


def e2e_ns(r: RequestRecord) -> int | None:
    return r.t_end_ns - r.t_send_ns if r.t_end_ns is not None else None


def tool_first_ns(r: RequestRecord) -> int | None:
    """Time to the first tool-call token: the first event that carried a tool_calls piece (docs/metrics.md#tool-first)."""
    return r.t_first_tool_ns - r.t_send_ns if r.t_first_tool_ns is not None else None


def tool_call_ns(r: RequestRecord) -> int | None:
    """Time to a complete call: the finish_reason that completed the request's calls (docs/metrics.md#tool-call)."""
    return r.t_tool_done_ns - r.t_send_ns if r.t_tool_done_ns is not None else None


def decode_span(r: RequestRecord) -> tuple[int, int] | None:
    """(tokens after the first event, ns from the first to the last token event), or None if undefined."""
    ev = token_events(r)
    if len(ev) < 2:
        return None
    tokens = sum(t for _, t in ev[1:])
    span = ev[-1][0] - ev[0][0]
    return (tokens, span) if tokens > 0 and span > 0 else None


def decode_tok_s(r: RequestRecord) -> float | None:
    span = decode_span(r)
    return span[0] * NS_PER_S / span[1] if span else None


def tpot_ms(r: RequestRecord) -> float | None:
    span = decode_span(r)
    return span[1] / span[0] / NS_PER_MS if span else None


def token_gaps_ms(r: RequestRecord) -> list[float]:
    """Inter-token latency per token: an event carrying k tokens after a gap g contributes k samples of g/k."""
    ev = token_events(r)
    gaps: list[float] = []
    for (t_prev, _), (t, k) in zip(ev, ev[1:]):
        gaps.extend([(t - t_prev) / k / NS_PER_MS] * k)
    return gaps


def chunk_gaps_ms(r: RequestRecord) -> list[float]:
    """Gaps between consecutive token-bearing events, one sample per event."""
    ev = token_events(r)
    return [(t - t_prev) / NS_PER_MS for (t_prev, _), (t, _) in zip(ev, ev[1:])]


def is_cancelled(r: RequestRecord) -> bool:
    """Stopped by the client while in flight (Ctrl-C): incomplete, but neither a success nor a failure."""
    return r.error_kind == "cancelled"


def generated_tokens(r: RequestRecord) -> int:
    """Tokens generated, by the server's own count when it gave one (it sees the EOS token a client cannot)."""
    return r.usage.completion_tokens if r.usage and r.usage.completion_tokens is not None else r.output_tokens


def one_short_by_eos(r: RequestRecord) -> bool:
    """A client tokenizer cannot see the end-of-sequence token, which servers count in usage: a request that
    stopped on EOS is one token short by construction, not by error. Which finish reasons mean that is the
    endpoint's dialect's (chat's `stop`, Messages' `end_turn` and `stop_sequence`, Responses' `completed`)."""
    return (r.count_method == "client_tokenizer" and r.usage is not None
            and r.usage.completion_tokens == r.output_tokens + 1
            and r.finish_reason in dialect_for(r.endpoint).natural_stops)


def error_key(r: RequestRecord) -> tuple:
    """What groups failures: kind, HTTP status, and the detail with its numbers masked (a timeout's detail names
    how long it waited)."""
    return (r.error_kind, r.http_status, _NUMBER.sub("#", r.error_detail or ""))


# ---- against latency targets (bench/slo.py parses them; docs/metrics.md#slo-request) ----

class Target(Protocol):
    """A latency target as this module reads it (bench/slo.py SLO)."""

    quantity: str  # ttft, ttfo, itl, tpot or e2e
    limit_ms: float

    @property
    def q(self) -> float: ...  # the statistic as a percentile, 0..100


def request_value_ms(r: RequestRecord, target: Target) -> float | None:
    """The request's own value for a target's quantity (ITL: the target's statistic over its token gaps)."""
    if target.quantity == "ttft":
        return _ms(ttft_ns(r))
    if target.quantity == "ttfo":
        return _ms(ttfo_ns(r))
    if target.quantity == "e2e":
        return _ms(e2e_ns(r))
    if target.quantity == "tpot":
        return tpot_ms(r)
    gaps = sorted(token_gaps_ms(r))
    return percentile(gaps, target.q) if gaps else None


def request_meets(r: RequestRecord, targets: Sequence[Target]) -> bool:
    if not r.ok:
        return False
    for target in targets:
        value = request_value_ms(r, target)
        if value is None:
            if target.quantity in ("itl", "tpot"):
                continue  # fewer than two token events: no gap can have broken the target
            return False
        if value > target.limit_ms:
            return False
    return True


def _ms(ns: int | None) -> float | None:
    return ns / NS_PER_MS if ns is not None else None
