"""Each GPU telemetry source against what cannot be had here: NVML through the double (tests/doubles/pynvml,
imported as the real library is), DCGM through its real text format served by a real HTTP server on 127.0.0.1,
amdsmi only as "not importable". Expected values come from the fixtures, converted by the test."""

from __future__ import annotations

import socket
import sys

import pytest

from gpu_doubles import Clock, ScrapeServer, dcgm_bodies, frame_at, import_double, series
from servelab.host.gpu_telemetry import open_source
from servelab.host.gpu_telemetry.amd import open_amdsmi
from servelab.host.gpu_telemetry.dcgm import DcgmSource, parse
from servelab.host.gpu_telemetry.nvml import Nvml, NvmlSource, open_nvml

MIB = 2**20


@pytest.fixture
def nvml(monkeypatch):
    module = import_double(monkeypatch)
    clock = Clock()

    def load(**options):
        return module._double_load(series(), clock, **options)

    module.clock = clock
    module.load = load
    yield module
    module._double_unload()
    sys.modules.pop("pynvml", None)


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"  # closed again: nothing listens there


def test_nvml_reads_every_field_in_its_unit(nvml):
    nvml.load()
    doc = series()
    source, why = open_nvml(clock=nvml.clock)
    assert source is not None and why == ""
    nvml.clock.at(5.0)
    first = source.read()
    nvml.clock.at(5.25)
    second = source.read()
    assert [r.gpu for r in second] == list(range(8))
    frame = frame_at(doc, 5.25)["gpus"]
    for a, b, want, gpu in zip(first, second, frame, doc["gpus"]):
        assert b.name == "NVIDIA H200" and b.uuid == gpu["uuid"] and b.mem_total_bytes == gpu["mem_total_bytes"]
        assert b.power_w == want["power_w"]  # NVML's mW, in W
        # the counter (mJ) rises by power x dt: 0.25 s at the keyframe's power
        assert b.energy_mj - a.energy_mj == pytest.approx(want["power_w"] * 0.25 * 1000, abs=1)
        assert b.sm_source == "gpm" and b.sm_active_pct == pytest.approx(want["sm_util_pct"])
        assert b.mem_used_bytes == want["mem_used_bytes"]
        assert (b.sm_clock_mhz, b.mem_clock_mhz, b.temp_c) == (want["sm_clock_mhz"], want["mem_clock_mhz"],
                                                               want["temp_c"])
        assert b.pcie_tx_bytes_s == pytest.approx(want["pcie_tx_mib_s"] * MIB)  # GPM's MiB/s in bytes/s
        assert b.nvlink_rx_bytes_s == pytest.approx(want["nvlink_rx_mib_s"] * MIB)
        assert b.processes == tuple(p["pid"] for p in want["processes"])
        assert b.throttle_ns == 0 and b.xid_errors == 0 and b.xid_last is None
        assert b.retired_pages == gpu["retired_sbe"] + gpu["retired_dbe"]
    source.close()


def test_nvml_power_cap_shows_as_throttle_time_and_reasons(nvml):
    nvml.load()
    source, _ = open_nvml(clock=nvml.clock)
    nvml.clock.at(13.0)
    during = source.read()
    nvml.clock.at(15.0)
    after = source.read()
    capped = frame_at(series(), 13.0)["gpus"][0]
    assert during[0].throttle_reasons == capped["clocks_event_reasons"] == nvml.nvmlClocksEventReasonSwPowerCap
    assert during[0].throttle_ns == 1_000_000_000  # capped from 12 s: 1 s so far, in ns
    assert after[0].throttle_ns == 2_000_000_000  # the whole 12-14 s cap
    source.close()


