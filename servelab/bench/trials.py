"""A cell measured as several trials, seen as one: which trials count, and their levels pooled by the same
definitions as one trial's (docs/metrics.md#trials).

- Which trials count: the quiet ones. A trial with a contended level (the machine was busy: host/environment.py)
  is left out whenever at least one trial of the cell was quiet; when every trial was contended they all count,
  and whatever is built from them says so.
- A pooled level (one tag over the trials that count): per-request figures (TTFT, ITL, decode tok/s, E2E, …) are
  computed over the requests of every trial together, exactly as bench/metrics.summarize computes them over one
  level's requests; aggregate rates (output tok/s, requests/s) are the tokens (requests) counted inside the
  trials' measurement windows over the windows' total length, i.e. the window-weighted mean of the trials' rates.
  A trial whose level was not measured (too short for a steady state) contributes no rate. What the GPUs did
  (docs/metrics.md#gpu-trials) pools as if the trials' windows were one: energies and token counts summed, the
  figures per token recomputed from the sums (bench/gpu_figures.py `pool_gpu`), over the trials whose GPU
  figures were measured.

With one trial, everything here returns that trial unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from servelab.bench.metrics import summarize
from servelab.bench.tally import LevelTally
from servelab.bench.steady import AGGREGATE_KEYS, is_measured
from servelab.records import BenchResult, Figure, RequestRecord, Step, Summary, Trial


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
    if any(b.search for b in benches):
        _pool_search(result, benches, trial_of)
    return result


def _pool_search(result: BenchResult, benches: Sequence[BenchResult], trial_of: Sequence[int]) -> None:
    """An SLO search over several trials: each trial searched on its own, so the answers (and the levels they
    were found at) differ. The pooled answer is the mean of the trials' answers, and the goodput (output tok/s,
    requests/s) at it the window-weighted mean of each trial's own at its answer, as aggregate rates pool
    (module docstring); `search.trials` keeps each trial's answer."""
    searches = [(trial, b) for trial, b in zip(trial_of, benches) if b.search]
    first = searches[0][1].search or {}
    by_rate = first.get("dimension") == "rate"
    key = "slo.max_rate" if by_rate else "slo.max_concurrency"
    answers = [(trial, b.search.get("best")) for trial, b in searches if b.search.get("best") is not None]
    for k in [k for k in result.headline if k.startswith("slo.")]:
        del result.headline[k]
    result.search = {"dimension": first.get("dimension"), "targets": first.get("targets"),
                     "best": sum(v for _, v in answers) / len(answers) if answers else None,
                     "trials": [{"trial": trial, "best": b.search.get("best"),
                                 "lowest_failing": b.search.get("lowest_failing"),
                                 "stop_reason": b.search.get("stop_reason")} for trial, b in searches]}
    if not answers:
        return
    each = ", ".join(f"{v:g}" for _, v in answers)
    result.headline[key] = Figure(value=result.search["best"], unit="req/s" if by_rate else "streams",
                                  definition="slo-search", note=f"mean of {len(answers)} trials' answers ({each}); "
                                                                f"targets {first.get('targets')}")
    for name in ("goodput_req_s", "output_tok_s", "request_s"):
        parts = [(b.headline[f"slo.{name}"], _answer_window(b)) for _, b in searches if f"slo.{name}" in b.headline
                 and b.headline[f"slo.{name}"].value is not None]
        total = sum(w for _, w in parts)
        if parts and total > 0:
            value = sum(f.value * w for f, w in parts) / total  # type: ignore[operator]
            result.headline[f"slo.{name}"] = parts[0][0].model_copy(update={
                "value": value, "dist": None, "note": f"window-weighted mean of {len(parts)} trials at their "
                                                      f"answers ({', '.join(f'{f.value:,.2f}' for f, _ in parts)})"})


