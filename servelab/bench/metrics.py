"""Benchmark figures as pure functions of RequestRecords. Definitions: docs/metrics.md (anchors in `definition`).

Nothing here talks HTTP or reads a clock: give it records and a measurement window, get a Summary.
Latency distributions are over every sample (every token gap of every request), never means of per-request means,
so a rare long stall shows in p99 instead of being averaged away.
Requests cancelled in flight (Ctrl-C) are neither successes nor failures: they are counted (`cancelled`) and kept
out of every figure and error count, since they did not run to their end (docs/metrics.md#cancelled).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import cached_property

from servelab.bench.answer_figures import answer_figures
from servelab.bench.cache_figures import cache_figures
from servelab.bench.figures import FIGURES, LEVEL_FIGURES, LevelFigure
from servelab.bench.image_figures import image_figures
# Re-exported (`x as x`): compare, the exports, the charts, the load modes and the benchmarks read the per-request
# quantities, the percentile and the tally's constructor through this module.
from servelab.bench.request_figures import NS_PER_MS as NS_PER_MS
from servelab.bench.request_figures import NS_PER_S as NS_PER_S
from servelab.bench.request_figures import chunk_gaps_ms as chunk_gaps_ms
from servelab.bench.request_figures import decode_span as decode_span
from servelab.bench.request_figures import decode_tok_s as decode_tok_s
from servelab.bench.request_figures import e2e_ns as e2e_ns
from servelab.bench.request_figures import is_cancelled as is_cancelled
from servelab.bench.request_figures import token_events as token_events
from servelab.bench.request_figures import token_gaps_ms as token_gaps_ms
from servelab.bench.request_figures import tpot_ms as tpot_ms
from servelab.bench.request_figures import ttfo_ns as ttfo_ns
from servelab.bench.request_figures import ttft_ns as ttft_ns
from servelab.bench.sketch import RELATIVE_ACCURACY, Samples
from servelab.bench.sketch import distribution as distribution
from servelab.bench.sketch import percentile as percentile
from servelab.bench.tally import LevelTally, finite
from servelab.bench.tally import as_tally as as_tally
from servelab.records import CountMethod, Figure, RequestRecord, Summary


def counted_by(records: Sequence[RequestRecord]) -> CountMethod | str | None:
    methods = {r.count_method for r in records}
    if not methods:
        return None
    return methods.pop() if len(methods) == 1 else "mixed"


# ---------------------------------------------------------------------------------------------------------------
# One load level
# ---------------------------------------------------------------------------------------------------------------


def summarize(records: Sequence[RequestRecord] | LevelTally, *, tag: str, mode: str, concurrency: int,
              window: tuple[int, int], slos: Sequence | None = None) -> Summary:
    """Figures for one load level, in the order of bench/figures.py, each from its function in `MEASURES`.
    `window` = (start_ns, end_ns) over which aggregate rates are computed. With `slos` (bench/slo.py targets),
    also goodput and SLO attainment.

    `records` is the level's records, or the LevelTally they were folded into as they finished (bench/tally.py):
    either way the figures come from the tally, so a level summarised live and the same records read back
    later give the same numbers."""
    level = LevelInputs(as_tally(records, slos), window, slos)
    figures: dict[str, Figure] = {}
    for spec in LEVEL_FIGURES:
        if spec.applies != "all" and (spec.applies == "unary") != level.unary:
            continue  # a figure that does not apply is absent, never 0 (docs/metrics.md#non-streamed)
        fig = MEASURES[spec.key](spec, level)
        if fig is not None:
            figures[spec.key] = fig
    _, turns = level.cache

    tally, method = level.tally, level.method
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
    if method == "chunk_count" and not level.unary:
        warnings.append("tokens were counted as one per SSE chunk: the server gave no per-chunk token counts "
                        "and no tokenizer was used; token figures are approximate")
    return Summary(tag=tag, mode=mode, concurrency=concurrency, requests=measured, ok=ok, failed=failed,
                   cancelled=cancelled, errors=dict(tally.errors), window_s=level.window_s, figures=figures,
                   warnings=warnings, turns=turns, images=level.images[1])


class LevelInputs:
    """What a level's figures are computed from: its tally, its window and what was counted inside it, how its
    tokens were counted, and the figures computed together (goodput, the prefix cache) once for all of them."""

    def __init__(self, tally: LevelTally, window: tuple[int, int], slos: Sequence | None):
        self.tally, self.window, self.slos = tally, window, slos
        ws, we = window
        self.window_s = max(we - ws, 0) / NS_PER_S
        self.method = tally.counted_by()
        self.tokens, self.answer_tokens, _ = tally.in_window(window)
        self.completed = tally.completed_in(window)
        # a level of non-streamed requests (embeddings, rerank): no token stream to time
        self.unary = tally.unary > 0

    @cached_property
    def goodput(self) -> tuple[float | None, float | None]:
        return goodput(self.tally, self.slos or (), self.window)

    @cached_property
    def cache(self):
        """(figures, per-turn figures) of the prefix cache (bench/cache_figures.py), from one compact row per
        successful request."""
        return cache_figures(self.tally.cache_rows, total=self.tally.ok)

    @cached_property
    def answers(self) -> dict[str, Figure]:
        """Tool-call and structured-output figures (bench/answer_figures.py), from the rows of the requests that
        declared tools or asked for a response format."""
        return answer_figures(self.tally.tool_rows, self.tally.schema_verdicts)

    @cached_property
    def images(self):
        """(figures, per-group figures) of chat with images (bench/image_figures.py)."""
        return image_figures(self.tally.image_rows)


Measure = Callable[[LevelFigure, LevelInputs], Figure | None]  # None: the level has no such figure


def _window_rate(count: Callable[[LevelInputs], int]) -> Measure:
    def measure(spec: LevelFigure, level: LevelInputs) -> Figure:
        value = count(level) / level.window_s if level.window_s > 0 else None
        return spec.make(value, counted_by=level.method)
    return measure


def _over_requests(values: Callable[[LevelInputs], Iterable[float]]) -> Measure:
    """A distribution over the level's successful requests, its value the entry's headline statistic."""
    def measure(spec: LevelFigure, level: LevelInputs) -> Figure:
        return _distribution_figure(spec, values(level), level.method)
    return measure


def _distribution_figure(spec: LevelFigure, values: Iterable[float], method) -> Figure:
    dist = distribution(values)
    return spec.make(getattr(dist, spec.headline) if dist else None, dist=dist, counted_by=method)


def _over_token_gaps(samples: Callable[[LevelTally], Samples]) -> Measure:
    """A distribution over every token gap of the level's successful requests (exact, then sketched)."""
    def measure(spec: LevelFigure, level: LevelInputs) -> Figure:
        return _samples_fig(spec, samples(level.tally), level.method)
    return measure


