"""A cell measured as several trials, seen as one: which trials count, and their levels pooled by the same
definitions as one trial's (docs/metrics.md#trials).

- Which trials count: the quiet ones. A trial with a contended level (the machine was busy: host/environment.py)
  is left out whenever at least one trial of the cell was quiet; when every trial was contended they all count,
  and whatever is built from them says so.
- A pooled level (one tag over the trials that count): per-request figures (TTFT, ITL, decode tok/s, E2E, …) are
  computed over the requests of every trial together, exactly as bench/metrics.summarize computes them over one
  level's requests; aggregate rates (output tok/s, requests/s) are the tokens (requests) counted inside the
  trials' measurement windows over the windows' total length, i.e. the window-weighted mean of the trials' rates.
  A trial whose level was not measured (too short for a steady state) contributes no rate.

With one trial, everything here returns that trial unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from servelab.bench.metrics import summarize
from servelab.bench.tally import LevelTally
from servelab.bench.steady import AGGREGATE_KEYS, is_measured
from servelab.records import BenchResult, Figure, RequestRecord, Summary, Trial


def is_contended(trial: Trial) -> bool:
    return trial.status == "contended" or bool(trial.contended_levels)


def counted_trials(trials: Sequence[Trial]) -> tuple[list[Trial], list[Trial]]:
    """(the trials whose figures count, the contended ones left out). Only trials that ran to the end count; a
    trial stopped early because the machine was busy (status "contended") never counts and is always among those
    left out, unless it is all there is."""
    stopped = [t for t in trials if t.status == "contended" and t.benches]
    done = ([t for t in trials if t.status == "complete" and t.benches]
            or [t for t in trials if t.benches and t.status != "contended"])
    if not done:
        return stopped, []
    quiet = [t for t in done if not is_contended(t)]
    if quiet:
        return quiet, sorted([t for t in done if is_contended(t)] + stopped, key=lambda t: t.index)
    return done, stopped


def clean_trials(trials: Sequence[Trial]) -> int:
    """How many trials ran to the end on a quiet machine: what a better/worse verdict needs two of."""
    return sum(1 for t in trials if t.status == "complete" and t.benches and not is_contended(t))


def pooled_bench(benches: Sequence[BenchResult], tallies: Mapping[str, LevelTally],
                 trial_of: Sequence[int]) -> BenchResult:
    """One BenchResult whose levels pool the same tag over `benches` (one per trial, `trial_of` their indices),
    with `tallies[tag]` holding the records of that tag from those trials. The first bench gives the order of the
    levels, its url, mode and workload; the stop reason and interruption are the last one's."""
    if len(benches) == 1:
        return benches[0]
    first = benches[0]
    tags: list[str] = []
    for bench in benches:
        tags += [s.tag for s in bench.levels if s.tag not in tags]
    by_tag = [(trial, {s.tag: s for s in bench.levels}) for trial, bench in zip(trial_of, benches)]
    levels = []
    for tag in tags:
        parts = [(trial, found[tag]) for trial, found in by_tag if tag in found]
        levels.append(pool_level([s for _, s in parts], tallies.get(tag) or LevelTally(keep=False),
                                 [trial for trial, _ in parts]))
    result = first.model_copy(update={"levels": levels, "stop_reason": benches[-1].stop_reason,
                                      "interrupted": any(b.interrupted for b in benches)})
    from servelab.bench.runner import headline  # the runner's headline rule, applied to the pooled levels

    result.headline = headline(result)
    return result


def pool_level(levels: Sequence[Summary], records: Sequence[RequestRecord] | LevelTally, trials: Sequence[int]
               ) -> Summary:
    """One tag's levels from several trials as one Summary (module docstring)."""
    first = levels[0]
    pooled = summarize(records, tag=first.tag, mode=first.mode, concurrency=first.concurrency, window=(0, 0))
    measured = [s for s in levels if is_measured(s)]
    total_s = sum(s.window_s for s in measured)
    for key in AGGREGATE_KEYS:
        if key not in first.figures:
            continue
        figs = [(s, s.figures[key]) for s in measured if key in s.figures and s.figures[key].value is not None]
        template = first.figures[key]
        if not figs or total_s <= 0:
            pooled.figures[key] = template.model_copy(update={"value": None, "dist": None,
                                                              "note": "not measured in any trial"})
            continue
        weight = sum(s.window_s for s, _ in figs)
        value = sum(f.value * s.window_s for s, f in figs) / weight  # type: ignore[operator]
        per_trial = ", ".join(f"{f.value:,.2f}" for _, f in figs)
        pooled.figures[key] = template.model_copy(update={
            "value": value, "note": f"window-weighted mean of {len(figs)} trials ({per_trial})"})
    pooled.window_s = total_s
    pooled.rate, pooled.load, pooled.slo = first.rate, first.load, first.slo
    pooled.steady = first.steady.model_copy(update={"measured": bool(measured), "reason": None if measured else
                                                    first.steady.reason}) if first.steady else None
    pooled.warnings = _merged_warnings(levels, trials)
    pooled.requests = sum(s.requests for s in levels)
    pooled.cancelled = sum(s.cancelled for s in levels)
    return pooled


def _merged_warnings(levels: Sequence[Summary], trials: Sequence[int]) -> list[str]:
    seen: dict[str, list[int]] = {}
    for s, trial in zip(levels, trials):
        for w in s.warnings:
            seen.setdefault(w, []).append(trial)
    return [w if len(ts) == len(levels) else f"trial {', '.join(str(t + 1) for t in ts)}: {w}"
            for w, ts in seen.items()]


def pooled_benches(trials: Sequence[Trial], records: Iterable[RequestRecord]
                   ) -> tuple[BenchResult | None, BenchResult | None]:
    """(single, sweep) pooled over the trials given (callers pass counted_trials' first list). `records` is read
    once, one at a time (a run directory's file: memory stays flat), each folded into its pooled level's tally."""
    pairs_of = {kind: [(t.index, getattr(t, kind)) for t in trials if getattr(t, kind) is not None]
                for kind in ("single", "sweep")}
    tallies: dict[str, dict[str, LevelTally]] = {kind: {} for kind in pairs_of}
    takes: dict[tuple[int, str], list[str]] = {}  # (trial, tag) -> the kinds whose pooled level takes it
    for kind, pairs in pairs_of.items():
        if len(pairs) < 2:
            continue  # one trial: its own result, nothing to pool
        for index, bench in pairs:
            for level in bench.levels:
                takes.setdefault((index, level.tag), []).append(kind)
                tallies[kind].setdefault(level.tag, LevelTally(keep=False, count_window=False))
    for r in records:
        for kind in takes.get((r.trial, r.tag), ()):
            tallies[kind][r.tag].append(r)
    out: list[BenchResult | None] = []
    for kind, pairs in pairs_of.items():
        out.append(pooled_bench([b for _, b in pairs], tallies[kind], [i for i, _ in pairs]) if pairs else None)
    return out[0], out[1]


def run_headline(single: BenchResult | None, sweep: BenchResult | None) -> dict[str, Figure]:
    """A run's headline: single-stream figures from the single bench, peak figures from the sweep."""
    return {**(single.headline if single else {}),
            **({k: v for k, v in sweep.headline.items() if k.startswith("peak.")} if sweep else {})}
