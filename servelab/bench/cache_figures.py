"""Prefix-cache figures of one load level, as a pure function of small per-request rows (docs/metrics.md#cache).

A row is what one successful request tells about the engine's cache: the prompt tokens the engine served from
it (`usage.cached_tokens`: llama.cpp's `timings.cache_n` or `usage.prompt_tokens_details.cached_tokens`, vLLM's
and SGLang's `usage.prompt_tokens_details.cached_tokens`), the prompt's length as the server counted it
(`usage.prompt_tokens`), the request's turn in its conversation (None for single-turn workloads) and its TTFT.
Nothing here but `cache_row` reads a RequestRecord: the level's tally builds one row per request as it is folded
(bench/tally.py), so the figures can be computed from compact values as records stream to disk.

Figures (each None when no request reported cached tokens):
- cache_hit_ratio: cached ÷ prompt tokens over the requests that reported both (token-weighted); its
  distribution is each request's own share.
- cached_tokens: cached prompt tokens per request (headline: the mean).
- ttft_cached_ms / ttft_uncached_ms: TTFT of the requests whose cached share was at least / below
  CACHED_SHARE (one half), so the price of a cold prefill shows beside a warm one at the same load.
Per turn index (TurnFigures): requests, TTFT distribution, mean prompt and cached tokens, and the cached share.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

from servelab.bench.figures import FIGURES
from servelab.bench.request_figures import ttft_ns
from servelab.bench.sketch import distribution
from servelab.records import Figure, TurnFigures

CACHED_SHARE = 0.5  # a request with at least this share of its prompt served from cache counts as "cached"


class CacheRow(NamedTuple):
    cached_tokens: int | None  # the server's count of prompt tokens served from its cache; None: not reported
    prompt_tokens: int | None  # the server's usage.prompt_tokens (or what the workload built, without usage)
    turn: int | None  # 1-based turn in its conversation; None for single-turn workloads
    ttft_ms: float | None


def _reported(row: CacheRow) -> bool:
    return row.cached_tokens is not None and row.prompt_tokens is not None and row.prompt_tokens > 0


def share(row: CacheRow) -> float | None:
    """The request's own cached share of its prompt, at most 1 (None when not reported)."""
    if not _reported(row):
        return None
    return min(row.cached_tokens / row.prompt_tokens, 1.0)  # type: ignore[operator]


def cache_figures(rows: Iterable[CacheRow], total: int | None = None
                  ) -> tuple[dict[str, Figure], list[TurnFigures]]:
    """(figures, per-turn figures). No figures when no request reported cached tokens; no turns when no request
    had a turn. `total`: the level's successful requests, when `rows` leaves out those with neither a cached
    count nor a turn (they add nothing but to that count: the level's tally keeps only the others)."""
    rows = list(rows)
    reported = [r for r in rows if _reported(r)]
    figures: dict[str, Figure] = {}
    if reported:
        cached = sum(r.cached_tokens for r in reported)  # type: ignore[misc]
        prompt = sum(r.prompt_tokens for r in reported)  # type: ignore[misc]
        note = f"{len(reported)} of {total if total is not None else len(rows)} requests reported cached prompt tokens"
        shares = [share(r) for r in reported]
        figures["cache_hit_ratio"] = FIGURES["cache_hit_ratio"].make(
            cached / prompt, dist=distribution(shares), note=note)  # type: ignore[arg-type]
        counts = distribution([float(r.cached_tokens) for r in reported])  # type: ignore[arg-type]
        figures["cached_tokens"] = FIGURES["cached_tokens"].make(counts.mean if counts else None, dist=counts,
                                                                 note=note)
        for key, cached_side, words in (("ttft_cached_ms", True, "at least"), ("ttft_uncached_ms", False,
                                                                                  "less than")):
            ttfts = distribution([r.ttft_ms for r in reported
                                   if r.ttft_ms is not None and (share(r) >= CACHED_SHARE) == cached_side])
            figures[key] = FIGURES[key].make(ttfts.p50 if ttfts else None, dist=ttfts,
                                             note=f"requests with {words} {CACHED_SHARE:.0%} of their prompt "
                                                  f"served from cache")
    return figures, turn_figures(rows)


def turn_figures(rows: Iterable[CacheRow]) -> list[TurnFigures]:
    by_turn: dict[int, list[CacheRow]] = defaultdict(list)
    for r in rows:
        if r.turn is not None:
            by_turn[r.turn].append(r)
    out: list[TurnFigures] = []
    for turn in sorted(by_turn):
        group = by_turn[turn]
        reported = [r for r in group if _reported(r)]
        prompts = [r.prompt_tokens for r in group if r.prompt_tokens is not None]
        prompt_sum = sum(r.prompt_tokens for r in reported)  # type: ignore[misc]
        out.append(TurnFigures(
            turn=turn, requests=len(group),
            ttft_ms=distribution([r.ttft_ms for r in group if r.ttft_ms is not None]),
            prompt_tokens_mean=sum(prompts) / len(prompts) if prompts else None,
            cached_tokens_mean=sum(r.cached_tokens for r in reported) / len(reported) if reported else None,
            cached_share=sum(r.cached_tokens for r in reported) / prompt_sum if prompt_sum else None))
    return out


def cache_row(r) -> CacheRow:
    """The row of one successful RequestRecord: the one place a record becomes a row (the level's accumulator
    can build the same row as each record finishes)."""
    usage = r.usage
    prompt = usage.prompt_tokens if usage is not None and usage.prompt_tokens is not None else r.input_tokens
    ttft = ttft_ns(r)
    return CacheRow(usage.cached_tokens if usage is not None else None, prompt, r.turn,
                    ttft / 1e6 if ttft is not None else None)
