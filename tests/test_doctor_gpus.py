"""`servelab doctor` reads this host's GPUs at the moment of its verdict: each in one line, with the devices the
server's processes hold; without a telemetry source one line says why (this machine has no GPU). The server is a
real process (the calibration server); NVML is the double in tests/doubles, imported as the real library is."""

from __future__ import annotations

import subprocess
import sys

import pytest
from gpu_doubles import import_double, series

from servelab.lifecycle.doctor import diagnose
from servelab.report.doctor import render_diagnosis
from test_doctor import PY, stop

from rich.console import Console


@pytest.fixture
def ready_server():
    proc = subprocess.Popen([PY, "-m", "servelab.calibration.server", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        _, host, port = proc.stdout.readline().split()
        yield proc, f"http://{host}:{port}"
    finally:
        stop(proc)


def test_without_a_telemetry_source_the_gpus_are_one_line_saying_why(ready_server):
    proc, _ = ready_server
    done = subprocess.run([sys.executable, "-m", "servelab.cli", "doctor", "--pid", str(proc.pid), "--seconds", "1",
                           "--no-stacks"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip().startswith("GPUs")]
    assert len(lines) == 1 and "not measured: no GPU telemetry source" in lines[0], done.stdout


def test_a_url_alone_does_not_read_this_host_s_gpus_as_the_server_s(ready_server):
    # the URL's port is found to be a local process here; a URL with no local listener would be another host's
    d = diagnose(url="http://127.0.0.1:9", seconds=0.2, stacks=False)
    assert d.gpus == [] and d.gpus_note.startswith("not read: the server's process is not on this host")


def test_each_gpu_in_one_line_with_those_the_server_holds(ready_server, monkeypatch):
    proc, _ = ready_server
    module = import_double(monkeypatch)
    doc = series()
    held = {0: 71 * 2**30, 1: 70 * 2**30}  # the server "holds" GPUs 0 and 1
    for frame in doc["series"]:
        for i, gpu in enumerate(frame["gpus"]):
            gpu["processes"] = [{"pid": proc.pid, "used_bytes": held[i]}] if i in held else [{"pid": 4242,
                                                                                              "used_bytes": 2**30}]

    class Clock:
        t_ns = 10**12

        def __call__(self):
            return self.t_ns

    module._double_load(doc, Clock())
    try:
        d = diagnose(pid=proc.pid, seconds=0.5, stacks=False)
    finally:
        module._double_unload()
        sys.modules.pop("pynvml", None)
    assert d.gpus_note is None and len(d.gpus) == 8
    assert d.engine_gpus == [0, 1]
    first = doc["series"][0]["gpus"][0]
    assert d.gpus[0].power_w == first["power_w"] and d.gpus[0].name == "NVIDIA H200"
    console = Console(record=True, width=80)
    render_diagnosis(console, d)
    text = console.export_text()
    gpu_lines = [line for line in text.splitlines() if "NVIDIA H200" in line]
    assert len(gpu_lines) == 8 and all(len(line) <= 80 for line in gpu_lines), text  # one line each, unwrapped
    assert "GPUs (* held by the server's processes)" in text
    assert [line.strip().startswith("* ") for line in gpu_lines] == [True, True] + [False] * 6
    assert gpu_lines[0].strip() == (f"* GPU 0 NVIDIA H200: 566 MB of 151 GB, SM 0 %, {first['power_w']:.0f} W, "
                                    f"{first['temp_c']} °C")
