"""What went wrong while sampling reaches the result: a series that could not be written, a source that stopped
answering, ticks that overran are in the bench's gpu_telemetry provenance, and a level left without GPU figures by
one of them says so in its reason."""

from __future__ import annotations

import socket
import time

from servelab.bench.gpu_run import GpuRun
from servelab.bench.metrics import summarize
from servelab.host.gpu_telemetry.dcgm import DcgmSource
from servelab.host.gpu_telemetry.sampler import GpuSampler
from servelab.records import GpuReading


class Source:
    name = "nvml"

    def read(self) -> list[GpuReading]:
        t = time.perf_counter_ns()
        return [GpuReading(t_ns=t, gpu=0, power_w=100.0, energy_mj=t / 1e7)]

    def take_notes(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def level_of(run: GpuRun, t0: int, t1: int):
    return run.level(summarize([], tag="c1", mode="concurrency", concurrency=1, window=(t0, t1)), (t0, t1), 10, 10)


def test_a_series_that_could_not_be_written_is_the_level_s_reason_and_in_the_provenance(tmp_path) -> None:
    (tmp_path / "f").write_text("")
    path = tmp_path / "f" / "gpu_series.jsonl.gz"  # its parent is a file: as a full disk, nothing is written
    sampler = GpuSampler(Source(), path, interval_s=0.05)
    run = GpuRun(sampler=sampler, series=path)
    t0 = time.perf_counter_ns()
    sampler.tick()
    sampler.tick()
    t1 = time.perf_counter_ns()
    gpu = level_of(run, t0, t1)
    assert not gpu.measured
    assert gpu.reason.startswith(f"the GPU series could not be written ({path}: ")  # before: "could not be read"
    run.close()
    assert run.provenance()["write_error"].startswith(f"{path}: ")


def test_a_dcgm_exporter_that_stops_answering_is_in_the_provenance_and_the_level_s_reason(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/metrics"  # closed again: nothing listens there
    series = tmp_path / "gpu_series.jsonl.gz"
    sampler = GpuSampler(DcgmSource(url, timeout_s=0.2), series, interval_s=0.25)
    run = GpuRun(sampler=sampler, series=series)
    t0 = time.perf_counter_ns()
    sampler.tick()
    sampler.tick()
    t1 = time.perf_counter_ns()
    gpu = level_of(run, t0, t1)
    assert not gpu.measured and f"the source's last failure: {url} did not answer" in gpu.reason
    run.close()
    provenance = run.provenance()
    assert provenance["empty_reads"] == 2 and provenance["source_error"].startswith(f"{url} did not answer")


def test_a_sampler_that_went_well_adds_nothing_to_the_provenance(tmp_path) -> None:
    sampler = GpuSampler(Source(), tmp_path / "s.jsonl.gz", interval_s=0.25)
    sampler.tick()
    run = GpuRun(sampler=sampler, series=tmp_path / "s.jsonl.gz")
    run.close()
    assert set(run.provenance()) == {"source", "interval_s", "series"}
