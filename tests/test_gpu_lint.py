"""Hints from GPU telemetry (docs/metrics.md#gpu-hints): low SM activity at high concurrency, or GPUs idle while
requests were in flight, is a hint, tied to the engine's own lint where it found the cause. The summaries come
from scripted readings folded by bench/gpu_figures.py; the findings from the engines' own lint functions."""

from __future__ import annotations

from servelab.bench.gpu_figures import not_measured, summarize_gpu
from servelab.bench.gpu_lint import gpu_hints
from servelab.engines.sglang import sglang_lint
from servelab.engines.vllm import vllm_lint
from servelab.records import GpuReading, GpuSummary

S = 1_000_000_000
DT = S // 4
T0 = 10 * S


def level(sm_pct, *, source: str = "gpm", gpus: int = 8) -> GpuSummary:
    """Ten seconds of eight GPUs held by the engine (pid 100), SM activity sm_pct(k) at reading k."""
    readings = (GpuReading(t_ns=T0 + k * DT, gpu=g, sm_active_pct=sm_pct(k), sm_source=source, power_w=300.0,
                           energy_mj=1e6 + k * 75_000.0, processes=(100,))
                for k in range(-1, 42) for g in range(gpus))
    return summarize_gpu(readings, window=(T0, T0 + 10 * S), output_tokens=20_000, answer_tokens=None,
                         source="nvml", interval_s=0.25, engine_pids={100})


def test_low_sm_activity_at_c64_is_a_hint_and_at_c1_it_is_not() -> None:
    s = level(lambda k: 31.0)
    assert s.sm_active_pct_mean == 31.0
    assert gpu_hints(s, 64, []) == ["SM activity 31 % at c=64: CUDA graphs off or a CPU-bound scheduler?"]
    assert gpu_hints(s, 1, []) == []  # one stream leaves a big GPU's SMs mostly idle by nature
    assert gpu_hints(s, 15, []) == []
    assert gpu_hints(level(lambda k: 50.0), 64, []) == []  # at the threshold: not low


def test_the_hint_names_the_engine_s_own_finding_when_it_has_one() -> None:
    s = level(lambda k: 31.0)
    sglang = sglang_lint(["python", "-m", "sglang.launch_server", "--disable-cuda-graph"], None)
    assert gpu_hints(s, 64, sglang) == [
        "SM activity 31 % at c=64: the engine runs without CUDA graphs (--disable-cuda-graph): every decode step "
        "pays its kernel launches, as the engine's lint says"]
    vllm = vllm_lint(["vllm", "serve", "m", "--enforce-eager"], None)
    assert "(--enforce-eager)" in gpu_hints(s, 64, vllm)[0]
    overlap = sglang_lint(["python", "-m", "sglang.launch_server", "--disable-overlap-schedule"], None)
    assert "the scheduler does not overlap the GPU (--disable-overlap-schedule)" in gpu_hints(s, 64, overlap)[0]
    # findings that explain nothing about idle SMs leave the question open
    plain = sglang_lint(["python", "-m", "sglang.launch_server"], None)
    assert plain and gpu_hints(s, 64, plain) == ["SM activity 31 % at c=64: CUDA graphs off or a CPU-bound "
                                                 "scheduler?"]


def test_gpus_idle_while_requests_were_in_flight_is_a_hint() -> None:
    s = level(lambda k: 0.0 if k % 3 == 0 else 90.0)  # idle in 14 of 41 readings
    assert s.idle_share is not None and s.idle_share >= 0.2 and s.sm_active_pct_mean > 50.0
    hints = gpu_hints(s, 8, [])
    assert hints == [f"the engine's GPUs were idle in {s.idle_share:.0%} of their readings at c=8 while requests "
                     f"were in flight: decode waits between steps (CUDA graphs off, the scheduler or the CPU)?"]
    assert gpu_hints(s, None, []) == []  # an open-loop level: idle time can be its schedule's
    assert gpu_hints(level(lambda k: 0.0 if k % 10 == 0 else 90.0), 8, []) == []  # 5 of 41: under a fifth


def test_utilisation_is_called_so_and_an_unmeasured_level_has_no_hint() -> None:
    s = level(lambda k: 31.0, source="utilization")
    assert gpu_hints(s, 64, [])[0].startswith("GPU utilisation 31 % at c=64:")
    assert gpu_hints(not_measured("no GPU telemetry source"), 64, []) == []
