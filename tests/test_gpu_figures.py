"""GPU figures against known truth (docs/metrics.md#gpu): scripted series of GpuReading whose energy, power, SM
activity and throttling are known, folded by bench/gpu_figures.py, give exactly the expected figures; counters
become deltas over exactly the window; what cannot be measured says so, never 0; trials pool as one window."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from servelab.bench.figures import GPU_FIGURES, LEVEL_FIGURES, Pooling, lookup
from servelab.bench.gpu_figures import (GPU_MEASURES, HW_THERMAL_SLOWDOWN, SW_POWER_CAP, gpu_level_figures,
                                        gpu_list, not_measured, pool_gpu, reading_span, summarize_gpu)
from servelab.records import GpuReading

ROOT = Path(__file__).resolve().parent.parent
S = 1_000_000_000
MS = 1_000_000
T0 = 50 * S
DT = 250 * MS  # 4 Hz
WINDOW = (T0, T0 + 10 * S)
ENGINE = {100, 101}


def series(*, start: int = T0 - DT, end: int = T0 + 10 * S + DT, step: int = DT, gpus: int = 1,
           power: Callable[[int, float], float] = lambda gpu, t: 400.0, counter: bool = True,
           power_readings: bool = True, pids: tuple[int, ...] = (100,), **fields) -> Iterator[GpuReading]:
    """Readings every `step` ns of `gpus` GPUs; power(gpu, seconds since T0) in W, piecewise linear between
    readings, and an energy counter that is its exact integral (trapezoid of the linear pieces) in mJ."""
    energy = {g: 7_000_000.0 for g in range(gpus)}
    last: dict[int, tuple[int, float]] = {}
    t = start
    while t <= end:
        for g in range(gpus):
            p = power(g, (t - T0) / S)
            if g in last:
                t0, p0 = last[g]
                energy[g] += (p0 + p) / 2 * (t - t0) / S * 1000.0
            last[g] = (t, p)
            extra = {k: (v(g, (t - T0) / S) if callable(v) else v) for k, v in fields.items()}
            yield GpuReading(t_ns=t, gpu=g, uuid=f"GPU-{g}", name="NVIDIA H200", power_w=p if power_readings else None,
                             energy_mj=energy[g] if counter else None, processes=pids, **extra)
        t += step


def summary_of(readings, *, window=WINDOW, tokens: int | None = 8000, answer: int | None = None, source="nvml",
               engine=ENGINE):
    return summarize_gpu(readings, window=window, output_tokens=tokens, answer_tokens=answer, source=source,
                         interval_s=0.25, engine_pids=engine)


# ---------------------------------------------------------------------------------------------------------------
# Energy per token
# ---------------------------------------------------------------------------------------------------------------


def test_a_known_energy_delta_and_token_count_give_exactly_the_expected_j_per_token() -> None:
    # 400 W for exactly 10 s is 4000 J; 8000 tokens in the window: 0.5 J/token, 2 tokens/J
    s = summary_of(series(), tokens=8000, answer=5000)
    assert s.measured and s.energy_j == 4000.0
    assert s.j_per_output_token == 0.5 and s.output_tokens_per_j == 2.0
    assert s.j_per_answer_token == 0.8
    assert s.power_w_mean == 400.0 and s.gpus[0].energy_from == "counter"
    # J/token x output tok/s is the power drawn
    assert s.j_per_output_token * (8000 / 10.0) == s.power_w_mean


def test_the_counter_is_interpolated_to_the_window_s_edges_not_cut_at_the_readings_inside() -> None:
    # readings 100 ms after every quarter second: the first and last inside span 9.75 s of the 10 s window, which
    # would give 3900 J; the pair rule gives the energy of exactly the window
    s = summary_of(series(start=T0 - DT + 100 * MS, end=T0 + 10 * S + 100 * MS), tokens=8000)
    assert s.energy_j == pytest.approx(4000.0, rel=1e-12)
    assert s.j_per_output_token == pytest.approx(0.5, rel=1e-12)
    assert not any("extrapolated" in n for n in s.notes)


def test_the_readings_a_level_needs_reach_two_intervals_beyond_its_window() -> None:
    assert reading_span(WINDOW, 0.25) == (T0 - 500 * MS, T0 + 10 * S + 500 * MS)
    # readings from a wider span change nothing: only pairs overlapping the window count
    wide = summary_of(series(start=T0 - 40 * DT, end=T0 + 10 * S + 40 * DT))
    assert wide.energy_j == 4000.0 and wide.gpus[0].samples == 41


def test_a_repeated_or_late_reading_adds_no_energy_twice() -> None:
    def with_repeats(readings):
        previous = None
        for r in readings:
            yield r
            if previous is not None and r.gpu == 0 and r.t_ns == T0 + 5 * S:
                yield previous  # a reading from a quarter second ago, again
            previous = r

    assert summary_of(with_repeats(series())).energy_j == 4000.0


def test_a_ramp_of_power_integrates_to_its_exact_energy_from_the_counter_and_from_the_readings() -> None:
    ramp = lambda gpu, t: 200.0 + 40.0 * t  # 200 W to 600 W over the window: 4000 J  # noqa: E731
    by_counter = summary_of(series(power=ramp))
    by_power = summary_of(series(power=ramp, counter=False))
    assert by_counter.energy_j == pytest.approx(4000.0, rel=1e-12)
    assert by_power.energy_j == pytest.approx(4000.0, rel=1e-12)
    assert (by_counter.gpus[0].energy_from, by_power.gpus[0].energy_from) == ("counter", "power")
    assert any("energy from power readings (trapezoid): no energy counter" in n for n in by_power.notes)
    assert not any("trapezoid" in n for n in by_counter.notes)
    assert by_counter.gpus[0].power_w_max == 600.0  # the reading at the window's end


def test_the_counter_wins_over_power_readings_that_disagree_with_it() -> None:
    # the counter integrates 400 W; the power readings say 300 W (a driver's averaged board power can lag)
    readings = (r.model_copy(update={"power_w": 300.0}) for r in series())
    s = summary_of(readings)
    assert s.energy_j == 4000.0 and s.power_w_mean == 400.0 and s.gpus[0].power_w_max == 300.0


def test_a_counter_that_resets_mid_window_sums_its_monotonic_pieces_and_says_so() -> None:
    reset_at = T0 + 4 * S

    def reset(readings):
        for r in readings:
            yield r.model_copy(update={"energy_mj": r.energy_mj - 6_000_000.0}) if r.t_ns >= reset_at else r

    s = summary_of(reset(series()))
    # the pair across the reset has no counter delta: its 0.25 s come from the two readings' power (400 W)
    assert s.energy_j == pytest.approx(4000.0, rel=1e-12)
    assert any("GPU 0: the energy counter went backwards once (reset or wrap): the energy is the sum of the "
               "monotonic pieces, the span across it from the power readings" in n for n in s.notes)
    # without power readings the span across the reset is extrapolated at the other pieces' mean power
    bare = summary_of(reset(series(power_readings=False)))
    assert bare.energy_j == pytest.approx(4000.0, rel=1e-12)
    assert any("went backwards once" in n and "extrapolated" in n for n in bare.notes)


def test_a_window_the_readings_stop_short_of_is_extrapolated_and_says_how_much() -> None:
    s = summary_of(series(end=T0 + 9 * S))  # the sampler stopped 1 s before the window's end
    assert s.energy_j == pytest.approx(4000.0, rel=1e-12)
    assert any("energy extrapolated over 1.00 s of the window" in n for n in s.notes)


def test_readings_that_cover_under_half_the_window_give_no_energy() -> None:
    s = summary_of(series(end=T0 + 4 * S))  # the sampler stopped 4 s into a 10 s window
    assert s.measured and s.energy_j is None and s.j_per_output_token is None
    assert "GPU 0: energy not measured: the readings cover 40% of the window (at least 50% needed)" in s.notes


def test_the_figures_per_token_use_the_tokens_given_and_none_is_not_measured_never_zero() -> None:
    s = summary_of(series(), tokens=None)
    figs = gpu_level_figures(s)
    assert s.energy_j == 4000.0 and s.j_per_output_token is None and s.output_tokens_per_j is None
    assert figs["j_per_output_token"].value is None
    assert figs["j_per_output_token"].note == "not measured: no output token count for the window"
    assert figs["j_per_answer_token"].note == "not measured: no answer token count for the window"
    assert figs["gpu_power_w_mean"].value == 400.0 and figs["gpu_power_w_mean"].note is None
    zero = gpu_level_figures(summary_of(series(), tokens=0))
    assert zero["output_tokens_per_j"].value is None
    assert zero["output_tokens_per_j"].note == "not measured: no output tokens in the window"


def test_a_source_with_neither_counter_nor_power_leaves_energy_not_measured() -> None:
    s = summary_of(series(counter=False, power_readings=False, sm_active_pct=70.0))
    assert s.measured and s.energy_j is None and s.j_per_output_token is None and s.power_w_mean is None
    assert "GPU 0: energy not measured: the source gives neither an energy counter nor power" in s.notes
    figs = gpu_level_figures(s)
    assert figs["j_per_output_token"].note == ("not measured: the source gives neither an energy counter nor power "
                                               "(GPU 0)")
    assert figs["gpu_sm_active_pct_mean"].value == 70.0


# ---------------------------------------------------------------------------------------------------------------
# Not measured
# ---------------------------------------------------------------------------------------------------------------


def test_a_window_with_no_readings_is_not_measured_never_zero() -> None:
    # readings before and after a 0.2 s window, none inside it
    window = (T0 + 10 * MS, T0 + 210 * MS)
    s = summary_of(series(), window=window)
    assert not s.measured and s.energy_j is None and s.gpus == []
    assert s.reason == "no GPU reading inside the level's 0.2 s window (sampling every 0.25 s)"
    assert not summary_of(iter(())).measured
    for key, fig in gpu_level_figures(s).items():
        assert fig.value is None, key
        assert fig.note == "not measured: no GPU reading inside the level's 0.2 s window (sampling every 0.25 s)"
    none = gpu_level_figures(not_measured("no GPU telemetry source"))
    assert {f.note for f in none.values()} == {"not measured: no GPU telemetry source"}


# ---------------------------------------------------------------------------------------------------------------
# Sampled figures
# ---------------------------------------------------------------------------------------------------------------


def test_idle_share_is_the_share_of_readings_under_the_idle_threshold() -> None:
    # 41 readings inside the window (its edges included): every fourth reads 2 % (idle), one reads exactly 5 %
    # (not idle: the rule is under 5 %), the rest 80 %
    def sm(gpu, t):
        k = round(t * 4)
        return 2.0 if k % 4 == 0 else (5.0 if k == 1 else 80.0)

    s = summary_of(series(sm_active_pct=sm, sm_source="gpm", mem_used_bytes=lambda g, t: int(100e9 + t * 1e9)))
    g = s.gpus[0]
    assert g.samples == 41 and g.sm_samples == 41
    idle = sum(1 for k in range(41) if k % 4 == 0)  # k = 0, 4, ..., 40: 11
    assert g.idle_share == idle / 41 and s.idle_share == idle / 41
    assert g.sm_active_pct_mean == pytest.approx((idle * 2.0 + 5.0 + (41 - idle - 1) * 80.0) / 41)
    assert g.mem_used_bytes_max == int(110e9) and g.mem_used_bytes_mean == pytest.approx(105e9)
    assert g.sm_source == "gpm" and not any("overstates" in n for n in s.notes)
    util = summary_of(series(sm_active_pct=80.0, sm_source="utilization"))
    assert any("share of time a kernel ran" in n for n in util.notes)


def test_throttle_time_from_the_violation_counter() -> None:
    # 1.5 s of violation between 4 s and 5.5 s into the window (the counter in ns, cumulative)
    def violation(gpu, t):
        return int(3 * S + min(max(t - 4.0, 0.0), 1.5) * S)

    s = summary_of(series(throttle_ns=violation))
    assert s.gpus[0].throttle_s == pytest.approx(1.5, rel=1e-12)
    # said with the figures, not a contention: a GPU at its power cap under full load is the engine's own load
    assert not s.contended and s.reasons == []
    assert s.warnings == ["GPU 0 throttled for power or heat for 1.5 s of 10.0 s: the clocks, not only the engine, "
                          "set the pace"]


def test_power_and_thermal_violation_held_at_once_is_capped_at_the_window() -> None:
    # the sources sum the power and the thermal violation counters: both growing at full rate is 2 s a second
    s = summary_of(series(throttle_ns=lambda g, t: int(2 * max(t, 0.0) * S)))
    assert s.gpus[0].throttle_s == 10.0
    assert any("throttle time capped at the window" in n for n in s.notes)


def test_throttle_time_from_the_reasons_bitmask_counts_only_power_and_thermal_bits() -> None:
    # 41 readings inside; 8 with a power or thermal bit (and the idle bit, which is ignored), the rest with the
    # idle and application-clock bits only
    def reasons(gpu, t):
        k = round(t * 4)
        if k < 4:
            return SW_POWER_CAP | 0x1
        if k < 8:
            return HW_THERMAL_SLOWDOWN
        return 0x1 | 0x2

    s = summary_of(series(throttle_reasons=reasons))
    assert s.gpus[0].throttle_s == pytest.approx(8 / 41 * 10.0)
    assert not s.contended and "throttled for power or heat" in s.warnings[0]
    assert any("throttle time from the clocks-event reasons" in n for n in s.notes)
    quiet = summary_of(series(throttle_reasons=0x1 | 0x2 | 0x10 | 0x100))
    assert quiet.gpus[0].throttle_s == 0.0 and quiet.warnings == []


def test_a_throttle_under_one_percent_of_the_window_is_reported_but_does_not_contend() -> None:
    s = summary_of(series(throttle_ns=lambda g, t: int(min(max(t - 2.0, 0.0), 0.05) * S)))
    assert s.gpus[0].throttle_s == pytest.approx(0.05) and s.warnings == []


def test_no_throttle_field_is_not_measured() -> None:
    s = summary_of(series())
    assert s.gpus[0].throttle_s is None
    assert any("throttle time not measured" in n for n in s.notes)


def test_a_process_outside_the_engine_on_an_engine_gpu_contends_and_is_named() -> None:
    # GPU 0: the engine and pid 4242; GPU 1: only pid 999, so not the engine's
    def readings():
        for r in series(gpus=2):
            yield r.model_copy(update={"processes": (100, 4242) if r.gpu == 0 else (999,)})

    s = summary_of(readings())
    assert s.contended and s.reasons == ["pid 4242 held GPU 0 (the engine's) during the level"]
    assert [(g.gpu, g.engine, g.other_pids) for g in s.gpus] == [(0, True, [4242]), (1, False, [999])]
    assert s.energy_j == 4000.0  # GPU 1 is not counted


def test_without_the_engine_s_processes_every_gpu_counts_and_contention_is_not_checked() -> None:
    s = summary_of(series(gpus=2, pids=(4242,)), engine=set())
    assert all(g.engine for g in s.gpus) and s.energy_j == 8000.0 and not s.contended
    assert any("the engine's processes are not known" in n for n in s.notes)
    unseen = summary_of(series(gpus=2, pids=()), engine=ENGINE)
    assert unseen.energy_j == 8000.0
    assert any("no reading showed the engine's processes" in n for n in unseen.notes)


def test_new_xid_errors_are_a_loud_reason() -> None:
    # NVML counts XID events (and keeps the last code): 1 at 3 s, 2 more at 6 s
    nvml = summary_of(series(xid_errors=lambda g, t: 0 if t < 3 else (1 if t < 6 else 3),
                             xid_last=lambda g, t: 0 if t < 3 else (13 if t < 6 else 79)))
    assert nvml.gpus[0].xid_errors == 3 and not nvml.contended  # loud, but a rerun would not make it go away
    assert nvml.warnings == ["XID ERROR: GPU 0 reported 3 new XID errors during the level (last code 79): a driver "
                            "or hardware fault; the level's figures may not describe the engine"]
    old = summary_of(series(xid_errors=2, xid_last=31))  # errors from before the level are not new
    assert old.gpus[0].xid_errors == 0 and old.warnings == []
    # DCGM holds only the last XID code: each change to a nonzero code is one event
    dcgm = summary_of(series(xid_last=lambda g, t: 0 if t < 3 else (79 if t < 5 else (0 if t < 7 else 48))),
                      source="dcgm http://127.0.0.1:9400/metrics")
    assert dcgm.gpus[0].xid_errors == 2 and "(last code 48)" in dcgm.warnings[0]
    assert summary_of(series()).gpus[0].xid_errors is None  # not read: not 0


def test_retired_memory_pages_are_noted() -> None:
    s = summary_of(series(retired_pages=lambda g, t: 4 if t < 5 else 6))
    assert "GPU 0: 2 memory pages retired during the level (ECC errors)" in s.notes


# ---------------------------------------------------------------------------------------------------------------
# Eight GPUs
# ---------------------------------------------------------------------------------------------------------------


def test_eight_gpus_sum_their_energy_and_power_and_the_peak_is_of_the_sum() -> None:
    # GPU g draws 100 + 10 g W, and GPU 3 spikes by 200 W at one reading 5 s into the window
    def power(g, t):
        return 100.0 + 10.0 * g + (200.0 if g == 3 and abs(t - 5.0) < 1e-9 else 0.0)

    s = summary_of(series(gpus=8, power=power, sm_active_pct=lambda g, t: 10.0 * g), tokens=10_800)
    assert len(s.gpus) == 8 and all(g.engine for g in s.gpus)
    spike_j = 200.0 * 0.25  # a triangle 0.5 s wide, 200 W high
    assert s.energy_j == pytest.approx(1080.0 * 10 + spike_j, rel=1e-12)
    assert s.power_w_mean == pytest.approx(1080.0 + spike_j / 10, rel=1e-12)
    assert s.power_w_max == pytest.approx(1080.0 + 200.0)
    assert s.gpus[3].power_w_max == 330.0 and s.gpus[3].power_w_mean == pytest.approx(130.0 + spike_j / 10)
    assert s.j_per_output_token == pytest.approx(s.energy_j / 10_800, rel=1e-12)
    assert s.sm_active_pct_mean == pytest.approx(35.0)  # the mean over GPUs of 0, 10, ..., 70
    assert "GPUs 0-7: throttle time not measured" in " ".join(s.notes)  # one note for all eight


def test_gpu_list_names_runs() -> None:
    assert (gpu_list([3]), gpu_list(range(8)), gpu_list([0, 2, 5, 6, 7])) == ("GPU 3", "GPUs 0-7", "GPUs 0, 2, 5-7")


# ---------------------------------------------------------------------------------------------------------------
# Trials
# ---------------------------------------------------------------------------------------------------------------


def test_pooled_trials_equal_the_figures_of_their_windows_concatenated() -> None:
    # one 20 s series of two GPUs, readings off the quarter seconds so none sits on the 10 s boundary; power,
    # SM activity, memory and throttling all vary
    def make():
        return series(start=T0 - DT + 125 * MS, end=T0 + 20 * S + DT, gpus=2,
                      power=lambda g, t: 300.0 + 20.0 * t + 50.0 * g, sm_active_pct=lambda g, t: 3.0 if
                      int(t) % 3 == 0 else 60.0 + g, mem_used_bytes=lambda g, t: int(80e9 + t * 1e8),
                      throttle_ns=lambda g, t: int(min(max(t - 8.0, 0.0), 4.0) * S))

    a = summary_of(make(), window=(T0, T0 + 10 * S), tokens=5000, answer=4000)
    b = summary_of(make(), window=(T0 + 10 * S, T0 + 20 * S), tokens=7000, answer=6000)
    whole = summary_of(make(), window=(T0, T0 + 20 * S), tokens=12_000, answer=10_000)
    pooled = pool_gpu([a, b])
    for key in ("energy_j", "power_w_mean", "j_per_output_token", "j_per_answer_token", "output_tokens_per_j",
                "sm_active_pct_mean", "idle_share", "window_s", "power_w_max"):
        assert getattr(pooled, key) == pytest.approx(getattr(whole, key), rel=1e-9), key
    for p, w in zip(pooled.gpus, whole.gpus):
        for key in ("energy_j", "power_w_mean", "sm_active_pct_mean", "idle_share", "mem_used_bytes_mean",
                    "mem_used_bytes_max", "throttle_s", "samples", "sm_samples"):
            assert getattr(p, key) == pytest.approx(getattr(w, key), rel=1e-9), key
    assert pooled.output_tokens == 12_000 and pooled.warnings and whole.warnings and not pooled.contended
    pooled_figs, whole_figs = gpu_level_figures(pooled), gpu_level_figures(whole)
    for key in pooled_figs:
        assert pooled_figs[key].value == pytest.approx(whole_figs[key].value, rel=1e-9), key


def test_pooling_keeps_only_measured_trials_and_one_trial_is_itself() -> None:
    a = summary_of(series())
    missing = not_measured("no GPU reading inside the level's 0.1 s window (sampling every 0.25 s)")
    assert pool_gpu([a]) == a  # one trial: that trial
    pooled = pool_gpu([a, missing])  # one measured trial: its figures, and a note of the other
    assert pooled.model_copy(update={"notes": a.notes}) == a
    assert pooled.notes[-1] == "1 of 2 trials had no GPU figures: pooled over the other 1"
    both_missing = pool_gpu([missing, missing])
    assert not both_missing.measured and both_missing.reason.endswith("(in every trial)")
    assert pool_gpu([a, a, missing]).notes[-1] == "1 of 3 trials had no GPU figures: pooled over the other 2"


# ---------------------------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------------------------


def test_a_hundred_thousand_readings_are_folded_in_memory_of_the_gpus_not_of_the_readings() -> None:
    # 8 GPUs x 12,500 sweeps = 100,000 readings at 4 Hz: 52 minutes of a level; a list of them would hold about
    # 100 MB, the fold a few numbers per GPU
    template = GpuReading(t_ns=0, gpu=0, name="NVIDIA H200", sm_active_pct=70.0, sm_source="gpm",
                          mem_used_bytes=100_000_000_000, power_w=400.0, energy_mj=0.0, throttle_reasons=0x1,
                          processes=(100,))
    produced = 0

    def readings():
        # each reading a copy of the template's fields with its own time and counter: pydantic's validating
        # constructor, under tracemalloc, would take most of this test's time
        nonlocal produced
        for k in range(12_500):
            t = T0 + (k - 1) * DT
            for g in range(8):
                r = GpuReading.__new__(GpuReading)
                fields = dict(template.__dict__, t_ns=t, gpu=g, energy_mj=k * 100_000.0)
                object.__setattr__(r, "__dict__", fields)
                object.__setattr__(r, "__pydantic_fields_set__", set(fields))
                object.__setattr__(r, "__pydantic_extra__", None)
                object.__setattr__(r, "__pydantic_private__", None)
                produced += 1
                yield r

    window = (T0, T0 + 12_497 * DT)
    tracemalloc.start()
    try:
        s = summary_of(readings(), window=window, tokens=1_000_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert produced == 100_000
    assert s.measured and s.gpus[0].samples == 12_498 and len(s.gpus) == 8
    assert s.energy_j == pytest.approx(8 * 400.0 * 12_497 * 0.25, rel=1e-9)
    assert s.idle_share == 0.0 and s.gpus[7].throttle_s == 0.0
    assert peak < 200_000, peak  # bytes


# ---------------------------------------------------------------------------------------------------------------
# The figure table
# ---------------------------------------------------------------------------------------------------------------


def test_every_gpu_figure_has_its_function_its_anchor_and_a_csv_position_after_the_request_figures() -> None:
    assert GPU_MEASURES.keys() == {f.key for f in GPU_FIGURES}
    page = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert '<a id="gpu"></a>' in page
    assert [f.key for f in GPU_FIGURES if f'<a id="{f.definition}"></a>' not in page] == []
    # right after the request figures that were there before them; request figures added since come after them
    first = GPU_FIGURES[0].csv.position
    last = max(f.csv.position for f in LEVEL_FIGURES if f.csv and f.csv.position < first)
    assert [f.csv.position for f in GPU_FIGURES] == list(range(last + 1, last + 1 + len(GPU_FIGURES)))
    assert all(f.csv.position > GPU_FIGURES[-1].csv.position for f in LEVEL_FIGURES if f.csv and f.csv.position > last)
    assert not {f.key for f in GPU_FIGURES} & {f.key for f in LEVEL_FIGURES}
    assert all(f.pooling is Pooling.TELEMETRY and not f.terminal for f in GPU_FIGURES)


def test_compare_reads_the_gpu_figures_units_and_directions() -> None:
    assert (lookup("j_per_output_token").unit, lookup("j_per_output_token").higher_is_better) == ("J/token", False)
    assert (lookup("peak.output_tokens_per_j").unit, lookup("peak.output_tokens_per_j").higher_is_better) == (
        "tok/J", True)
    assert lookup("gpu_power_w_mean").higher_is_better is None
    assert lookup("gpu_sm_active_pct_mean").unit == "%"


def test_the_level_figures_carry_the_summary_s_values_and_the_token_count_method() -> None:
    s = summary_of(series(sm_active_pct=50.0), tokens=8000)
    figs = gpu_level_figures(s, counted_by="server_per_chunk")
    assert list(figs) == [f.key for f in GPU_FIGURES]
    assert (figs["j_per_output_token"].value, figs["output_tokens_per_j"].value) == (0.5, 2.0)
    assert figs["j_per_output_token"].counted_by == "server_per_chunk"
    assert figs["gpu_power_w_mean"].counted_by is None and figs["gpu_power_w_mean"].unit == "W"
    assert figs["gpu_idle_share"].value == 0.0
    assert figs["j_per_answer_token"].value is None  # no reasoning counted apart
