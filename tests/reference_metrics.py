"""The figures as servelab computed them before issue 14 (bench/metrics.py at 2e65285: every record and every
token event in memory), frozen as the oracle the bounded-memory tally (bench/tally.py) is checked against in
tests/test_tally.py. Not imported by servelab."""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from servelab.records import CountMethod, Distribution, Figure, RequestRecord, Summary
from servelab.protocol.dialects import dialect_for

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (the same as numpy's default)."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def distribution(values: Iterable[float]) -> Distribution | None:
    v = sorted(values)
    if not v:
        return None
    return Distribution(n=len(v), mean=sum(v) / len(v), min=v[0], p50=percentile(v, 50), p90=percentile(v, 90),
                        p95=percentile(v, 95), p99=percentile(v, 99), max=v[-1])


# ---------------------------------------------------------------------------------------------------------------
# Per-request quantities
# ---------------------------------------------------------------------------------------------------------------


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


def counted_by(records: Sequence[RequestRecord]) -> CountMethod | str | None:
    methods = {r.count_method for r in records}
    if not methods:
        return None
    return methods.pop() if len(methods) == 1 else "mixed"


# ---------------------------------------------------------------------------------------------------------------
# One load level
# ---------------------------------------------------------------------------------------------------------------


def _fig(values: Iterable[float | None], unit: str, definition: str, method, headline: str = "p50",
         note: str | None = None) -> Figure:
    dist = distribution(v for v in values if v is not None)
    value = getattr(dist, headline) if dist else None
    return Figure(value=value, unit=unit, definition=definition, counted_by=method, dist=dist, note=note)


def summarize(records: Sequence[RequestRecord], *, tag: str, mode: str, concurrency: int,
              window: tuple[int, int], slos: Sequence | None = None) -> Summary:
    """Figures for one load level. `window` = (start_ns, end_ns) over which aggregate rates are computed.
    With `slos` (bench/slo.py targets), also goodput and SLO attainment."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    cancelled = [r for r in measured if not r.ok and is_cancelled(r)]
    failed = [r for r in measured if not r.ok and not is_cancelled(r)]
    ws, we = window
    window_s = max(we - ws, 0) / NS_PER_S
    method = counted_by(ok)
    timing_method = None  # pure timings do not depend on how tokens were counted

    in_window_tokens = sum(e.tokens for r in ok for e in r.events if ws <= e.t_ns <= we)
    in_window_answer = sum(e.tokens for r in ok for e in r.events if ws <= e.t_ns <= we and e.kind == "answer")
    completed_in_window = sum(1 for r in ok if r.t_end_ns is not None and ws <= r.t_end_ns <= we)
    figures: dict[str, Figure] = {
        "output_tok_s": Figure(value=in_window_tokens / window_s if window_s > 0 else None, unit="tok/s",
                               definition="output-tok-s", counted_by=method),
        "request_s": Figure(value=completed_in_window / window_s if window_s > 0 else None, unit="req/s",
                            definition="request-s", counted_by=timing_method),
        "decode_tok_s": _fig((decode_tok_s(r) for r in ok), "tok/s", "decode-tok-s", method),
        "ttft_ms": _fig((_ms(ttft_ns(r)) for r in ok), "ms", "ttft", method),
        "ttfo_ms": _fig((_ms(ttfo_ns(r)) for r in ok), "ms", "ttfo", method),
        "itl_ms": _fig((g for r in ok for g in token_gaps_ms(r)), "ms", "itl", method),
        "itl_chunk_ms": _fig((g for r in ok for g in chunk_gaps_ms(r)), "ms", "itl-chunk", timing_method),
        "tpot_ms": _fig((tpot_ms(r) for r in ok), "ms", "tpot", method),
        "e2e_ms": _fig((_ms(e2e_ns(r)) for r in ok), "ms", "e2e", timing_method),
        "output_tokens": _fig((r.output_tokens for r in ok), "tokens", "output-tokens", method,
                              headline="mean"),
        # Reasoning apart from the answer (docs/metrics.md#reasoning): the figures that mean the same whether or
        # not an engine thinks.
        "answer_tok_s": Figure(value=in_window_answer / window_s if window_s > 0 else None, unit="tok/s",
                               definition="answer-tok-s", counted_by=method),
        "reasoning_tokens": _fig((r.reasoning_tokens for r in ok), "tokens", "reasoning-tokens", method,
                                 headline="mean"),
        "answer_tokens": _fig((r.answer_tokens for r in ok), "tokens", "answer-tokens", method, headline="mean"),
        "reasoning_share": reasoning_share(ok, method),
    }
    lags = [(r.t_send_ns - r.scheduled_ns) / NS_PER_MS for r in measured if r.scheduled_ns is not None]
    if lags:
        figures["client_lag_ms"] = _fig(lags, "ms", "client-lag", None, headline="p99")
    if slos:
        figures.update(goodput_figures(measured, slos, window))

    warnings = token_accounting_warnings(ok) + length_control_warnings(ok)
    if failed:
        warnings.append(f"{len(failed)} of {len(ok) + len(failed)} requests failed; they are excluded from latency "
                        f"figures and counted under `errors`")
    if cancelled:
        warnings.append(f"{len(cancelled)} of {len(measured)} requests were cancelled in flight (interrupted, or "
                        f"still running a grace period after the level's cap); "
                        f"they are kept in records.jsonl with error_kind \"cancelled\" and what they had received, "
                        f"counted under `cancelled`, and excluded from every figure and from `failed`")
    if method == "chunk_count":
        warnings.append("tokens were counted as one per SSE chunk: the server gave no per-chunk token counts "
                        "and no tokenizer was used; token figures are approximate")
    return Summary(tag=tag, mode=mode, concurrency=concurrency, requests=len(measured), ok=len(ok),
                   failed=len(failed), cancelled=len(cancelled),
                   errors=dict(Counter(r.error_kind or "unknown" for r in failed)),
                   window_s=window_s, figures=figures, warnings=warnings)


def reasoning_share(ok: Sequence[RequestRecord], method) -> Figure:
    """The fraction of output tokens that were reasoning: over all successful requests' tokens (the value), and
    request by request (the distribution)."""
    total = sum(r.output_tokens for r in ok)
    per_request = [r.reasoning_tokens / r.output_tokens for r in ok if r.output_tokens]
    return Figure(value=sum(r.reasoning_tokens for r in ok) / total if total else None, unit="fraction",
                  definition="reasoning-share", counted_by=method, dist=distribution(per_request))


def saw_reasoning(levels: Iterable[Summary]) -> bool:
    """Whether any level counted a reasoning token (tables show the reasoning figures only then)."""
    for s in levels:
        fig = s.figures.get("reasoning_tokens")
        if fig is not None and fig.dist is not None and fig.dist.max > 0:
            return True
    return False


def token_accounting_warnings(ok: Sequence[RequestRecord]) -> list[str]:
    """Say when the client's counts and the server's usage disagree, or when the requested length was ignored."""
    warnings: list[str] = []
    # tokens in usage and no event read at all: said apart, not as a count that differs (docs/metrics.md#dialects)
    unread = [r for r in ok if r.usage and r.usage.completion_tokens and not r.events]
    mismatched = [r for r in ok if r.usage and r.usage.completion_tokens is not None and r not in unread
                  and r.usage.completion_tokens != r.output_tokens and not _eos_only(r)]
    if mismatched:
        r = mismatched[0]
        warnings.append(f"{len(mismatched)} of {len(ok)} requests: client token count differs from the server's "
                        f"usage (e.g. request {r.index}: {r.output_tokens} counted by {r.count_method}, "
                        f"{r.usage.completion_tokens} in usage)")
    if unread:
        r = unread[0]
        warnings.append(f"{len(unread)} of {len(ok)} requests: the server counted output tokens but the client "
                        f"read none from the stream, so these requests have no TTFT and add no output tokens (e.g. "
                        f"request {r.index}: {r.usage.completion_tokens} in usage, no token event read from "
                        f"{r.chunks} events)")
    short = [r for r in ok if r.sampling.get("ignore_eos") and r.max_tokens is not None
             and r.output_tokens != r.max_tokens]
    if short:
        r = short[0]
        warnings.append(f"{len(short)} of {len(ok)} requests did not produce the requested max_tokens despite "
                        f"ignore_eos (e.g. request {r.index}: {r.output_tokens} of {r.max_tokens})")
    return warnings


def length_control_warnings(ok: Sequence[RequestRecord]) -> list[str]:
    """Say when a prompt was not as long as the workload meant it to be (input_tokens vs the server's
    usage.prompt_tokens), or when an answer stopped before the min_tokens it asked for."""
    warnings: list[str] = []
    off = [r for r in ok if r.input_tokens is not None and r.usage and r.usage.prompt_tokens is not None
           and r.usage.prompt_tokens != r.input_tokens]
    if off:
        r = off[0]
        warnings.append(f"{len(off)} of {len(ok)} requests: the prompt the workload built is not the length the "
                        f"server counted (e.g. request {r.index}: {r.input_tokens} sent, {r.usage.prompt_tokens} "
                        f"in usage.prompt_tokens)")
    short = [r for r in ok if isinstance(r.sampling.get("min_tokens"), int) and _generated(r) < r.sampling[
        "min_tokens"]]
    if short:
        r = short[0]
        warnings.append(f"{len(short)} of {len(ok)} requests stopped before the requested min_tokens (e.g. "
                        f"request {r.index}: {_generated(r)} of at least {r.sampling['min_tokens']})")
    return warnings


def _generated(r: RequestRecord) -> int:
    """Tokens generated, by the server's own count when it gave one (it sees the EOS token a client cannot)."""
    return r.usage.completion_tokens if r.usage and r.usage.completion_tokens is not None else r.output_tokens


def goodput(records: Sequence[RequestRecord], slos: Sequence, window: tuple[int, int]
            ) -> tuple[float | None, float | None]:
    """(goodput in req/s, SLO attainment): requests that met every target and ended inside the window, per second
    of window; and the fraction of measured requests (failures included, cancelled ones not) that met every
    target."""
    from servelab.bench.slo import request_meets  # slo.py builds on this module

    measured = [r for r in records if not r.warmup and not is_cancelled(r)]
    met = [r for r in measured if request_meets(r, slos)]
    ws, we = window
    window_s = max(we - ws, 0) / NS_PER_S
    good_in_window = sum(1 for r in met if r.t_end_ns is not None and ws <= r.t_end_ns <= we)
    return (good_in_window / window_s if window_s > 0 else None, len(met) / len(measured) if measured else None)


def goodput_figures(records: Sequence[RequestRecord], slos: Sequence, window: tuple[int, int]
                    ) -> dict[str, Figure]:
    rate, fraction = goodput(records, slos, window)
    targets = ",".join(f"{s.key}={s.limit_ms:g}" for s in slos)
    return {"goodput_req_s": Figure(value=rate, unit="req/s", definition="goodput", note=targets),
            "slo_attainment": Figure(value=fraction, unit="fraction", definition="slo-attainment", note=targets)}


def _eos_only(r: RequestRecord) -> bool:
    """A client tokenizer cannot see the end-of-sequence token, which servers count in usage: a request that
    stopped on EOS is one token short by construction, not by error."""
    return (r.count_method == "client_tokenizer" and r.usage is not None
            and r.finish_reason in dialect_for(r.endpoint).natural_stops
            and r.usage.completion_tokens == r.output_tokens + 1)


def _ms(ns: int | None) -> float | None:
    return ns / NS_PER_MS if ns is not None else None


def peak_figures(levels: Sequence[Summary], *, load_key: str, load: Callable[[Summary], float], load_unit: str,
                 note: Callable[[Summary], str]) -> dict[str, Figure]:
    """The `peak.*` headline figures from the level with the highest output tok/s (docs/metrics.md)."""
    best = max(levels, key=lambda s: s.figures["output_tok_s"].value or 0.0)
    fig = best.figures["output_tok_s"].model_copy()
    fig.note = note(best)
    out = {"peak.output_tok_s": fig,
           f"peak.{load_key}": Figure(value=load(best), unit=load_unit, definition="peak-output-tok-s"),
           "peak.request_s": best.figures["request_s"]}
    if "answer_tok_s" in best.figures:  # at the same level: the answer part of the peak's output
        answer = best.figures["answer_tok_s"].model_copy()
        answer.note = note(best)
        out["peak.answer_tok_s"] = answer
    return out