def test_nvml_xid_event_is_counted_and_noted(nvml):
    nvml.load()
    source, _ = open_nvml(clock=nvml.clock)
    nvml.clock.at(13.9)
    assert all(r.xid_errors == 0 for r in source.read())
    assert source.take_notes() == []
    nvml.clock.at(14.1)
    readings = {r.gpu: r for r in source.read()}
    assert (readings[5].xid_errors, readings[5].xid_last) == (1, 31)
    assert all(r.xid_errors == 0 for g, r in readings.items() if g != 5)
    notes = source.take_notes()
    assert len(notes) == 1 and notes[0].startswith("XID 31 on GPU 5 (GPU-")
    nvml.clock.at(14.5)
    assert {r.gpu: r for r in source.read()}[5].xid_errors == 1  # counted once
    source.close()


def test_nvml_without_gpm_falls_back_to_utilization(nvml):
    nvml.load(gpm=False)
    source, _ = open_nvml(clock=nvml.clock)
    nvml.clock.at(6.0)
    readings = source.read()
    want = frame_at(series(), 6.0)["gpus"]
    assert [r.sm_source for r in readings] == ["utilization"] * 8
    assert [r.sm_active_pct for r in readings] == [float(g["util_pct"]) for g in want]
    assert all(r.pcie_tx_bytes_s is None and r.nvlink_tx_bytes_s is None for r in readings)  # GPM-only here
    source.close()


def test_nvml_pcie_without_gpm_only_when_asked(nvml):
    """nvmlDeviceGetPcieThroughput samples the bus ~20 ms per call: read per tick only with pcie_fallback."""
    nvml.load(gpm=False)
    source = NvmlSource(Nvml(), clock=nvml.clock, pcie_fallback=True)
    nvml.clock.at(6.0)
    reading = source.read()[2]
    want = frame_at(series(), 6.0)["gpus"][2]
    assert reading.pcie_tx_bytes_s == int(want["pcie_tx_mib_s"] * 1024) * 1024.0  # NVML's KB/s, in bytes/s
    assert reading.pcie_rx_bytes_s == int(want["pcie_rx_mib_s"] * 1024) * 1024.0
    source.close()


def test_nvml_unsupported_field_is_none_and_not_asked_again(nvml):
    nvml.load(energy=False)
    calls = []
    real = nvml.nvmlDeviceGetTotalEnergyConsumption

    def counted(handle):
        calls.append(handle)
        return real(handle)

    nvml.nvmlDeviceGetTotalEnergyConsumption = counted
    source, _ = open_nvml(clock=nvml.clock)
    for t in (1.0, 1.25, 1.5):
        nvml.clock.at(t)
        readings = source.read()
        assert all(r.energy_mj is None and r.power_w is not None for r in readings)
    assert len(calls) == 8  # once per device, then remembered
    source.close()


def test_nvml_lost_gpu_is_dropped_loudly(nvml):
    nvml.load(lost={3: 10.0})
    source, _ = open_nvml(clock=nvml.clock)
    nvml.clock.at(9.75)
    assert len(source.read()) == 8
    nvml.clock.at(10.0)
    readings = source.read()
    assert [r.gpu for r in readings] == [0, 1, 2, 4, 5, 6, 7]
    notes = source.take_notes()
    assert len(notes) == 1 and "GPU 3 (GPU-" in notes[0] and "is lost" in notes[0]
    nvml.clock.at(10.25)
    assert len(source.read()) == 7 and source.take_notes() == []
    source.close()


def test_nvml_energy_counter_reset_is_reported_as_read(nvml):
    """The source reports the counter as NVML gives it; the figures (not the source) handle the drop."""
    nvml.load(energy_reset={0: 8.0})
    source, _ = open_nvml(clock=nvml.clock)
    nvml.clock.at(7.5)
    before = source.read()[0].energy_mj
    nvml.clock.at(8.5)
    after = source.read()[0].energy_mj
    assert after < before
    assert after == pytest.approx(frame_at(series(), 8.0)["gpus"][0]["power_w"] * 0.5 * 1000, abs=1)
    source.close()


