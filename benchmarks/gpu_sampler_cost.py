"""What the GPU sampler costs the host it measures: CPU time per second of sampling at 4 Hz, for 8 GPUs.

The sampler runs on a daemon thread beside the client's event loop for the whole of every level, so its CPU is
taken from the machine the engine (and the load generator) runs on. Target: under 1 % of one core at 4 Hz.

Three sources, each for --seconds of real sampling on the sampler's own thread while the main thread sleeps
(process CPU time over wall time, so the count is the sampler's thread and nothing else in this process):
- nvml-double: NVML through tests/doubles/pynvml replaying the 8 x H200 series. The double replays in Python
  (an integral over the series per energy call), the real library makes one ctypes call into the driver per
  field: the two differ, and the row bounds the sampler's own side (reading, building GpuReading, encoding).
- dcgm: a real HTTP GET of an 8-GPU dcgm-exporter scrape (tests/fixtures/dcgm, ~46 KB) from a server in a
  separate process, parsed with prometheus_client.
- write-only: a source that hands back 8 fixed readings: the cost of the series file alone.

    .venv/bin/python benchmarks/gpu_sampler_cost.py [--seconds 15] [--interval 0.25]

Prints a table, writes benchmarks/results/gpu_sampler_cost.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from servelab.host.gpu_telemetry.dcgm import DcgmSource  # noqa: E402
from servelab.host.gpu_telemetry.sampler import GpuSampler, iter_lines  # noqa: E402
from servelab.provenance import host_info  # noqa: E402
from servelab.records import GpuReading  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "gpu_sampler_cost.json"
TARGET_PCT_OF_CORE = 1.0


class FixedSource:
    name = "fixed"

    def __init__(self, template: list[GpuReading]) -> None:
        self.template = template

    def read(self) -> list[GpuReading]:
        t = time.perf_counter_ns()
        return [r.model_copy(update={"t_ns": t}) for r in self.template]

    def close(self) -> None:
        pass


def measure(source, seconds: float, interval_s: float, workdir: Path) -> dict:
    path = workdir / f"{source.name.split()[0]}.jsonl.gz"
    sampler = GpuSampler(source, path, interval_s=interval_s)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    reads = [ns for doc in iter_lines(path) if doc["kind"] == "chunk" for ns in doc["read_ns"]]
    reads.sort()
    gpus = max((len(doc["gpus"]) for doc in iter_lines(path) if doc["kind"] == "chunk"), default=0)
    return {"source": source.name.split()[0], "gpus": gpus, "ticks": sampler.ticks, "overruns": sampler.overruns,
            "rate_hz": round(sampler.ticks / wall, 2), "cpu_pct_of_core": round(100 * cpu / wall, 3),
            "cpu_ms_per_tick": round(1000 * cpu / max(1, sampler.ticks), 3),
            "read_ms_p50": round(reads[len(reads) // 2] / 1e6, 3) if reads else None,
            "bytes_per_tick": round(path.stat().st_size / max(1, sampler.ticks), 1),
            "write_error": sampler.write_error}


def nvml_double_source():
    import pynvml  # the double: tests/ is first on sys.path via tests/doubles below

    from gpu_doubles import NVML_SERIES
    from servelab.host.gpu_telemetry.nvml import open_nvml

    start = time.perf_counter_ns()
    period = 20 * 10**9  # replay the 20 s series round and round
    pynvml._double_load(NVML_SERIES, lambda: start + (time.perf_counter_ns() - start) % period)
    source, why = open_nvml()
    if source is None:
        raise SystemExit(f"the NVML double did not open: {why}")
    return source


def dcgm_server(workdir: Path) -> tuple[subprocess.Popen, str]:
    served = workdir / "served"
    served.mkdir()
    shutil.copy(ROOT / "tests" / "fixtures" / "dcgm" / "h200x8_scrape2.txt", served / "metrics")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
                             str(served), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}/metrics"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--interval", type=float, default=0.25)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "doubles"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        rows.append(measure(nvml_double_source(), args.seconds, args.interval, workdir))
        proc, url = dcgm_server(workdir)
        try:
            dcgm = DcgmSource(url)
            template = dcgm.read()
            if not template:
                raise SystemExit(f"the DCGM fixture server did not answer: {dcgm.last_error}")
            rows.append(measure(dcgm, args.seconds, args.interval, workdir))
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        rows.append(measure(FixedSource(template), args.seconds, args.interval, workdir))
    host = host_info()
    doc = {"benchmark": "gpu_sampler_cost", "seconds": args.seconds, "interval_s": args.interval,
           "target_pct_of_core": TARGET_PCT_OF_CORE,
           "host": {"cpu": host.cpu_model, "cores": host.cpu_cores_logical}, "rows": rows,
           "met": all(r["cpu_pct_of_core"] < TARGET_PCT_OF_CORE for r in rows)}
    print(f"{'source':<12} {'gpus':>4} {'ticks':>6} {'Hz':>6} {'overruns':>8} {'CPU % core':>10} "
          f"{'ms/tick':>8} {'read p50 ms':>11} {'B/tick':>7}")
    for r in rows:
        print(f"{r['source']:<12} {r['gpus']:>4} {r['ticks']:>6} {r['rate_hz']:>6} {r['overruns']:>8} "
              f"{r['cpu_pct_of_core']:>10} {r['cpu_ms_per_tick']:>8} {r['read_ms_p50']:>11} {r['bytes_per_tick']:>7}")
    print(f"target: under {TARGET_PCT_OF_CORE} % of a core: {'met' if doc['met'] else 'NOT met'}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
