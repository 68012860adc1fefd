"""Levels with known GPU figures, for the tests of everywhere a GPU figure goes (store, show, exports, report,
compare, JUnit). The readings are scripted: every GPU draws a constant power and its energy counter grows by
exactly that, so a level's energy, J/token and tokens/J are known before any code computes them."""

from __future__ import annotations

from servelab.bench.gpu_figures import gpu_level_figures, not_measured, summarize_gpu
from servelab.records import GpuReading, Summary

NS = 1_000_000_000
INTERVAL_S = 0.25


def readings(window_s: float, *, gpus: int = 2, power_w: float = 300.0, sm_pct: float = 80.0, start_ns: int = 0,
             interval_s: float = INTERVAL_S, pids: tuple[int, ...] = ()) -> list[GpuReading]:
    """Readings of `gpus` GPUs from one interval before [start, start + window] to one after, every interval."""
    out = []
    step = int(interval_s * NS)
    t = start_ns - step
    while t <= start_ns + int(window_s * NS) + step:
        for g in range(gpus):
            out.append(GpuReading(t_ns=t, gpu=g, uuid=f"GPU-{g}", name="NVIDIA H200", sm_active_pct=sm_pct,
                                  sm_source="gpm", mem_used_bytes=100 * 2**30, mem_total_bytes=141 * 2**30,
                                  power_w=power_w, energy_mj=1e9 + power_w * (t + step) / 1e6, temp_c=60.0,
                                  processes=pids))
        t += step
    return out


def output_tokens(level: Summary) -> int:
    """The tokens the level's output tok/s counts in its window (what J/token divides by)."""
    return round(level.figures["output_tok_s"].value * level.window_s)


def with_gpu(level: Summary, *, gpus: int = 2, power_w: float = 300.0, sm_pct: float = 80.0) -> Summary:
    """The level with its GPU summary and figures, as the level runner gives them: `gpus` GPUs at `power_w` each
    over its window, so J/token = gpus × power_w × window_s ÷ output tokens."""
    window = (0, int(level.window_s * NS))
    level.gpu = summarize_gpu(readings(level.window_s, gpus=gpus, power_w=power_w, sm_pct=sm_pct), window=window,
                              output_tokens=output_tokens(level), answer_tokens=None, source="nvml",
                              interval_s=INTERVAL_S)
    level.figures.update(gpu_level_figures(level.gpu))
    return level


def without_gpu(level: Summary, reason: str = "no GPU telemetry source") -> Summary:
    level.gpu = not_measured(reason)
    level.figures.update(gpu_level_figures(level.gpu))
    return level


def expected_j_per_token(level: Summary, *, gpus: int = 2, power_w: float = 300.0) -> float:
    return gpus * power_w * level.window_s / output_tokens(level)


class ScriptedSource:
    """A telemetry source replaying readings tick by tick (each read the next instant's readings of every GPU), to
    write a real series file with the real sampler."""

    name = "nvml"

    def __init__(self, readings: list[GpuReading]) -> None:
        ticks: dict[int, list[GpuReading]] = {}
        for r in readings:
            ticks.setdefault(r.t_ns, []).append(r)
        self.ticks = [ticks[t] for t in sorted(ticks)]

    def read(self) -> list[GpuReading]:
        return self.ticks.pop(0) if self.ticks else []

    def take_notes(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def write_series(path, readings: list[GpuReading]):
    """The series file the GPU sampler writes, holding exactly `readings`."""
    from servelab.host.gpu_telemetry.sampler import GpuSampler

    source = ScriptedSource(readings)
    sampler = GpuSampler(source, path, interval_s=INTERVAL_S, chunk_ticks=8)
    for _ in range(len(source.ticks)):
        sampler.tick()
    sampler.stop()
    return path
