"""Benchmark figures as pure functions of RequestRecords. Definitions: docs/metrics.md (anchors in `definition`).

Nothing here talks HTTP or reads a clock: give it records and a measurement window, get a Summary.
Latency distributions are over every sample (every token gap of every request), never means of per-request means,
so a rare long stall shows in p99 instead of being averaged away.
Requests cancelled in flight (Ctrl-C) are neither successes nor failures: they are counted (`cancelled`) and kept
out of every figure and error count, since they did not run to their end (docs/metrics.md#cancelled).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from servelab.bench.cache_figures import cache_figures
from servelab.bench.sketch import RELATIVE_ACCURACY, Samples
from servelab.bench.sketch import percentile as percentile  # noqa: PLC0414 - the one definition, re-exported
from servelab.bench.tally import LevelTally, finite
from servelab.records import CountMethod, Distribution, Figure, RequestRecord, Summary

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


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


def summarize(records: Sequence[RequestRecord] | LevelTally, *, tag: str, mode: str, concurrency: int,
              window: tuple[int, int], slos: Sequence | None = None) -> Summary:
    """Figures for one load level. `window` = (start_ns, end_ns) over which aggregate rates are computed.
    With `slos` (bench/slo.py targets), also goodput and SLO attainment.

    `records` is the level's records, or the LevelTally they were folded into as they finished (bench/tally.py):
    either way the figures come from the tally, so a level summarised live and the same records read back
    later give the same numbers."""
    tally = as_tally(records, slos)
    ws, we = window
    window_s = max(we - ws, 0) / NS_PER_S
    method = tally.counted_by()
    timing_method = None  # pure timings do not depend on how tokens were counted

    in_window_tokens, in_window_answer, _ = tally.in_window(window)
    completed_in_window = tally.completed_in(window)
    figures: dict[str, Figure] = {
        "output_tok_s": Figure(value=in_window_tokens / window_s if window_s > 0 else None, unit="tok/s",
                               definition="output-tok-s", counted_by=method),
        "request_s": Figure(value=completed_in_window / window_s if window_s > 0 else None, unit="req/s",
                            definition="request-s", counted_by=timing_method),
        "decode_tok_s": _fig(finite(tally.decode_tok_s), "tok/s", "decode-tok-s", method),
        "ttft_ms": _fig(finite(tally.ttft_ms), "ms", "ttft", method),
        "ttfo_ms": _fig(finite(tally.ttfo_ms), "ms", "ttfo", method),
        "itl_ms": _samples_fig(tally.itl, "ms", "itl", method),
        "itl_chunk_ms": _samples_fig(tally.itl_chunk, "ms", "itl-chunk", timing_method),
        "tpot_ms": _fig(finite(tally.tpot_ms), "ms", "tpot", method),
        "e2e_ms": _fig(tally.e2e_ms(), "ms", "e2e", timing_method),
        "output_tokens": _fig(tally.output_tokens, "tokens", "output-tokens", method, headline="mean"),
        # Reasoning apart from the answer (docs/metrics.md#reasoning): the figures that mean the same whether or
        # not an engine thinks.
        "answer_tok_s": Figure(value=in_window_answer / window_s if window_s > 0 else None, unit="tok/s",
                               definition="answer-tok-s", counted_by=method),
        "reasoning_tokens": _fig(tally.reasoning_tokens, "tokens", "reasoning-tokens", method, headline="mean"),
        "answer_tokens": _fig(tally.answer_tokens, "tokens", "answer-tokens", method, headline="mean"),
        "reasoning_share": _reasoning_share(tally, method),
    }
    lags = finite(tally.lag_ms)
    if lags:
        figures["client_lag_ms"] = _fig(lags, "ms", "client-lag", None, headline="p99")
    if slos:
        figures.update(goodput_figures(tally, slos, window))

    # issue 16: prefix-cache figures from one compact row per successful request (bench/cache_figures.py)
    cache, turns = cache_figures(tally.cache_rows, total=tally.ok)
    figures.update(cache)

    ok, failed, cancelled, measured = tally.ok, tally.failed, tally.cancelled, tally.measured
    warnings = _tally_warnings(tally)
    if failed:
        warnings.append(f"{failed} of {ok + failed} requests failed; they are excluded from latency "
                        f"figures and counted under `errors`")
    if cancelled:
        warnings.append(f"{cancelled} of {measured} requests were cancelled in flight (interrupted, or "
                        f"still running a grace period after the level's cap); "
                        f"they are kept in records.jsonl with error_kind \"cancelled\" and what they had received, "
                        f"counted under `cancelled`, and excluded from every figure and from `failed`")
    if method == "chunk_count":
        warnings.append("tokens were counted as one per SSE chunk: the server gave no per-chunk token counts "
                        "and no tokenizer was used; token figures are approximate")
    return Summary(tag=tag, mode=mode, concurrency=concurrency, requests=measured, ok=ok, failed=failed,
                   cancelled=cancelled, errors=dict(tally.errors), window_s=window_s, figures=figures,
                   warnings=warnings, turns=turns)


def as_tally(records: Sequence[RequestRecord] | LevelTally, slos: Sequence | None = None) -> LevelTally:
    """The tally of `records` (itself when it is one). A tally must have been told the SLO targets it is
    asked about: it judged each request against them as it was folded."""
    if isinstance(records, LevelTally):
        if slos and [s.key for s in slos] != [s.key for s in records.slos]:
            raise ValueError("this level was tallied without these SLO targets")
        return records
    return LevelTally.from_records(records, slos=slos)


def _samples_fig(samples: Samples, unit: str, definition: str, method) -> Figure:
    dist = samples.distribution()
    note = (f"percentiles from a quantile sketch (DDSketch, within {RELATIVE_ACCURACY:.1%} of the sample at "
            f"their rank) over {samples.n:,} samples; count, mean, min and max exact" if samples.sketched else None)
    return Figure(value=dist.p50 if dist else None, unit=unit, definition=definition, counted_by=method,
                  dist=dist, note=note)


def _reasoning_share(tally: LevelTally, method) -> Figure:
    """The fraction of output tokens that were reasoning: over all successful requests' tokens (the value), and
    request by request (the distribution)."""
    total = sum(tally.output_tokens)
    per_request = [r / o for r, o in zip(tally.reasoning_tokens, tally.output_tokens) if o]
    return Figure(value=sum(tally.reasoning_tokens) / total if total else None, unit="fraction",
                  definition="reasoning-share", counted_by=method, dist=distribution(per_request))


def reasoning_share(ok: Sequence[RequestRecord], method) -> Figure:
    return _reasoning_share(LevelTally.from_records(ok), method)


# The per-request checks a tally counts (bench/tally.py `_warnings`), with how each is said.
_WARNINGS = {
    "usage": "client token count differs from the server's usage (e.g. {example})",
    "ignore_eos": "did not produce the requested max_tokens despite ignore_eos (e.g. {example})",
    "prompt": "the prompt the workload built is not the length the server counted (e.g. {example})",
    "min_tokens": "stopped before the requested min_tokens (e.g. {example})",
}


def _tally_warnings(tally: LevelTally, keys: Iterable[str] = tuple(_WARNINGS)) -> list[str]:
    """Say when the client's counts and the server's usage disagree, when the requested length was ignored,
    when a prompt was not as long as the workload meant it to be (input_tokens vs usage.prompt_tokens), or when
    an answer stopped before the min_tokens it asked for."""
    out = []
    for key in keys:
        text = _WARNINGS[key]
        n = tally.warn_counts.get(key, 0)
        if n:
            sep = ": " if key in ("usage", "prompt") else " "
            out.append(f"{n} of {tally.ok} requests{sep}" + text.format(example=tally.warn_example[key]))
    return out


def token_accounting_warnings(ok: Sequence[RequestRecord]) -> list[str]:
    """Say when the client's counts and the server's usage disagree, or when the requested length was ignored."""
    return _tally_warnings(LevelTally.from_records(ok), ("usage", "ignore_eos"))


def length_control_warnings(ok: Sequence[RequestRecord]) -> list[str]:
    """Say when a prompt was not as long as the workload meant it to be (input_tokens vs the server's
    usage.prompt_tokens), or when an answer stopped before the min_tokens it asked for."""
    return _tally_warnings(LevelTally.from_records(ok), ("prompt", "min_tokens"))


def saw_reasoning(levels: Iterable[Summary]) -> bool:
    """Whether any level counted a reasoning token (tables show the reasoning figures only then)."""
    for s in levels:
        fig = s.figures.get("reasoning_tokens")
        if fig is not None and fig.dist is not None and fig.dist.max > 0:
            return True
    return False


def _generated(r: RequestRecord) -> int:
    """Tokens generated, by the server's own count when it gave one (it sees the EOS token a client cannot)."""
    return r.usage.completion_tokens if r.usage and r.usage.completion_tokens is not None else r.output_tokens