def _client_lag(spec: LevelFigure, level: LevelInputs) -> Figure | None:
    lags = finite(level.tally.lag_ms)
    return _distribution_figure(spec, lags, None) if lags else None  # only requests with a schedule lag


def _reasoning_share_measure(spec: LevelFigure, level: LevelInputs) -> Figure:
    return _reasoning_share(level.tally, level.method)


def _goodput_rate(spec: LevelFigure, level: LevelInputs) -> Figure | None:
    return spec.make(level.goodput[0], note=_targets(level.slos)) if level.slos else None  # only with targets


def _slo_attainment(spec: LevelFigure, level: LevelInputs) -> Figure | None:
    return spec.make(level.goodput[1], note=_targets(level.slos)) if level.slos else None


def _items_rate(spec: LevelFigure, level: LevelInputs) -> Figure:
    items, _, _ = level.tally.unary_in(level.window)
    return spec.make(items / level.window_s if level.window_s > 0 else None)


def _input_token_rate(spec: LevelFigure, level: LevelInputs) -> Figure:
    """The server's own prompt tokens (usage.prompt_tokens) over the window; not measured when a request that
    counts gave none."""
    _, tokens, missing = level.tally.unary_in(level.window)
    if missing:
        done = level.completed
        return spec.make(None, note=f"not measured: {missing} of {done} requests in the window gave no "
                                    f"usage.prompt_tokens")
    return spec.make(tokens / level.window_s if level.window_s > 0 and level.completed else None,
                     note="the server's usage.prompt_tokens")


def _from_cache(spec: LevelFigure, level: LevelInputs) -> Figure | None:
    return level.cache[0].get(spec.key)  # none when no request reported cached tokens


def _from_answers(spec: LevelFigure, level: LevelInputs) -> Figure | None:
    return level.answers.get(spec.key)  # none when no request declared tools or asked for a format


def _from_images(spec: LevelFigure, level: LevelInputs) -> Figure | None:
    return level.images[0].get(spec.key)  # none when no request carried an image