def test_nvml_without_a_driver_says_why(nvml):
    nvml.load(driver=False)
    source, why = open_nvml()
    assert source is None and why == "no NVIDIA driver (Driver Not Loaded)"
    nvml._double_unload()
    source, why = open_nvml()
    assert source is None and why == "no NVIDIA driver (NVML Shared Library Not Found)"


def test_nvml_session_serves_the_older_callers(nvml):
    """Provenance, the environment sampler and start-up evidence read through the same module."""
    from servelab.host.gpus import host_gpus

    nvml.load()
    gpus, driver = host_gpus()
    assert driver == "560.35.03" and len(gpus) == 8
    assert gpus[0] == {"index": 0, "name": "NVIDIA H200", "memory_total_bytes": 150754820096,
                       "uuid": series()["gpus"][0]["uuid"]}
    session = Nvml()
    nvml.clock.at(6.0)
    used, busiest = session.memory_of({4242, 4243})
    assert used == 2 * 132 * 2**30 and busiest == 100.0
    util, clock = session.mean_utilization_and_clock()
    assert (util, clock) == (100.0, 1980.0)
    session.close()
    assert nvml._machine.inits == 0  # every session shut NVML down again


def test_nvml_source_refuses_a_session_without_gpus(nvml):
    nvml.load(driver=False)
    with pytest.raises(ValueError, match="no NVIDIA driver"):
        NvmlSource(Nvml())


@pytest.fixture
def dcgm_server():
    server = ScrapeServer(dcgm_bodies())
    yield server
    server.close()


def test_dcgm_scrapes_convert_units_and_give_known_deltas(dcgm_server):
    source = DcgmSource(dcgm_server.url)
    assert source.name == f"dcgm {dcgm_server.url}"
    first, second = source.read(), source.read()
    assert dcgm_server.hits == 2 and source.last_error is None
    assert [r.gpu for r in second] == list(range(8))
    for i, (a, b) in enumerate(zip(first, second)):
        assert b.name == "NVIDIA H200" and b.uuid == f"GPU-6f1c2a4e-9b1d-4c3a-8e2f-00000000000{i}"
        assert b.energy_mj - a.energy_mj == 650000 + 1000 * i  # mJ, as the exporter counts
        assert b.throttle_ns - a.throttle_ns == 250000 * 1000  # us -> ns
        assert b.power_w - a.power_w == pytest.approx(15.0)  # W
        assert b.mem_used_bytes - a.mem_used_bytes == MIB  # MiB -> bytes
        assert b.mem_used_bytes == (135037 + i + 1) * MIB
        assert b.sm_source == "dcgm_prof" and b.sm_active_pct == pytest.approx((0.612 + 0.01 * i + 0.05) * 100)
        assert b.mem_total_bytes == (135037 + i + 1 + 8211 - i) * MIB
        assert (b.sm_clock_mhz, b.mem_clock_mhz) == (1980.0, 3201.0)
        assert b.pcie_rx_bytes_s == 1572011520 + i and b.throttle_reasons == 4
        assert b.nvlink_tx_bytes_s is None and b.energy_mj is not None  # not in this exporter's counters
    assert second[5].xid_last == 31 and first[5].xid_last == 0
    notes = source.take_notes()
    assert len(notes) == 1 and notes[0].startswith("XID 31 on GPU 5")


def test_dcgm_an_xid_already_there_at_the_first_scrape_is_said_as_such():
    server = ScrapeServer(list(reversed(dcgm_bodies())))
    try:
        source = DcgmSource(server.url)
        source.read()
        notes = source.take_notes()
        assert len(notes) == 1 and "reports XID 31 as its last error (it may predate this run)" in notes[0]
        source.read()
        assert source.take_notes() == []  # the XID went back to 0: nothing new
    finally:
        server.close()


def test_dcgm_without_profiling_fields_uses_gpu_util():
    body = "\n".join(line for line in dcgm_bodies()[0].decode().splitlines() if "DCGM_FI_PROF_" not in line)
    readings = parse(body, t_ns=1)
    assert [r.sm_source for r in readings] == ["dcgm_util"] * 8
    assert [r.sm_active_pct for r in readings] == [100.0] * 8
    assert all(r.pcie_tx_bytes_s is None for r in readings)


