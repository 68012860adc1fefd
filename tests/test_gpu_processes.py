"""Which processes on which GPUs (docs/metrics.md#gpu-engine, #gpu-contended): the engine's ranks started outside
its process tree (vLLM's Ray executor, an MPI launcher) are never left out silently, and a display server's
graphics context on the engine's GPU is not contention. NVML through the double (tests/doubles/pynvml)."""

from __future__ import annotations

import sys

import pytest

from gpu_doubles import Clock, import_double, series
from servelab.bench.gpu_figures import summarize_gpu
from servelab.host.gpu_telemetry.nvml import open_nvml
from servelab.records import GpuReading

S = 1_000_000_000


def ray_level() -> list[GpuReading]:
    # the engine (pid 100) holds GPU 0; its tensor-parallel ranks 1-3 are Ray actors (pids 201-203), children of
    # the raylet, not of the engine; every GPU draws 300 W
    return [GpuReading(t_ns=k * S // 4, gpu=g, power_w=300.0, energy_mj=300.0 * k / 4 * 1000,
                       processes=(100,) if g == 0 else (200 + g,)) for k in range(49) for g in range(4)]


def test_compute_processes_outside_the_engine_s_tree_on_its_other_gpus_are_said_loudly() -> None:
    s = summarize_gpu(ray_level(), window=(S, 11 * S), output_tokens=3000, answer_tokens=None, source="nvml",
                      interval_s=0.25, engine_pids={100})
    assert [g.engine for g in s.gpus] == [True, False, False, False]
    said = ("GPUs 1-3 ran compute processes outside the engine's tree (pids 201, 202, 203) while the engine ran on "
            "GPU 0: if they are its ranks (a Ray executor, an MPI launcher), its energy and J/token leave them out")
    assert said in s.warnings and said in s.notes  # before: 3000 J of the 12000, in silence


def test_idle_gpus_beside_the_engine_s_say_nothing() -> None:
    rs = [r.model_copy(update={"processes": ()}) if r.gpu else r for r in ray_level()]
    s = summarize_gpu(rs, window=(S, 11 * S), output_tokens=3000, answer_tokens=None, source="nvml",
                      interval_s=0.25, engine_pids={100})
    assert not s.warnings and not any("outside the engine's tree" in n for n in s.notes)


@pytest.fixture
def nvml(monkeypatch):
    module = import_double(monkeypatch)
    yield module
    module._double_unload()
    sys.modules.pop("pynvml", None)


def test_a_display_server_s_graphics_context_is_not_contention(nvml) -> None:
    doc = series()
    engine = {p["pid"] for frame in doc["series"] for gpu in frame["gpus"] for p in gpu["processes"]}
    for frame in doc["series"]:
        frame["gpus"][0]["processes"].append({"pid": 4321, "kind": "graphics", "used_bytes": 64 * 2**20})
    clock = Clock()
    nvml._double_load(doc, clock)
    source, _ = open_nvml(clock=clock)
    readings = []
    for k in range(48):
        clock.at(5.0 + k / 4)
        readings.extend(source.read())
    source.close()
    assert all(4321 not in r.processes for r in readings)
    s = summarize_gpu(readings, window=(int(5.5 * S), int(15.5 * S)), output_tokens=1000, answer_tokens=None,
                      source="nvml", interval_s=0.25, engine_pids=engine)
    assert not s.contended, s.reasons
