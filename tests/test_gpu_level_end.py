"""A level's end waits for a GPU reading taken after its window ended (docs/metrics.md#gpu): a tick already in
progress when the window ended was stamped before the end (NVML and DCGM stamp a reading when its read starts),
so the counters would have no reading beyond the window's edge."""

from __future__ import annotations

import threading
import time

from servelab.bench.gpu_run import GpuRun
from servelab.host.gpu_telemetry.sampler import GpuSampler, iter_readings
from servelab.records import GpuReading


class SlowSource:
    """Stamps each reading as its read starts, then takes 0.15 s (8 GPUs of NVML calls, an HTTP scrape)."""

    name = "slow"

    def __init__(self) -> None:
        self.reading = threading.Event()

    def read(self) -> list[GpuReading]:
        t = time.perf_counter_ns()
        self.reading.set()
        time.sleep(0.15)
        return [GpuReading(t_ns=t, gpu=0, power_w=100.0, energy_mj=t / 1e7)]

    def take_notes(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def test_the_level_end_waits_for_a_reading_stamped_after_the_window(tmp_path) -> None:
    source = SlowSource()
    series = tmp_path / "gpu_series.jsonl.gz"
    run = GpuRun(sampler=GpuSampler(source, series, interval_s=0.2).start(), series=series)
    try:
        for _ in range(3):
            source.reading.clear()
            source.reading.wait(2.0)  # a read has just started: the window ends while it is in progress
            window_end = time.perf_counter_ns()
            run.mark_end(window_end)
            assert max(r.t_ns for r in iter_readings(series)) > window_end
    finally:
        run.close()


def test_a_source_that_gives_nothing_does_not_hold_the_level_end_long(tmp_path) -> None:
    class Empty(SlowSource):
        def read(self) -> list[GpuReading]:
            return []

    run = GpuRun(sampler=GpuSampler(Empty(), tmp_path / "s.jsonl.gz", interval_s=0.1).start(),
                 series=tmp_path / "s.jsonl.gz")
    try:
        started = time.monotonic()
        run.mark_end()
        assert time.monotonic() - started < 0.5  # two ticks, not the 1.3 s deadline
    finally:
        run.close()