def _answer_window(bench: BenchResult) -> float:
    """The window of the level a bench's SLO search answered with (0 when none)."""
    search = bench.search or {}
    by_rate = search.get("dimension") == "rate"
    level = next((s for s in bench.levels if s.slo and s.slo.get("passed") and is_measured(s)
                  and (s.rate if by_rate else s.concurrency) == search.get("best")), None)
    return level.window_s if level is not None else 0.0


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
        lacking = [(trial, s.figures[key]) for s, trial in zip(levels, trials) if is_measured(s)
                   and key in s.figures and s.figures[key].value is None]
        if lacking:  # a mean over the other trials would be a different figure, silently
            trial, figure = lacking[0]
            pooled.figures[key] = template.model_copy(update={
                "value": None, "dist": None,
                "note": f"not measured in trial {trial + 1}: {figure.note or 'no value'}"})
            continue
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
    pool_gpu_figures(pooled, levels)
    return pooled


def pool_gpu_figures(pooled: Summary, levels: Sequence[Summary]) -> None:
    """The GPU summary and figures of one tag's levels over several trials (docs/metrics.md#gpu-trials); nothing
    when no trial's level has a GPU summary (files from before GPU telemetry)."""
    from servelab.bench.gpu_figures import gpu_level_figures, pool_gpu

    summaries = [s.gpu for s in levels if s.gpu is not None]
    if not summaries:
        return
    pooled.gpu = pool_gpu(summaries)
    output = pooled.figures.get("output_tok_s")
    pooled.figures.update(gpu_level_figures(pooled.gpu, counted_by=output.counted_by if output else None,
                                            unary="items_s" in pooled.figures))


def _merged_warnings(levels: Sequence[Summary], trials: Sequence[int]) -> list[str]:
    seen: dict[str, list[int]] = {}
    for s, trial in zip(levels, trials):
        for w in s.warnings:
            seen.setdefault(w, []).append(trial)
    return [w if len(ts) == len(levels) else f"trial {', '.join(str(t + 1) for t in ts)}: {w}"
            for w, ts in seen.items()]


def pooled_steps(trials: Sequence[Trial], records: Iterable[RequestRecord]) -> list[Step]:
    """Each step pooled over the trials given that ran it (callers pass counted_trials' first list), in the order
    the steps first appear. `records` is read once, one at a time (a run directory's file: memory stays flat),
    each folded into the tally of its step's pooled level (a trial's steps never share a tag: see
    experiment/model.py)."""
    names: list[str] = []
    for trial in trials:
        names += [s.name for s in trial.steps if s.name not in names]
    pairs_of = {name: [(t.index, b) for t in trials if (b := t.step(name)) is not None] for name in names}
    tallies: dict[str, dict[str, LevelTally]] = {name: {} for name in names}
    takes: dict[tuple[int, str], list[str]] = {}  # (trial, tag) -> the steps whose pooled level takes it
    for name, pairs in pairs_of.items():
        if len(pairs) < 2:
            continue  # one trial: its own result, nothing to pool
        for index, bench in pairs:
            for level in bench.levels:
                takes.setdefault((index, level.tag), []).append(name)
                tallies[name].setdefault(level.tag, LevelTally(keep=False, count_window=False))
    if takes:
        for r in records:
            for name in takes.get((r.trial, r.tag), ()):
                tallies[name][r.tag].append(r)
    return [Step(name=name, result=pooled_bench([b for _, b in pairs], tallies[name], [i for i, _ in pairs]))
            for name, pairs in pairs_of.items() if pairs]


def pooled_benches(trials: Sequence[Trial], records: Iterable[RequestRecord]
                   ) -> tuple[BenchResult | None, BenchResult | None]:
    """(single, sweep) pooled over the trials given: pooled_steps' single-stream step and sweep (or what ran in
    its place)."""
    pooled = Trial(index=0, steps=pooled_steps(trials, records))
    return pooled.single, pooled.sweep


def run_headline(steps: Sequence[Step]) -> dict[str, Figure]:
    """A run's headline: single-stream figures from the single-stream step, and from each other step, in order,
    its figures other than single-stream ones that no earlier step gave (the sweep's peak figures, an SLO search's
    answer and goodput)."""
    out: dict[str, Figure] = {}
    for step in steps:
        if step.result.mode == "single":
            out.update({k: v for k, v in step.result.headline.items() if k not in out})
            continue
        out.update({k: v for k, v in step.result.headline.items()
                    if not k.startswith("single.") and k not in out})
    return out
