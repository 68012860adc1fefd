"""The GPU figures per token are withheld exactly when output tok/s is (docs/metrics.md#gpu-j-per-token): they
divide by the tokens it counts, so a level judged not measured after its GPU figures were attached (a
single-stream level that stalled) loses its J/token and tok/J with its output tok/s; power stays."""

from __future__ import annotations

import pytest

from servelab.bench import steady
from servelab.bench.gpu_figures import summarize_gpu
from servelab.bench.gpu_run import attach_gpu
from servelab.bench.metrics import summarize
from servelab.records import GpuReading, SteadyState

S = 1_000_000_000


def level_with_gpu():
    readings = [GpuReading(t_ns=k * S // 4, gpu=0, power_w=100.0, energy_mj=100.0 * k / 4 * 1000,
                           sm_active_pct=50.0) for k in range(50)]
    gpu = summarize_gpu(readings, window=(S, 11 * S), output_tokens=20, answer_tokens=10, source="nvml",
                        interval_s=0.25)
    summary = summarize([], tag="single", mode="single", concurrency=1, window=(S, 11 * S))
    attach_gpu(summary, gpu)
    return summary


def test_a_level_that_stalls_after_its_gpu_figures_loses_its_figures_per_token() -> None:
    summary = level_with_gpu()
    assert summary.figures["j_per_output_token"].value == pytest.approx(50.0)
    steady.apply(summary, SteadyState(measured=False, ended_by="stalled", reason="the server stopped answering"))
    assert summary.figures["output_tok_s"].value is None
    for key in ("j_per_output_token", "j_per_answer_token", "output_tokens_per_j"):
        assert summary.figures[key].value is None  # before: 50 J/token on a level with no output tok/s
        assert summary.figures[key].note == "not measured: the server stopped answering"
    assert summary.gpu.output_tokens is None and summary.gpu.j_per_output_token is None
    assert summary.figures["gpu_power_w_mean"].value == pytest.approx(100.0)  # no tokens in it: kept
    assert summary.gpu.energy_j == pytest.approx(1000.0)


def test_a_measured_level_keeps_them() -> None:
    summary = level_with_gpu()
    steady.apply(summary, SteadyState(measured=True))
    assert summary.figures["j_per_output_token"].value == pytest.approx(50.0)
    assert summary.gpu.output_tokens == 20
