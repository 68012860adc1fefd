"""`compare`: key figures side by side, ratios to the baseline with bootstrap intervals, and a verdict per figure.

The first run is the baseline. A verdict is direction-aware (more tok/s is better, fewer ms is better) and only
says better or worse when the whole 95 % interval of the ratio lies on one side of 1; otherwise the difference is
within noise. Method and caveats: docs/metrics.md#comparing-runs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from servelab import SCHEMA_VERSION
from servelab.compare.bootstrap import (CONFIDENCE, RESAMPLES, Interval, Trials, figure_interval,
                                         ratio_interval)
from servelab.compare.comparability import comparability_warnings
from servelab.compare.image_groups import ImageGroupRow, image_group_rows
from servelab.compare.metrics import KEY_METRICS, KeyMetric, run_reasoning_share
from servelab.compare.run_data import RunData
from servelab.errors import UserError

# better / worse: the whole interval on one side of 1 and every trial agreeing; inconsistent: the interval is on
# one side but the trials are not; contended: a run's only trials were measured on a busy machine, so no
# direction is claimed (docs/metrics.md#verdicts).
# different levels: the figure was read at a different load in each run (TTFT at the top concurrency, c64 against
# c4), so the ratio is shown and no verdict is given.
# too few trials: the interval (or the trials) lean one way, but a side rests on fewer than MIN_CLEAN_TRIALS
# trials that ran to the end on a quiet machine: one trial has no between-run variation behind it, so no
# direction is claimed (the reason says how many there were).
# definition differs: a figure read from another tool's result (compare/peers) whose definition is not servelab's
# (its TTFT starts at another chunk, its ITL is per chunk, its throughput window includes the tail, …): the ratio is
# shown, never a verdict.
Verdict = Literal["baseline", "better", "worse", "within noise", "inconsistent", "contended", "too few trials",
                  "different levels", "definition differs", "no interval", "missing"]

# A better/worse verdict needs at least this many clean trials (complete, on a quiet machine) on each side that
# servelab measured; literal figures and other tools' files are one fixed reference and need none.
MIN_CLEAN_TRIALS = 2


def fmt_ratio(r: float) -> str:
    """A ratio for people: two decimals (0.13, 38.00), or two significant digits below 0.1 (0.0033, not 0.00)."""
    return f"{r:.2f}" if abs(r) >= 0.1 or r == 0 else f"{r:.2g}"


class FigureCell(BaseModel):
    value: float | None
    ci: tuple[float, float] | None = None  # the figure's own 95 % interval
    n: int | None = None  # units resampled: requests, or time bins for throughput
    where: str | None = None  # the level it was measured at, for figures whose level can differ between runs
    trials: int | None = None  # trials resampled (hierarchical bootstrap); None for a literal figure
    trial_values: list[float] = Field(default_factory=list)  # the figure of each trial that counts
    # Another tool's figure (compare/peers): the field it was read from, and how its definition differs from
    # servelab's when it does (None: the same definition).
    source: str | None = None
    definition_differs: str | None = None
    note: str | None = None  # why there is no value ("not measured: no GPU telemetry source"), where it is known


class RatioCell(BaseModel):
    ratio: float | None
    ci: tuple[float, float] | None = None  # 95 % interval of the ratio to the baseline
    verdict: Verdict
    # The ratio trial by trial: paired by round for runs of one interleaved experiment, else each trial against
    # the baseline's pooled figure. The verdict needs them to agree.
    trial_ratios: list[float] = Field(default_factory=list)
    reason: str | None = None  # why there is no verdict, in words, where the verdict alone does not say it


class Row(BaseModel):
    key: str
    label: str
    unit: str
    higher_is_better: bool
    definition: str
    neutral: bool = False  # neither better nor worse, only different (the reasoning share): no verdict
    figures: list[FigureCell]  # one per run, the baseline first
    ratios: list[RatioCell]  # one per run, the baseline's says "baseline"


class RunRef(BaseModel):
    name: str
    ref: str
    status: str
    literal: bool
    representative: bool
    serious: list[str] = Field(default_factory=list)
    trials: int = 1  # trials whose figures count
    excluded_trials: list[int] = Field(default_factory=list)  # contended trials left out (1-based)
    contended: bool = False  # every trial that counts was contended
    peer: dict | None = None  # another tool's result: tool, version, path, per_request, definitions, notes


class Comparison(BaseModel):
    schema_version: int = SCHEMA_VERSION
    baseline: str
    runs: list[RunRef]
    rows: list[Row]
    warnings: list[str] = Field(default_factory=list)
    verdicts: list[str] = Field(default_factory=list)  # one sentence per finding, for people
    # Chat with images: each run's single-stream requests by image count and size, side by side, without a verdict
    # (compare/image_groups.py); empty when no run's single-stream level sent images.
    image_groups: list[ImageGroupRow] = Field(default_factory=list)
    method: str = (f"hierarchical bootstrap, {RESAMPLES} resamples, {CONFIDENCE:.0%} percentile intervals: trials "
                   f"resampled, then requests (time bins for throughput) within each; better/worse only when "
                   f"every trial agrees (docs/metrics.md#comparing-runs)")


class NoCommonMetrics(UserError):
    pass


def compare_runs(runs: list[RunData]) -> Comparison:
    """Compare runs[1:] to runs[0]. Raises NoCommonMetrics when no key figure is in the baseline and another run."""
    if len(runs) < 2:
        raise UserError("compare needs at least two runs (or a run and --baseline figures)")
    _unique_names(runs)
    baseline, others = runs[0], runs[1:]
    samplers = [{k: (metric.resampler(run) if metric.resampler and not run.literal else None)
                 for k, metric in KEY_METRICS.items()} for run in runs]
    rows: list[Row] = []
    thought = any((run_reasoning_share(run) or 0) > 0 for run in runs)
    for key, metric in KEY_METRICS.items():
        if metric.reasoning_only and not thought:
            continue
        if metric.why_none is not None:  # shown when any run has it; the others say why they have not
            if all(metric.value(run) is None for run in runs):
                continue
        elif metric.value(baseline) is None or all(metric.value(run) is None for run in others):
            continue
        figures = [_figure_cell(run, metric, samplers[i][key]) for i, run in enumerate(runs)]
        ratios = [RatioCell(ratio=1.0, verdict="baseline")]
        for i, run in enumerate(others, start=1):
            ratios.append(_ratio_cell(metric, baseline, run, samplers[0][key], samplers[i][key]))
        rows.append(Row(key=key, label=metric.label, unit=metric.unit, higher_is_better=metric.higher_is_better,
                        definition=metric.definition, figures=figures, ratios=ratios, neutral=metric.neutral))
    if not rows:
        names = ", ".join(r.name for r in others)
        raise NoCommonMetrics(f"no common metrics: {baseline.name} and {names} share none of "
                              f"{', '.join(KEY_METRICS)}")
    comparison = Comparison(
        baseline=baseline.name, rows=rows, warnings=comparability_warnings(baseline, others),
        runs=[RunRef(name=r.name, ref=r.ref, status=r.status, literal=r.literal, representative=not r.serious,
                     serious=[f"{f.setting}: {f.why}" for f in r.serious], trials=0 if r.literal else len(r.counted),
                     excluded_trials=[i + 1 for i in r.excluded], contended=r.all_contended,
                     peer=r.peer.model_dump() if r.peer is not None else None) for r in runs])
    comparison.warnings += trial_warnings(runs)
    comparison.warnings += peer_warnings(runs, rows)
    _mark_definitions(rows)
    for i, run in enumerate(others, start=1):
        if not any(row.figures[i].value is not None for row in rows):
            comparison.warnings.append(f"{run.name} has none of the figures the baseline has")
    for row in rows:
        places = {f.where for f in row.figures if f.where}
        if len(places) > 1:
            comparison.warnings.append(f"{row.label}: measured at different levels ({', '.join(sorted(places))}): "
                                       f"the runs carried different loads, so no verdict is given")
            base_where = row.figures[0].where
            for fig, cell in zip(row.figures[1:], row.ratios[1:]):
                if fig.where and base_where and fig.where != base_where and cell.ratio is not None:
                    cell.verdict = "different levels"
    comparison.image_groups = image_group_rows(runs)
    comparison.verdicts = verdict_sentences(comparison)
    return comparison


def trial_warnings(runs: list[RunData]) -> list[str]:
    """What the trials behind the comparison can and cannot show."""
    out: list[str] = []
    measured = [r for r in runs if not r.literal and r.peer is None]
    if measured and all(len(r.counted) <= 1 for r in measured):
        out.append("one trial per run: the intervals cover the variation between requests within each run, not "
                   "between runs (other work on the machine, CPU frequency, the order the runs ran in), so no "
                   "better/worse verdict is given; repeat the runs, interleaved (`trials:` in an experiment)")
    for r in measured:
        if r.excluded:
            out.append(f"{r.name}: trial(s) {', '.join(str(i + 1) for i in r.excluded)} ran on a contended machine "
                       f"and are left out ({_contention_reason(r, r.excluded[0])})")
        if r.all_contended:
            out.append(f"{r.name}: every trial ran on a contended machine ({_contention_reason(r, r.counted[0])}): "
                       f"its figures are shown, but no verdict rests on them")
    return out


def _mark_definitions(rows: list[Row]) -> None:
    """A figure defined differently in a peer's file (or the baseline's) gets no verdict: its ratio is shown and
    marked "definition differs"."""
    for row in rows:
        base_differs = row.figures[0].definition_differs is not None
        for fig, cell in zip(row.figures[1:], row.ratios[1:]):
            if (base_differs or fig.definition_differs is not None) and cell.ratio is not None:
                cell.verdict = "definition differs"


def peer_warnings(runs: list[RunData], rows: list[Row]) -> list[str]:
    """What each peer's file is, and for each figure shown whose definition differs from servelab's, how."""
    out: list[str] = []
    shown = {row.key for row in rows}
    for run in runs:
        peer = run.peer
        if peer is None:
            continue
        version = f" {peer.version}" if peer.version else ""
        basis = ("per-request data, so intervals on its side" if peer.per_request else
                 "summary figures only: no records, so no interval on its side, like literal figures")
        out.append(f"{run.name} comes from {peer.tool}{version} ({peer.path}): {basis}; its workload was not "
                   f"set by servelab and cannot be checked against the others'"
                   + (f" ({'; '.join(peer.notes)})" if peer.notes else ""))
        for d in peer.definitions:
            if not d.matches and d.key in shown:
                out.append(f"{run.name}: {KEY_METRICS[d.key].label} is defined differently ({d.theirs}: {d.why}), "
                           f"so it gets no verdict")
    return out


def _contention_reason(run: RunData, trial: int) -> str:
    found = run.trial(trial)
    if found is None or not found.contended_levels:
        return "contended"
    level = found.contended_levels[0]
    reasons = [*(level.environment.reasons if level.environment and level.environment.contended else []),
               *(level.gpu.reasons if level.gpu and level.gpu.contended else [])]
    return f"trial {trial + 1}, {level.tag}: " + ("; ".join(reasons) or "contended")


def _unique_names(runs: list[RunData]) -> None:
    """Two runs of the same cell (two experiments) would share a label: add their experiment (the shortest part
    of the ref that tells them apart), or the whole ref where that is shared too."""
    names = [r.name for r in runs]
    origins = [r.experiment_id or r.ref.split("/")[0] for r in runs]
    for run, origin in zip(runs, origins):
        if names.count(run.name) > 1:
            same = sum(1 for n, o in zip(names, origins) if n == run.name and o == origin)
            run.name = f"{run.name} ({origin if same == 1 and origin != run.name else run.ref})"


def _figure_cell(run: RunData, metric: KeyMetric, sampler) -> FigureCell:
    ci = figure_interval(sampler, f"{run.ref}:{metric.key}") if sampler is not None else None
    definition = run.peer.definition(metric.key) if run.peer is not None else None
    differs = None
    if run.peer is not None and metric.value(run) is not None:
        differs = (definition.why if definition is None or not definition.matches else None) if definition \
            else f"{run.peer.tool} has no figure defined as servelab's"
    return FigureCell(value=metric.value(run), ci=(ci.low, ci.high) if ci else None,
                      source=f"{run.peer.tool}: {definition.theirs}" if definition else None,
                      definition_differs=differs,
                      n=sampler.n if sampler is not None else None,
                      where=metric.where(run) if metric.where and not run.literal else None,
                      trials=sampler.trials if isinstance(sampler, Trials) else None,
                      trial_values=sampler.trial_points() if isinstance(sampler, Trials) else [],
                      note=metric.why_none(run) if metric.why_none is not None and metric.value(run) is None
                      else None)


def _ratio_cell(metric: KeyMetric, baseline: RunData, run: RunData, base_sampler, sampler) -> RatioCell:
    base, value = metric.value(baseline), metric.value(run)
    if base is None or value is None or base == 0:
        why = next((metric.why_none(r) for r in (baseline, run) if metric.why_none is not None
                    and metric.value(r) is None), None)
        return RatioCell(ratio=None, verdict="missing", reason=f"{baseline.name if base is None else run.name}: "
                                                               f"{why}" if why else None)
    ci: Interval | None = None
    if sampler is not None:
        if baseline.literal or base_sampler is None and baseline.peer is not None:
            # literal figures, or a peer's file with summaries only: no noise of their own on the baseline side
            ci = ratio_interval(sampler, base, f"{baseline.ref}:{run.ref}:{metric.key}")
        elif base_sampler is not None:
            ci = ratio_interval(sampler, base_sampler, f"{baseline.ref}:{run.ref}:{metric.key}")
    elif run.peer is not None and base_sampler is not None:
        # a peer's summary figure against a measured baseline: the interval is the baseline's noise alone
        inverse = ratio_interval(base_sampler, value, f"{baseline.ref}:{run.ref}:{metric.key}")
        if inverse is not None and inverse.low > 0:
            ci = Interval(1 / inverse.high, 1 / inverse.low)
    trial_ratios = _trial_ratios(baseline, run, base, base_sampler, sampler)
    verdict = judge(ci, metric, trial_ratios)
    reason = None
    if verdict in ("better", "worse", "inconsistent") and (run.all_contended or baseline.all_contended):
        verdict = "contended"
    elif verdict in ("better", "worse", "inconsistent"):
        reason = too_few_trials(baseline, run)
        if reason is not None:
            verdict = "too few trials"
    return RatioCell(ratio=value / base, ci=(ci.low, ci.high) if ci else None, verdict=verdict,
                     trial_ratios=trial_ratios, reason=reason)


def too_few_trials(baseline: RunData, run: RunData) -> str | None:
    """"no verdict: N clean trial(s) (…)" when a side servelab measured has fewer than MIN_CLEAN_TRIALS clean
    trials; None when both have enough."""
    short = [(r, n) for r in (baseline, run) if (n := r.clean_trials) is not None and n < MIN_CLEAN_TRIALS]
    if not short:
        return None
    fewest = min(n for _, n in short)
    sides = "; ".join(f"{r.name}: {n} of {len(r.trials) or 1}" for r, n in short)
    return (f"no verdict: {fewest} clean trial{'' if fewest == 1 else 's'} ({sides}; a verdict needs "
            f"{MIN_CLEAN_TRIALS} on each side)")


def _trial_ratios(baseline: RunData, run: RunData, base: float, base_sampler, sampler) -> list[float]:
    """Each trial's ratio: paired by round when both runs ran interleaved in one experiment with the same trials,
    else each of the run's trials against the baseline's pooled figure."""
    base_trials = base_sampler.trials if isinstance(base_sampler, Trials) else 1
    if not isinstance(sampler, Trials) or max(sampler.trials, base_trials) < 2:
        return []  # one trial on each side: no trial to agree or disagree
    mine = sampler.trial_points()
    if isinstance(base_sampler, Trials):
        theirs = base_sampler.trial_points()
        if baseline.experiment_id is not None and baseline.experiment_id == run.experiment_id:
            # one interleaved experiment: trial i of each cell ran in round i, side by side
            a, b = sampler.points_by_trial(), base_sampler.points_by_trial()
            rounds = sorted(set(a) & set(b))
            if len(rounds) >= 2:
                return [a[i] / b[i] for i in rounds if b[i]]
        if len(mine) == 1:  # one trial against several: it against each baseline trial
            return [mine[0] / b for b in theirs if b]
    return [a / base for a in mine]


def judge(ci: Interval | None, metric: KeyMetric, trial_ratios: list[float] | None = None) -> Verdict:
    if ci is None:
        return "no interval"
    ratios = trial_ratios or []
    above, below = sum(1 for r in ratios if r > 1), sum(1 for r in ratios if r < 1)
    if ci.low > 1 or ci.high < 1:
        if ratios and (above and below):
            return "inconsistent"
        good = ci.low > 1 if metric.higher_is_better else ci.high < 1
        return "better" if good else "worse"
    return "within noise"


def regressions(comparison: Comparison, pct: float) -> list[str]:
    """Figures worse than the baseline by more than `pct` percent beyond noise: the interval's bound nearest to no
    change is itself past the threshold. A figure without an interval is judged on its value (and says so)."""
    found: list[str] = []
    for row in comparison.rows:
        if row.neutral:
            continue
        for run, cell in zip(comparison.runs[1:], row.ratios[1:]):
            if cell.ratio is None or cell.verdict in ("different levels", "definition differs"):
                continue  # not the same load, or not the same figure: not a regression
            if row.higher_is_better:
                nearest = cell.ci[1] if cell.ci else cell.ratio
                regressed = nearest < 1 - pct / 100
            else:
                nearest = cell.ci[0] if cell.ci else cell.ratio
                regressed = nearest > 1 + pct / 100
            if regressed:
                change = abs(1 - nearest) * 100
                basis = "even at the edge of its 95 % interval" if cell.ci else "no interval: judged on the value"
                found.append(f"{run.name}: {row.label} is {change:.1f} % worse than {comparison.baseline} "
                             f"({basis}; threshold {pct:g} %)")
    return found


def verdict_sentences(comparison: Comparison) -> list[str]:
    """What a person should take away: each run's figures that differ beyond noise, and which runs are not
    representative."""
    out: list[str] = []
    for i, run in enumerate(comparison.runs[1:], start=1):
        parts = []
        for row in comparison.rows:
            cell = row.ratios[i]
            if cell.verdict in ("better", "worse", "within noise", "inconsistent", "contended", "too few trials",
                                "different levels") and cell.ratio is not None and cell.ci is not None:
                lo, hi = cell.ci
                said = {"inconsistent": "inconsistent across trials", "contended": "no verdict (contended)",
                        "too few trials": cell.reason or "no verdict (too few clean trials)",
                        "different levels": f"no verdict (measured at {row.figures[i].where} vs "
                                            f"{row.figures[0].where})"}.get(cell.verdict, cell.verdict)
                per_trial = (", trials " + ", ".join(f"×{fmt_ratio(r)}" for r in cell.trial_ratios)
                             if cell.trial_ratios else "")
                parts.append(f"{row.label}: {said} (×{fmt_ratio(cell.ratio)}, 95 % CI ×{fmt_ratio(lo)}–"
                             f"×{fmt_ratio(hi)}{per_trial})")
        peak = next((row.ratios[i] for row in comparison.rows if row.key == "peak.output_tok_s"), None)
        if peak is not None and peak.verdict in ("better", "worse"):
            faster = "faster" if peak.verdict == "better" else "slower"
            out.append(f"{run.name} is {faster} than {comparison.baseline} at peak: ×{fmt_ratio(peak.ratio)} "
                       f"output tok/s")
        load = next((row for row in comparison.rows if row.key == "load.ttft_ms"), None)
        if load is not None and load.ratios[i].verdict in ("better", "worse"):
            faster = "faster" if load.ratios[i].verdict == "better" else "slower"
            where = load.figures[i].where or "the top level"
            out.append(f"{run.name} answers {faster} than {comparison.baseline} under load: TTFT p50 at {where} "
                       f"×{fmt_ratio(load.ratios[i].ratio)}")
        if parts:
            out.append(f"{run.name} vs {comparison.baseline}: " + "; ".join(parts))
    for run in comparison.runs:
        if not run.representative:
            out.append(f"{run.name} is NOT REPRESENTATIVE ({'; '.join(run.serious)})")
    return out
