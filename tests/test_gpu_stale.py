"""GPU energy from a source that serves cached samples, and from a counter that does not move
(docs/metrics.md#gpu-stale): a DCGM exporter refreshes its values once per collect interval (30 s by default), so
at 4 Hz its energy counter moves in steps. Each value is stamped at the first reading that showed it; a source
that held one value for more than a tenth of the window leaves the energy, J/token and power "not measured"
with the exporter's refresh period and the fix, never 0 W nor a whole step in one window. A counter that did not
advance while the GPU drew power is not read: the energy comes from the power readings."""

from __future__ import annotations

import pytest

from servelab.bench.gpu_figures import gpu_level_figures, summarize_gpu
from servelab.records import GpuReading

S = 1_000_000_000
DT = S // 4
DCGM = "dcgm http://127.0.0.1:9400/metrics"


def cached(t0_s: float, t1_s: float, *, watts: float = 100.0, collect_s: float = 30.0,
           lag_s: float = 0.0) -> list[GpuReading]:
    """A 4 Hz scrape of an exporter that samples the GPU every `collect_s` (and serves that sample until the next):
    every value, power and energy, is the one of the last collect time."""
    out = []
    k = 0
    while k * DT <= t1_s * S - t0_s * S:
        t = int(t0_s * S) + k * DT
        sampled_ns = ((t - int(lag_s * S)) // int(collect_s * S)) * int(collect_s * S) + int(lag_s * S)
        out.append(GpuReading(t_ns=t, gpu=0, power_w=watts, energy_mj=watts * sampled_ns / 1e6, sm_active_pct=80.0))
        k += 1
    return out


def level(readings, window_s: tuple[float, float], source: str = DCGM, tokens: int = 1000):
    return summarize_gpu(readings, window=(int(window_s[0] * S), int(window_s[1] * S)), output_tokens=tokens,
                         answer_tokens=None, source=source, interval_s=0.25)


@pytest.mark.parametrize("window_s", [(31.0, 41.0), (25.0, 35.0), (55.0, 65.5)])
def test_an_exporter_that_refreshes_every_30_s_leaves_j_per_token_and_power_not_measured(window_s) -> None:
    # the truth is 100 W and 1.0 J/token; before, these windows read 0 J (0.0 W) or a whole 3000 J step
    s = level(cached(window_s[0] - 1, window_s[1] + 1), window_s)
    assert s.measured and s.energy_j is None and s.power_w_mean is None and s.j_per_output_token is None
    figs = gpu_level_figures(s)
    for key in ("j_per_output_token", "output_tokens_per_j", "gpu_power_w_mean"):
        assert figs[key].value is None
        assert "the DCGM exporter refreshes its values every" in figs[key].note
        assert "run it with -c 250" in figs[key].note
    assert any("refreshes its values every" in w for w in s.warnings)


def test_a_refresh_period_seen_whole_is_said_as_measured() -> None:
    s = level(cached(0, 40, collect_s=5.0), (10.0, 30.0))
    assert "every ~5 s, more than a tenth of the 20 s window" in gpu_level_figures(s)["j_per_output_token"].note


def test_an_exporter_run_with_a_short_collect_interval_is_measured_from_the_first_scrape_of_each_value() -> None:
    # -c 1000 on a 20 s window: each value is stamped at the scrape that first showed it, so the pairs follow the
    # counter's own sample times and the window gets its share of each step, not whole steps
    for lag in (0.0, 0.1, 0.3, 0.6, 0.9):
        s = level(cached(0, 30, collect_s=1.0, lag_s=lag), (5.1, 25.1), tokens=2000)
        assert s.energy_j == pytest.approx(2000.0, rel=0.02), lag
        assert s.power_w_mean == pytest.approx(100.0, rel=0.02)
        assert not s.warnings


def test_a_fresh_source_is_untouched_by_the_rule() -> None:
    fresh = [GpuReading(t_ns=k * DT, gpu=0, power_w=100.0, energy_mj=100.0 * k * DT / 1e6) for k in range(60)]
    s = level(fresh, (1.0, 11.0), source="nvml")
    assert s.energy_j == pytest.approx(1000.0) and s.gpus[0].energy_from == "counter"


def test_a_counter_that_does_not_move_while_power_readings_do_gives_the_power_trapezoid() -> None:
    # before, 0 J and "0.0 W" for a GPU drawing 200-300 W
    rs = [GpuReading(t_ns=k * DT, gpu=0, power_w=200.0 + (k % 2) * 100.0, energy_mj=5e6) for k in range(60)]
    s = level(rs, (1.0, 11.0), source="nvml")
    assert s.energy_j == pytest.approx(2500.0) and s.power_w_mean == pytest.approx(250.0)
    assert s.gpus[0].energy_from == "power"
    assert "GPU 0: energy from power readings (trapezoid): the energy counter did not advance in the window " \
           "while the GPU drew power" in s.notes


def test_a_counter_that_does_not_move_without_power_readings_is_not_measured_never_0() -> None:
    rs = [GpuReading(t_ns=k * DT, gpu=0, energy_mj=5e6, sm_active_pct=90.0) for k in range(60)]
    s = level(rs, (1.0, 11.0), source="nvml")
    assert s.energy_j is None and s.power_w_mean is None
    assert gpu_level_figures(s)["gpu_power_w_mean"].value is None
