"""The GPU sampler: what it writes reads back exactly, a window gives exactly the readings inside it, memory stays
at one chunk, stop is idempotent, a slow source is recorded as overruns (never queued)."""

from __future__ import annotations

import gzip
import sys
import time
import tracemalloc

import pytest

from gpu_doubles import Clock, import_double, series
from servelab.host.gpu_telemetry.nvml import open_nvml
from servelab.host.gpu_telemetry.sampler import GpuSampler, iter_lines, iter_notes, iter_readings, read_header


@pytest.fixture
def nvml(monkeypatch):
    module = import_double(monkeypatch)
    yield module
    module._double_unload()
    sys.modules.pop("pynvml", None)


def driven(nvml, tmp_path, ticks, chunk_ticks=7, **options):
    """A sampler over the double, ticked by hand every 0.25 s of the double's clock; (sampler, readings)."""
    clock = Clock()
    nvml._double_load(series(), clock, **options)
    source, _ = open_nvml(clock=clock)
    sampler = GpuSampler(source, tmp_path / "gpu_series.jsonl.gz", interval_s=0.25, chunk_ticks=chunk_ticks)
    readings = []
    for k in range(ticks):
        clock.at(0.25 * (k + 1))
        readings += sampler.tick()
    return sampler, readings


def test_series_reads_back_every_reading_exactly(nvml, tmp_path):
    sampler, readings = driven(nvml, tmp_path, ticks=60)
    sampler.stop()
    assert len(readings) == 60 * 8
    back = list(iter_readings(sampler.path))
    assert back == readings
    header = read_header(sampler.path)
    assert header["source"] == "nvml" and header["interval_s"] == 0.25 and header["clock"] == "perf_counter_ns"
    kinds = [doc["kind"] for doc in iter_lines(sampler.path)]
    assert kinds[:2] == ["header", "devices"] and kinds[-1] == "end"
    assert kinds.count("chunk") == -(-60 // 7)


def test_a_window_gives_exactly_the_readings_inside_it(nvml, tmp_path):
    sampler, readings = driven(nvml, tmp_path, ticks=80)
    sampler.stop()
    t = sorted({r.t_ns for r in readings})
    for t0, t1 in ((t[10], t[33]), (t[10] + 1, t[33] - 1), (None, t[5]), (t[70], None), (t[0] - 10, t[0] - 1)):
        want = [r for r in readings if (t0 is None or r.t_ns >= t0) and (t1 is None or r.t_ns <= t1)]
        assert list(iter_readings(sampler.path, t0, t1)) == want
    # the energy over a window is known from the series: 4-16 s of load
    inside = [r for r in iter_readings(sampler.path, t[15], t[63]) if r.gpu == 0]
    joules = (inside[-1].energy_mj - inside[0].energy_mj) / 1000
    frames = {f["t_s"]: f["gpus"][0]["power_w"] for f in series()["series"]}
    expected = sum(frames[float(s)] for s in range(4, 16))  # ticks 15..63 are 4.0 s .. 16.0 s
    assert joules == pytest.approx(expected, abs=0.01)


def test_a_lost_gpu_mid_chunk_and_its_note_read_back(nvml, tmp_path):
    sampler, readings = driven(nvml, tmp_path, ticks=20, lost={3: 2.6})
    sampler.stop()
    assert list(iter_readings(sampler.path)) == readings
    assert {r.gpu for r in readings if r.t_ns > readings[-1].t_ns - 10**9} == {0, 1, 2, 4, 5, 6, 7}
    notes = [text for _, text in iter_notes(sampler.path)]
    assert len(notes) == 1 and "GPU 3" in notes[0] and "is lost" in notes[0]


def test_memory_holds_one_chunk_however_many_ticks(nvml, tmp_path):
    clock = Clock()
    nvml._double_load(series(), clock)
    source, _ = open_nvml(clock=clock)
    sampler = GpuSampler(source, tmp_path / "s.jsonl.gz", chunk_ticks=40)
    most = 0
    tracemalloc.start()
    try:
        for k in range(1000):
            clock.at(0.25 * (k + 1) % 20)  # round the 20 s series again and again
            sampler.tick()
            most = max(most, sampler.buffered)
            if k == 199:
                warm, _ = tracemalloc.get_traced_memory()
        grown = tracemalloc.get_traced_memory()[0] - warm
    finally:
        tracemalloc.stop()
    sampler.stop()
    assert grown < 256 * 1024  # 800 more ticks (6,400 readings) and no growth beyond a chunk's noise
    assert most <= 40 * 8 and sampler.buffered == 0
    assert sampler.ticks == 1000
    per_tick = sampler.path.stat().st_size / 1000
    assert per_tick < 1500  # 8 GPUs, ~20 fields: compact, not one object per value


def test_stop_is_idempotent_and_later_ticks_write_nothing(nvml, tmp_path):
    sampler, readings = driven(nvml, tmp_path, ticks=5)
    sampler.stop()
    size = sampler.path.stat().st_size
    sampler.stop()
    sampler.tick()
    assert sampler.path.stat().st_size == size
    assert list(iter_readings(sampler.path)) == readings
    assert nvml._machine.inits == 0  # the sampler owns its source and closed it


def test_a_torn_file_reads_up_to_its_last_whole_line(nvml, tmp_path):
    sampler, readings = driven(nvml, tmp_path, ticks=30, chunk_ticks=5)
    sampler.stop()
    data = sampler.path.read_bytes()
    torn = tmp_path / "torn.jsonl.gz"
    torn.write_bytes(data[: len(data) * 2 // 3])
    back = list(iter_readings(torn))
    assert 0 < len(back) < len(readings) and back == readings[: len(back)]


def test_the_thread_samples_at_its_rate(nvml, tmp_path):
    nvml._double_load(series(), time.perf_counter_ns)
    source, _ = open_nvml()
    sampler = GpuSampler(source, tmp_path / "s.jsonl.gz", interval_s=0.05).start()
    try:
        time.sleep(0.6)
    finally:
        sampler.stop()
    assert 8 <= sampler.ticks <= 14 and sampler.overruns == 0
    back = list(iter_readings(sampler.path))
    assert len(back) == sampler.ticks * 8
    times = [r.t_ns for r in back if r.gpu == 0]
    assert times == sorted(times) and len(set(times)) == len(times)


class SlowSource:
    name = "slow"

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.reads = 0

    def read(self):
        from servelab.records import GpuReading

        self.reads += 1
        time.sleep(self.delay_s)
        return [GpuReading(t_ns=time.perf_counter_ns(), gpu=0, power_w=100.0)]

    def close(self):
        pass


def test_an_overrunning_tick_is_recorded_not_queued(tmp_path):
    source = SlowSource(0.12)
    sampler = GpuSampler(source, tmp_path / "s.jsonl.gz", interval_s=0.05).start()
    time.sleep(0.6)
    sampler.stop()
    assert sampler.overruns >= 3
    assert source.reads <= 7  # ~0.6 / 0.12: no burst of queued reads afterwards
    chunks = [doc for doc in iter_lines(sampler.path) if doc["kind"] == "chunk"]
    assert sum(c["overruns"] for c in chunks) == sampler.overruns


class BrokenSource:
    name = "broken"

    def read(self):
        raise RuntimeError("driver went away\nwith a second line")

    def close(self):
        pass


def test_a_source_that_raises_is_noted_once_and_sampling_goes_on(tmp_path):
    sampler = GpuSampler(BrokenSource(), tmp_path / "s.jsonl.gz")
    for _ in range(3):
        assert sampler.tick() == []
    sampler.stop()
    assert sampler.ticks == 3
    assert [text for _, text in iter_notes(sampler.path)] == ["broken: driver went away with a second line"]


def test_an_unwritable_path_is_one_line_not_an_exception(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    sampler = GpuSampler(BrokenSource(), blocker / "sub" / "s.jsonl.gz")
    sampler.tick()
    sampler.stop()
    assert sampler.write_error is not None and "\n" not in sampler.write_error


def test_the_file_is_gzip_json_lines(nvml, tmp_path):
    sampler, _ = driven(nvml, tmp_path, ticks=3)
    sampler.stop()
    with gzip.open(sampler.path, "rt") as fh:
        lines = fh.read().splitlines()
    assert all(line.startswith("{") for line in lines)


def gpu_check():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("benchmarks_gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def check_windows(readings):
    """The double's series: idle 0-4 s, load 4-16 s, idle 16-20 s (ticks every 0.25 s from 0.25 s)."""
    start = Clock().start
    at = lambda s: start + int(s * 1e9)  # noqa: E731
    return (at(0.0), at(1.75)), (at(5.0), at(15.0)), (at(17.0), at(20.0))


def test_gpu_check_passes_on_a_series_that_did_the_work(nvml, tmp_path):
    sampler, readings = driven(nvml, tmp_path, ticks=80)
    sampler.stop()
    before, load, after = check_windows(readings)
    checks, seen = gpu_check().evaluate(list(iter_readings(sampler.path)), 0, before, load, after,
                                        load_bytes=120 * 2**30)
    assert [c.name for c in checks if not c.ok] == []
    assert [c.name for c in checks] == ["readings", "power", "energy", "sm_activity", "memory"]
    power = [f["gpus"][0]["power_w"] for f in series()["series"]]
    assert seen["energy_j"] == pytest.approx(sum(power[5:15]), abs=0.01)  # 5 s .. 15 s, 1 s per keyframe


def test_gpu_check_fails_without_an_energy_counter_or_the_memory(nvml, tmp_path):
    sampler, readings = driven(nvml, tmp_path, ticks=80, energy=False)
    sampler.stop()
    before, load, after = check_windows(readings)
    checks, _ = gpu_check().evaluate(readings, 0, before, load, after, load_bytes=200 * 2**30)
    failed = {c.name: c.detail for c in checks if not c.ok}
    assert failed.keys() == {"energy", "memory"} and failed["energy"] == "no energy counter read"
