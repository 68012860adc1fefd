"""The bench's GPU run at its edges: a level summarised after the sampler stopped (Ctrl-C) ends its GPU window at
the last reading, not past it; a sampler whose thread could not start leaves no file open."""

from __future__ import annotations

import threading

import pytest

from servelab.bench.gpu_run import GpuRun
from servelab.bench.metrics import summarize
from servelab.host.gpu_telemetry import sampler as sampler_module
from servelab.host.gpu_telemetry.sampler import GpuSampler
from servelab.records import GpuReading

S = 1_000_000_000


class Scripted:
    """Readings at the times the test gives: 100 W, and an energy counter that is its exact integral."""

    name = "nvml"

    def __init__(self) -> None:
        self.t_ns = 0
        self.closed = False

    def read(self) -> list[GpuReading]:
        return [GpuReading(t_ns=self.t_ns, gpu=0, power_w=100.0, energy_mj=100.0 * self.t_ns / 1e6)]

    def take_notes(self) -> list[str]:
        return []

    def close(self) -> None:
        self.closed = True


def test_a_level_summarised_after_the_sampler_stopped_ends_its_gpu_window_at_the_last_reading(tmp_path) -> None:
    source = Scripted()
    series = tmp_path / "gpu_series.jsonl.gz"
    sampler = GpuSampler(source, series, interval_s=0.25)
    for k in range(21):  # readings from 0 to 5 s; then Ctrl-C: the sampler stops, the level is summarised at 20 s
        source.t_ns = k * S // 4
        sampler.tick()
    run = GpuRun(sampler=sampler, series=series)
    run.stop()
    window = (1 * S, 20 * S)
    gpu = run.level(summarize([], tag="single", mode="single", concurrency=1, window=window), window, 400, None)
    assert gpu.measured and gpu.window_s == pytest.approx(4.0)
    assert gpu.energy_j == pytest.approx(400.0) and gpu.power_w_mean == pytest.approx(100.0)  # before: not measured
    assert gpu.j_per_output_token == pytest.approx(1.0)
    assert not any("extrapolated" in n for n in gpu.notes)


def test_a_sampler_thread_that_cannot_start_closes_its_series_and_source(tmp_path, monkeypatch) -> None:
    source = Scripted()
    made: list[GpuSampler] = []

    class Recorded(GpuSampler):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    def refuse(self) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr("servelab.host.gpu_telemetry.open_source", lambda **_: (source, ""))
    monkeypatch.setattr(sampler_module, "GpuSampler", Recorded)
    monkeypatch.setattr(threading.Thread, "start", refuse)
    run = GpuRun.open(enabled=True, urls=[], local=False, series=tmp_path / "gpu_series.jsonl.gz")
    assert run.sampler is None and run.why_none == "the GPU sampler could not start (can't start new thread)"
    (sampler,) = made
    assert sampler._raw.closed and source.closed  # before: the gzip file stayed open