def goodput(records: Sequence[RequestRecord] | LevelTally, slos: Sequence, window: tuple[int, int]
            ) -> tuple[float | None, float | None]:
    """(goodput in req/s, SLO attainment): requests that met every target and ended inside the window, per second
    of window; and the fraction of measured requests (failures included, cancelled ones not) that met every
    target."""
    tally = as_tally(records, slos)
    ws, we = window
    window_s = max(we - ws, 0) / NS_PER_S
    judged = sum(1 for s in tally.status if s != 2)
    met = sum(tally.meets)
    good_in_window = sum(1 for m, t in zip(tally.meets, tally.t_end) if m and t != -1 and ws <= t <= we)
    return (good_in_window / window_s if window_s > 0 else None, met / judged if judged else None)


def goodput_figures(records: Sequence[RequestRecord] | LevelTally, slos: Sequence, window: tuple[int, int]
                    ) -> dict[str, Figure]:
    rate, fraction = goodput(records, slos, window)
    targets = ",".join(f"{s.key}={s.limit_ms:g}" for s in slos)
    return {"goodput_req_s": Figure(value=rate, unit="req/s", definition="goodput", note=targets),
            "slo_attainment": Figure(value=fraction, unit="fraction", definition="slo-attainment", note=targets)}


def _eos_only(r: RequestRecord) -> bool:
    """A client tokenizer cannot see the end-of-sequence token, which servers count in usage: a request that
    stopped on EOS is one token short by construction, not by error."""
    return (r.count_method == "client_tokenizer" and r.finish_reason == "stop" and r.usage is not None
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