# Each figure of bench/figures.py, by key: how it is computed from a level (tests/test_figures.py holds the two to
# the same keys).
MEASURES: dict[str, Measure] = {
    "output_tok_s": _window_rate(lambda level: level.tokens),
    "request_s": _window_rate(lambda level: level.completed),
    "decode_tok_s": _over_requests(lambda level: finite(level.tally.decode_tok_s)),
    "ttft_ms": _over_requests(lambda level: finite(level.tally.ttft_ms)),
    "ttfo_ms": _over_requests(lambda level: finite(level.tally.ttfo_ms)),
    "itl_ms": _over_token_gaps(lambda tally: tally.itl),
    "itl_chunk_ms": _over_token_gaps(lambda tally: tally.itl_chunk),
    "tpot_ms": _over_requests(lambda level: finite(level.tally.tpot_ms)),
    "e2e_ms": _over_requests(lambda level: level.tally.e2e_ms()),
    "output_tokens": _over_requests(lambda level: level.tally.output_tokens),
    "answer_tok_s": _window_rate(lambda level: level.answer_tokens),
    "reasoning_tokens": _over_requests(lambda level: level.tally.reasoning_tokens),
    "answer_tokens": _over_requests(lambda level: level.tally.answer_tokens),
    "reasoning_share": _reasoning_share_measure,
    "client_lag_ms": _client_lag,
    "goodput_req_s": _goodput_rate,
    "slo_attainment": _slo_attainment,
    "cache_hit_ratio": _from_cache,
    "cached_tokens": _from_cache,
    "ttft_cached_ms": _from_cache,
    "ttft_uncached_ms": _from_cache,
    "tool_first_ms": _from_answers,
    "tool_call_ms": _from_answers,
    "tool_call_share": _from_answers,
    "tool_parse_share": _from_answers,
    "tool_valid_share": _from_answers,
    "schema_valid_share": _from_answers,
    "images_per_request": _from_images,
    "image_megapixels": _from_images,
    "ttft_image_ms": _from_images,
    "ttft_text_ms": _from_images,
    "items_s": _items_rate,
    "input_tok_s": _input_token_rate,
}


def _samples_fig(spec: LevelFigure, samples: Samples, method) -> Figure:
    dist = samples.distribution()
    note = (f"percentiles from a quantile sketch (DDSketch, within {RELATIVE_ACCURACY:.1%} of the sample at "
            f"their rank) over {samples.n:,} samples; count, mean, min and max exact" if samples.sketched else None)
    return spec.make(getattr(dist, spec.headline) if dist else None, dist=dist, note=note, counted_by=method)


def _reasoning_share(tally: LevelTally, method) -> Figure:
    """The fraction of output tokens that were reasoning: over all successful requests' tokens (the value), and
    request by request (the distribution)."""
    total = sum(tally.output_tokens)
    per_request = [r / o for r, o in zip(tally.reasoning_tokens, tally.output_tokens) if o]
    return FIGURES["reasoning_share"].make(sum(tally.reasoning_tokens) / total if total else None,
                                           dist=distribution(per_request), counted_by=method)


def reasoning_share(ok: Sequence[RequestRecord], method) -> Figure:
    return _reasoning_share(LevelTally.from_records(ok), method)


# The per-request checks a tally counts (bench/tally.py `_warnings`), with how each is said.
_WARNINGS = {
    "usage": "client token count differs from the server's usage (e.g. {example})",
    "unread": "the server counted output tokens but the client read none from the stream, so these requests "
              "have no TTFT and add no output tokens (e.g. {example})",
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
            sep = ": " if key in ("usage", "prompt", "unread") else " "
            out.append(f"{n} of {tally.ok} requests{sep}" + text.format(example=tally.warn_example[key]))
    return out


def token_accounting_warnings(ok: Sequence[RequestRecord]) -> list[str]:
    """Say when the client's counts and the server's usage disagree, or when the requested length was ignored."""
    return _tally_warnings(LevelTally.from_records(ok), ("usage", "unread", "ignore_eos"))


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
    return {"goodput_req_s": FIGURES["goodput_req_s"].make(rate, note=_targets(slos)),
            "slo_attainment": FIGURES["slo_attainment"].make(fraction, note=_targets(slos))}


def _targets(slos: Sequence) -> str:
    return ",".join(f"{s.key}={s.limit_ms:g}" for s in slos)


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
