"""A cell's trials pooled (bench/trials.py): what the GPUs did pools as one window over the trials whose GPUs were
measured, energy and tokens summed (docs/metrics.md#gpu-trials), so the pooled J/token is Σ energy ÷ Σ tokens, not
the mean of the trials' J/token."""

from __future__ import annotations

import pytest

from gpu_runs import output_tokens, with_gpu, without_gpu
from servelab.bench.trials import pooled_steps
from synthetic_runs import synthetic_run


def _pooled_sweep(powers: list[float | None]):
    summary, records = synthetic_run("trials", trials=len(powers), seed=7)
    for trial, power in zip(summary.trials, powers):
        for level in trial.levels:
            with_gpu(level, power_w=power) if power is not None else without_gpu(level)
    steps = pooled_steps(summary.trials, records)
    return summary, next(s.result for s in steps if s.name == "sweep")


def test_pooled_energy_per_token_is_total_energy_over_total_tokens() -> None:
    summary, sweep = _pooled_sweep([200.0, 400.0])
    for pooled in sweep.levels:
        parts = [next(s for s in t.levels if s.tag == pooled.tag) for t in summary.trials]
        energy = sum(2 * p * s.window_s for p, s in zip((200.0, 400.0), parts))
        tokens = sum(output_tokens(s) for s in parts)
        assert pooled.gpu.measured and pooled.gpu.energy_j == pytest.approx(energy)
        assert pooled.gpu.output_tokens == tokens
        assert pooled.figures["j_per_output_token"].value == pytest.approx(energy / tokens)
        assert pooled.figures["output_tokens_per_j"].value == pytest.approx(tokens / energy)
        window = sum(s.window_s for s in parts)
        assert pooled.figures["gpu_power_w_mean"].value == pytest.approx(energy / window)


def test_a_trial_without_gpu_figures_is_left_out_and_said() -> None:
    summary, sweep = _pooled_sweep([300.0, None])
    for pooled in sweep.levels:
        only = next(s for s in summary.trials[0].levels if s.tag == pooled.tag)
        assert pooled.figures["j_per_output_token"].value == pytest.approx(only.gpu.j_per_output_token)
    _, bare = _pooled_sweep([None, None])
    for pooled in bare.levels:
        assert not pooled.gpu.measured and pooled.figures["j_per_output_token"].value is None
        assert pooled.figures["j_per_output_token"].note.startswith("not measured: no GPU telemetry source")


def test_levels_from_before_gpu_telemetry_pool_without_a_gpu_summary() -> None:
    summary, records = synthetic_run("old", trials=2, seed=7)
    sweep = next(s.result for s in pooled_steps(summary.trials, records) if s.name == "sweep")
    assert all(level.gpu is None and "j_per_output_token" not in level.figures for level in sweep.levels)
