"""What the GPUs did, in `compare`: energy per token (lower is better) and tokens per joule (higher) at the peak and
single-stream levels, with hierarchical intervals whose width grows with the trials' disagreement, a verdict, and
"not measured" (never 0) for a run without GPU figures."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from gpu_runs import readings, with_gpu, without_gpu, write_series
from servelab.compare.compare import compare_runs
from servelab.compare.metrics import KEY_METRICS, peak_level
from servelab.compare.sources import from_summary
from servelab.host.gpu_telemetry.sampler import SERIES_FILE
from servelab.report.compare_terminal import render_comparison
from synthetic_runs import synthetic_run

GPU_KEYS = ["peak.j_per_output_token", "peak.output_tokens_per_j", "single.j_per_output_token",
            "single.output_tokens_per_j"]


def _run(run_id: str, powers: list[float], seed: int, run_dir: Path | None = None):
    """A run of len(powers) trials, trial i's GPUs (2) drawing powers[i] W each."""
    summary, records = synthetic_run(run_id, trials=len(powers), seed=seed)
    for trial, power in zip(summary.trials, powers):
        for level in trial.levels:
            with_gpu(level, power_w=power)
    return from_summary(summary, records, run_id, run_id, run_dir=run_dir)


def _no_gpu(run_id: str, seed: int):
    summary, records = synthetic_run(run_id, trials=2, seed=seed)
    for trial in summary.trials:
        for level in trial.levels:
            without_gpu(level)
    return from_summary(summary, records, run_id, run_id)


def _row(comparison, key: str):
    return next(r for r in comparison.rows if r.key == key)


def test_energy_per_token_gets_an_interval_and_a_verdict() -> None:
    base, hungry = _run("base", [300.0, 300.0], seed=1), _run("hungry", [450.0, 450.0], seed=2)
    comparison = compare_runs([base, hungry])
    assert [r.key for r in comparison.rows if r.key in GPU_KEYS] == GPU_KEYS
    j = _row(comparison, "peak.j_per_output_token")
    level = peak_level(base)
    assert j.figures[0].value == pytest.approx(level.gpu.energy_j / level.gpu.output_tokens)
    assert j.figures[0].ci[0] < j.figures[0].value < j.figures[0].ci[1]
    assert not j.higher_is_better and j.ratios[1].ratio == pytest.approx(1.5, rel=0.1)
    assert j.ratios[1].verdict == "worse" and j.ratios[1].ci[0] > 1
    per_j = _row(comparison, "peak.output_tokens_per_j")
    assert per_j.higher_is_better and per_j.ratios[1].verdict == "worse" and per_j.ratios[1].ci[1] < 1
    assert any("energy per output token at peak" in v and "worse" in v for v in comparison.verdicts)


def test_trials_that_disagree_widen_the_interval() -> None:
    steady = _run("steady", [300.0, 300.0, 300.0], seed=3)
    swinging = _run("swinging", [150.0, 300.0, 450.0], seed=3)  # same requests, same mean power
    comparison = compare_runs([steady, swinging])
    row = _row(comparison, "peak.j_per_output_token")
    (lo0, hi0), (lo1, hi1) = row.figures[0].ci, row.figures[1].ci
    assert row.figures[1].value == pytest.approx(row.figures[0].value, rel=1e-6)
    assert (hi1 - lo1) > 3 * (hi0 - lo0)
    assert row.figures[1].trials == 3 and len(set(round(v, 6) for v in row.figures[1].trial_values)) == 3
    assert row.ratios[1].verdict in ("within noise", "inconsistent")


def test_a_run_without_gpu_figures_is_not_measured_never_zero() -> None:
    measured, bare = _run("gpu", [300.0, 300.0], seed=1), _no_gpu("cpu", seed=2)
    for runs, missing in (([measured, bare], 1), ([bare, measured], 0)):  # shown whichever side lacks it
        comparison = compare_runs(runs)
        row = _row(comparison, "peak.j_per_output_token")
        fig = row.figures[missing]
        assert fig.value is None and fig.note.startswith("not measured: no GPU telemetry source")
        assert row.ratios[1].verdict == "missing" and row.ratios[1].ratio is None
        assert "not measured: no GPU telemetry source" in row.ratios[1].reason
    console = Console(file=io.StringIO(), width=80, color_system=None)
    render_comparison(console, compare_runs([measured, bare]))
    text = console.file.getvalue()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    assert "  cpu: not measured: no GPU telemetry source" in text
    both_bare = compare_runs([bare, _no_gpu("cpu2", seed=3)])
    assert not any(r.key in GPU_KEYS for r in both_bare.rows)  # no row of blanks


def test_with_the_gpu_series_each_bins_energy_is_read_from_it(tmp_path: Path) -> None:
    """The run directory's series gives each time bin its own energy: the point is still the level's figure."""
    summary, records = synthetic_run("series", trials=2, seed=4)
    run_dir = tmp_path / "series"
    run_dir.mkdir()
    start = min(r.t_send_ns for r in records)
    span_s = (max(r.t_end_ns for r in records) - start) / 1e9
    write_series(run_dir / SERIES_FILE, readings(span_s, gpus=2, power_w=300.0, start_ns=start))
    for trial in summary.trials:
        for level in trial.levels:
            with_gpu(level, power_w=300.0)
    with_series = from_summary(summary, records, "series", "series", run_dir=run_dir)
    sampler = KEY_METRICS["peak.j_per_output_token"].resampler(with_series)
    level = peak_level(with_series)
    assert sampler.point() == pytest.approx(level.figures["j_per_output_token"].value)
    # 300 W on each of 2 GPUs in every bin: each bin's energy is 600 W times its width
    part = sampler.parts[0]
    bin_s = level.window_s / 2 / len(part.units)  # the pooled window is both trials'
    assert all(j == pytest.approx(600.0 * bin_s, rel=0.02) for j, _ in part.units)
