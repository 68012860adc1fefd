"""The story's numbers, as pieces a mode's headline is made of (bench/modes/): single-stream figures, the peak over
concurrency levels, the peak over rate levels, and the answer of an SLO search. Each piece reads only the levels
(and the search) of a result, so a result pooled across trials (bench/trials.py) gets the same figures."""

from __future__ import annotations

from collections.abc import Callable

from servelab.bench.metrics import peak_figures
from servelab.bench.steady import is_measured
from servelab.records import BenchResult, Figure, Summary

SINGLE_KEYS = ("decode_tok_s", "output_tok_s", "ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "ttfo_ms", "answer_tok_s",
               "reasoning_tokens", "answer_tokens", "reasoning_share", "items_s", "input_tok_s")


def single_figures(result: BenchResult, *, or_concurrency_1: bool = False) -> dict[str, Figure]:
    """`single.*`: the single-stream level's figures (or, for a sweep, its concurrency-1 level's)."""
    single = next((s for s in result.levels if s.mode == "single"), None)
    if single is None and or_concurrency_1:
        single = next((s for s in result.levels if s.concurrency == 1), None)
    if single is None:
        return {}
    return {f"single.{key}": single.figures[key] for key in SINGLE_KEYS if key in single.figures}


def concurrency_peak(result: BenchResult) -> dict[str, Figure]:
    """`peak.*`: the highest output tok/s over the measured concurrency levels, at its concurrency."""
    levels = [s for s in result.levels if s.mode == "concurrency" and is_measured(s) and _value(s, "output_tok_s")]
    if not levels:
        return items_peak([s for s in result.levels if s.mode == "concurrency"], "concurrency",
                          lambda s: s.concurrency, "streams", lambda s: f"at concurrency {s.concurrency}")
    return peak_figures(levels, load_key="concurrency", load=lambda s: s.concurrency, load_unit="streams",
                        note=lambda s: f"at concurrency {s.concurrency}")


def rate_peak(result: BenchResult) -> dict[str, Figure]:
    """`peak.*` over rate levels, when there are no concurrency levels to take it from."""
    if any(s.mode == "concurrency" for s in result.levels):
        return {}
    levels = [s for s in result.levels if s.mode == "rate" and s.rate is not None and is_measured(s)
              and _value(s, "output_tok_s")]
    if not levels:
        return items_peak([s for s in result.levels if s.mode == "rate" and s.rate is not None], "rate",
                          lambda s: s.rate, "req/s", lambda s: f"at {s.rate:g} req/s offered")
    return peak_figures(levels, load_key="rate", load=lambda s: s.rate, load_unit="req/s",
                        note=lambda s: f"at {s.rate:g} req/s offered")


def items_peak(levels: list[Summary], load_key: str, load: Callable[[Summary], float], load_unit: str,
               note: Callable[[Summary], str]) -> dict[str, Figure]:
    """`peak.*` of non-streamed levels (embeddings, rerank; docs/metrics.md#peak-items-s): the measured level with
    the highest items/s, its load, requests/s and request latency there."""
    levels = [s for s in levels if is_measured(s) and _value(s, "items_s")]
    if not levels:
        return {}
    best = max(levels, key=lambda s: _value(s, "items_s") or 0.0)
    out = {"peak.items_s": best.figures["items_s"].model_copy(update={"note": note(best)}),
           f"peak.{load_key}": Figure(value=load(best), unit=load_unit, definition="peak-items-s")}
    for key in ("request_s", "e2e_ms", "input_tok_s"):
        if key in best.figures:
            out[f"peak.{key}"] = best.figures[key]
    return out


def _value(level: Summary, key: str) -> float | None:
    fig = level.figures.get(key)
    return fig.value if fig is not None else None


def slo_answer(result: BenchResult) -> dict[str, Figure]:
    """`slo.*`: the highest load an SLO search saw meet the targets, with its level's goodput."""
    out: dict[str, Figure] = {}
    search = result.search or {}
    if search.get("best") is None:
        return out
    by_rate = search["dimension"] == "rate"
    level = next((s for s in result.levels if s.slo and s.slo["passed"] and is_measured(s)
                  and (s.rate if by_rate else s.concurrency) == search["best"]), None)
    out["slo.max_rate" if by_rate else "slo.max_concurrency"] = Figure(
        value=search["best"], unit="req/s" if by_rate else "streams", definition="slo-search",
        note=f"targets {search['targets']}; lowest failing: {search.get('lowest_failing')}")
    if level is not None:
        for key in ("goodput_req_s", "output_tok_s", "items_s", "request_s"):
            if key in level.figures:
                out[f"slo.{key}"] = level.figures[key]
    return out
