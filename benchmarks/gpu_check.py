"""The GPU sampler on a real NVIDIA GPU: does it read what the hardware does? (at most ~1 minute, nothing to
download)

A machine with an NVIDIA GPU, its driver, nvidia-ml-py (`pip install 'servelab[gpu]'`) and torch with CUDA:
the sampler runs at 4 Hz over NVML while GPU 0 idles (--idle seconds), runs a bf16 matmul loop (--load seconds,
its tensors held in memory) and idles again. Then, from the series file, inside the load window against the idle
windows around it, it checks that:
- power is read, and rises under load;
- the energy counter rises over the load window, and its delta agrees with the mean power x the window (25 %);
- SM activity is read and is high under load (> 50 %), low idle;
- memory used is read and holds the load's tensors.
What it saw (the figures, each check, the machine: GPU, driver, CPU, sampler source) goes to
benchmarks/results/gpu_check.json. Exit 0: every check passed; 1: one failed; 2: this machine cannot run it
(no torch with CUDA, no NVML), said in one line.

    .venv/bin/python benchmarks/gpu_check.py [--load 30] [--idle 6]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servelab.records import GpuReading  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "gpu_check.json"
ENERGY_AGREEMENT = 0.25  # the counter's delta against mean power x window: sampling at 4 Hz sees most of it
SM_LOADED_PCT = 50.0
SM_IDLE_PCT = 20.0


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def window(readings: list[GpuReading], gpu: int, t0_ns: int, t1_ns: int) -> list[GpuReading]:
    return [r for r in readings if r.gpu == gpu and t0_ns <= r.t_ns <= t1_ns]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def evaluate(readings: list[GpuReading], gpu: int, idle_before: tuple[int, int], load: tuple[int, int],
             idle_after: tuple[int, int], load_bytes: int) -> tuple[list[Check], dict]:
    """The checks and the figures behind them, from the readings of the three windows (ns, inclusive)."""
    idle = window(readings, gpu, *idle_before) + window(readings, gpu, *idle_after)
    loaded = window(readings, gpu, *load)
    checks: list[Check] = []
    seen: dict = {"readings_idle": len(idle), "readings_load": len(loaded)}
    if len(loaded) < 2 or not idle:
        checks.append(Check("readings", False, f"{len(loaded)} readings under load, {len(idle)} idle: too few"))
        return checks, seen
    checks.append(Check("readings", True, f"{len(loaded)} under load, {len(idle)} idle"))

    power_load = _mean([r.power_w for r in loaded if r.power_w is not None])
    power_idle = _mean([r.power_w for r in idle if r.power_w is not None])
    seen.update(power_w_load=power_load, power_w_idle=power_idle)
    checks.append(Check("power", power_load is not None and power_idle is not None and power_load > power_idle,
                        f"mean {power_load} W under load, {power_idle} W idle"))

    first, last = loaded[0], loaded[-1]
    window_s = (last.t_ns - first.t_ns) / 1e9
    if first.energy_mj is None or last.energy_mj is None:
        checks.append(Check("energy", False, "no energy counter read"))
    else:
        energy_j = (last.energy_mj - first.energy_mj) / 1000
        expected = (power_load or 0.0) * window_s
        agree = expected > 0 and abs(energy_j - expected) <= ENERGY_AGREEMENT * expected
        seen.update(energy_j=energy_j, energy_expected_j=expected, window_s=window_s)
        checks.append(Check("energy", energy_j > 0 and agree,
                            f"{energy_j:.1f} J over {window_s:.1f} s; mean power x window {expected:.1f} J"))

    sm_load = _mean([r.sm_active_pct for r in loaded if r.sm_active_pct is not None])
    sm_idle = _mean([r.sm_active_pct for r in idle if r.sm_active_pct is not None])
    sources = sorted({r.sm_source for r in loaded if r.sm_source})
    seen.update(sm_active_pct_load=sm_load, sm_active_pct_idle=sm_idle, sm_source=sources)
    checks.append(Check("sm_activity", sm_load is not None and sm_idle is not None and sm_load > SM_LOADED_PCT
                        and sm_idle < SM_IDLE_PCT,
                        f"mean {sm_load} % under load, {sm_idle} % idle ({', '.join(sources) or 'no source'})"))

    mem_load = _mean([float(r.mem_used_bytes) for r in loaded if r.mem_used_bytes is not None])
    mem_before = _mean([float(r.mem_used_bytes) for r in window(readings, gpu, *idle_before)
                        if r.mem_used_bytes is not None])
    seen.update(mem_used_bytes_load=mem_load, mem_used_bytes_idle_before=mem_before, load_bytes=load_bytes)
    checks.append(Check("memory", mem_load is not None and mem_before is not None
                        and mem_load - mem_before >= 0.9 * load_bytes,
                        f"{(mem_load or 0) / 2**30:.2f} GiB under load, {(mem_before or 0) / 2**30:.2f} GiB before; "
                        f"the load holds {load_bytes / 2**30:.2f} GiB"))
    return checks, seen


def _load(torch, seconds: float, n: int) -> int:
    """A bf16 n x n matmul loop on cuda:0 for `seconds`; the bytes its tensors hold."""
    a = torch.randn(n, n, device="cuda:0", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda:0", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda:0", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    held = 3 * n * n * 2
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
    return held


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=float, default=30.0, help="seconds of matmul load")
    parser.add_argument("--idle", type=float, default=6.0, help="seconds idle before and after")
    parser.add_argument("--size", type=int, default=8192, help="matrix side")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_check: needs torch with CUDA (not importable here); nothing was measured")
        return 2
    if not torch.cuda.is_available():
        print("gpu_check: torch is here but sees no CUDA device; nothing was measured")
        return 2
    from servelab.host.gpu_telemetry import open_source
    from servelab.host.gpu_telemetry.nvml import host_gpus
    from servelab.host.gpu_telemetry.sampler import GpuSampler, iter_notes, iter_readings
    from servelab.provenance import host_info

    source, why = open_source(local=True)
    if source is None or source.name != "nvml":
        print(f"gpu_check: needs NVML (nvidia-ml-py and the driver): {why or source.name + ' answered instead'}")
        if source is not None:
            source.close()
        return 2
    gpus, driver = host_gpus()
    torch.ones(1, device="cuda:0")  # the CUDA context before the idle window, so it is not counted as the load's
    torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        sampler = GpuSampler(source, Path(tmp) / "gpu_series.jsonl.gz", interval_s=0.25).start()
        try:
            t0 = time.perf_counter_ns()
            time.sleep(args.idle)
            t1 = time.perf_counter_ns()
            load_bytes = _load(torch, args.load, args.size)
            t2 = time.perf_counter_ns()
            time.sleep(1.0)  # let power settle before the second idle window
            t3 = time.perf_counter_ns()
            time.sleep(args.idle)
            t4 = time.perf_counter_ns()
        finally:
            sampler.stop()
        readings = list(iter_readings(sampler.path))
        notes = [text for _, text in iter_notes(sampler.path)]
        # the load window leaves 1 s at each end: the ramp up and the matmuls' start are not steady state
        second = 10**9
        checks, seen = evaluate(readings, 0, (t0, t1), (t1 + second, t2 - second), (t3, t4), load_bytes)
        series_bytes = sampler.path.stat().st_size
    host = host_info()
    doc = {"benchmark": "gpu_check", "ok": all(c.ok for c in checks), "checks": [asdict(c) for c in checks],
           "seen": seen, "notes": notes, "source": source.name, "ticks": sampler.ticks,
           "overruns": sampler.overruns, "series_bytes": series_bytes,
           "machine": {"gpus": gpus, "driver": driver, "cpu": host.cpu_model, "cores": host.cpu_cores_logical,
                       "torch": torch.__version__, "cuda": torch.version.cuda,
                       "device": torch.cuda.get_device_name(0)},
           "args": vars(args)}
    for check in checks:
        print(f"{'ok  ' if check.ok else 'FAIL'} {check.name}: {check.detail}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
