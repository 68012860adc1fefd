"""Pooling a level's GPU figures over trials (docs/metrics.md#gpu-trials) against known truth: the pooled energy
is the sum of the trials' own (each over its engine's GPUs), a GPU is pooled over the trials in which it was the
engine's, and energy per token divides the energy and the tokens of the same trials."""

from __future__ import annotations

import pytest

from servelab.bench.gpu_figures import gpu_level_figures, pool_gpu, summarize_gpu
from servelab.records import GpuReading

S = 1_000_000_000
DT = S // 4


def gpu_series(t0_s: float, watts: float, gpu: int, pids: tuple[int, ...]) -> list[GpuReading]:
    """Readings from t0 - 1 s to t0 + 11 s: constant power, an energy counter that is its exact integral."""
    return [GpuReading(t_ns=int(t0_s * S) - S + k * DT, gpu=gpu, power_w=watts,
                       energy_mj=watts * (int(t0_s * S) - S + k * DT) / 1e6, processes=pids) for k in range(49)]


def trial(t0_s: float, gpus: dict[int, tuple[float, tuple[int, ...]]], tokens: int | None, answer=None):
    readings = sorted((r for g, (w, pids) in gpus.items() for r in gpu_series(t0_s, w, g, pids)),
                      key=lambda r: (r.t_ns, r.gpu))
    return summarize_gpu(readings, window=(int(t0_s * S), int((t0_s + 10) * S)), output_tokens=tokens,
                         answer_tokens=answer, source="nvml", interval_s=0.25, engine_pids={1})


def test_a_gpu_that_was_not_the_engine_s_in_one_trial_counts_only_where_it_was() -> None:
    # trial A: the engine on GPU 0 (100 W), pid 9 alone on GPU 1 (300 W); trial B: the engine on both (100 W)
    a = trial(0, {0: (100.0, (1,)), 1: (300.0, (9,))}, tokens=500)
    b = trial(100, {0: (100.0, (1,)), 1: (100.0, (1,))}, tokens=1000)
    assert a.energy_j == pytest.approx(1000.0) and b.energy_j == pytest.approx(2000.0)
    pooled = pool_gpu([a, b])
    assert pooled.energy_j == pytest.approx(3000.0)  # before, 6000 J: GPU 1's 3000 J of pid 9 counted
    assert pooled.j_per_output_token == pytest.approx(2.0)
    assert pooled.power_w_mean == pytest.approx(150.0)
    gpu1 = next(g for g in pooled.gpus if g.gpu == 1)
    assert gpu1.engine and gpu1.energy_j == pytest.approx(1000.0) and gpu1.power_w_mean == pytest.approx(100.0)


def test_a_gpu_never_the_engine_s_stays_out_of_the_pooled_sums() -> None:
    a = trial(0, {0: (100.0, (1,)), 1: (300.0, (9,))}, tokens=500)
    b = trial(100, {0: (100.0, (1,)), 1: (300.0, (9,))}, tokens=500)
    pooled = pool_gpu([a, b])
    assert pooled.energy_j == pytest.approx(2000.0)
    assert not next(g for g in pooled.gpus if g.gpu == 1).engine


def test_a_trial_whose_level_counted_no_tokens_leaves_its_energy_out_of_energy_per_token() -> None:
    c = trial(0, {0: (100.0, (1,))}, tokens=None)  # its level was not steady-state measured
    d = trial(100, {0: (100.0, (1,))}, tokens=500, answer=250)
    e = trial(200, {0: (100.0, (1,))}, tokens=500, answer=250)
    pooled = pool_gpu([c, d, e])
    figs = gpu_level_figures(pooled)
    assert figs["j_per_output_token"].value == pytest.approx(2.0)  # before: not measured
    assert figs["output_tokens_per_j"].value == pytest.approx(0.5)
    assert figs["j_per_answer_token"].value == pytest.approx(4.0)
    assert pooled.energy_j == pytest.approx(3000.0) and pooled.power_w_mean == pytest.approx(100.0)
    assert pooled.output_tokens == 1000
    assert any("energy per token over 2 of the 3 trials" in n for n in pooled.notes)


def test_a_trial_without_energy_leaves_the_pooled_energy_not_measured() -> None:
    a = trial(0, {0: (100.0, (1,))}, tokens=500)
    b = trial(100, {0: (100.0, (1,))}, tokens=500).model_copy(update={"energy_j": None})
    pooled = pool_gpu([a, b])
    assert pooled.energy_j is None and pooled.power_w_mean is None
    assert pooled.j_per_output_token == pytest.approx(2.0)  # over the trial with both