def test_dcgm_fast_split_agrees_with_prometheus_clients_full_parser():
    from servelab.host.gpu_telemetry.dcgm import _values_by_gpu, _values_by_gpu_slow

    for body in dcgm_bodies():
        text = body.decode()
        assert _values_by_gpu(text) == _values_by_gpu_slow(text)
        assert len(_values_by_gpu(text)) == 8
    # a line of another shape (no labels, a timestamp) goes through the full parser and still reads
    odd = 'DCGM_FI_DEV_COUNT 8\nDCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-x"} 612.5 1733000000000\n'
    assert parse(odd, t_ns=1)[0].power_w == 612.5


def test_dcgm_failures_are_one_line_and_empty():
    closed = DcgmSource(closed_port_url(), timeout_s=0.5)
    assert closed.read() == [] and "did not answer" in closed.last_error and "\n" not in closed.last_error
    failing = ScrapeServer([b"busy"], status=503)
    try:
        source = DcgmSource(failing.url)
        assert source.read() == [] and source.last_error == f"{failing.url} answered HTTP 503"
    finally:
        failing.close()
    not_dcgm = ScrapeServer([b"# HELP up Up.\n# TYPE up gauge\nup 1\n"])
    try:
        source = DcgmSource(not_dcgm.url)
        assert source.read() == [] and source.last_error == f"{not_dcgm.url} lists no DCGM_FI_* GPU field"
    finally:
        not_dcgm.close()


def test_dcgm_body_is_bounded(monkeypatch):
    import servelab.host.gpu_telemetry.dcgm as dcgm

    monkeypatch.setattr(dcgm, "MAX_BODY_BYTES", 1000)
    server = ScrapeServer(dcgm_bodies())
    try:
        source = DcgmSource(server.url)
        assert source.read() == [] and "more than" in source.last_error
    finally:
        server.close()


def test_amdsmi_not_importable_is_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi raises ImportError
    assert open_amdsmi() == (None, "no amdsmi")


def test_open_source_prefers_nvml_when_local(nvml, dcgm_server):
    nvml.load()
    source, why = open_source([dcgm_server.url], local=True, clock=nvml.clock)
    assert source.name == "nvml" and why == ""
    assert dcgm_server.hits == 0  # never asked
    source.close()


def test_open_source_takes_the_first_dcgm_url_that_answers(nvml, dcgm_server, monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    nvml.load()
    dead = closed_port_url()
    source, why = open_source([dead, dcgm_server.url], local=False, default_dcgm_url=closed_port_url())
    assert source.name == f"dcgm {dcgm_server.url}" and why == ""


def test_open_source_tries_the_default_endpoint_only_when_it_listens(dcgm_server, monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    source, why = open_source([], local=False, default_dcgm_url=dcgm_server.url)
    assert source.name == f"dcgm {dcgm_server.url}"
    dead = closed_port_url()
    source, why = open_source([], local=False, default_dcgm_url=dead)
    assert source is None
    assert why == f"not measured: no GPU telemetry source (no DCGM exporter at {dead}, no amdsmi)"


def test_open_source_on_this_machine_says_none_in_one_line(monkeypatch):
    """No GPU, no driver, no exporter, no amdsmi here: one line, no table of blanks."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    default = "http://127.0.0.1:9400/metrics"
    with socket.socket() as probe:
        probe.settimeout(0.2)
        if probe.connect_ex(("127.0.0.1", 9400)) == 0:
            pytest.skip("something listens on 127.0.0.1:9400 on this machine")
    source, why = open_source()
    assert source is None
    assert why == (f"not measured: no GPU telemetry source (no NVIDIA driver, no DCGM exporter at {default}, "
                   f"no amdsmi)")
