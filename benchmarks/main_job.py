"""The main job's wall time, and servelab's own CPU use while it benchmarks a single stream.

Targets (issues #2, #6): the whole default `servelab run` (two cells and their comparison) <= 3 minutes on 2
cores after install, and the client using < 10 % of one core at concurrency 1.

    .venv/bin/python benchmarks/main_job.py [--skip-run] [--requests 8]

Prints a table and writes benchmarks/results/main_job.json. Numbers on a shared 2-core machine vary by ±10 %
or more between runs: read them as sizes, not as exact values.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from servelab.bench.runner import BenchOptions, bench
from servelab.bench.workload import Workload
from servelab.engines import EngineSpec
from servelab.lifecycle.launch import start_engine
from servelab.provenance import host_info

RESULTS = Path(__file__).parent / "results" / "main_job.json"


def time_main_job(out: Path) -> dict:
    """The default `servelab run`: two cells (one slot, eight slots) and their comparison."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "servelab.cli", "run", "--out", str(out), "--json"],
                          capture_output=True, text=True)
    wall = time.monotonic() - t0
    result = json.loads(proc.stdout) if proc.returncode in (0, 1) else {}
    cells = {}
    for cell, summary in zip(result.get("cells", []), result.get("runs", [])):
        head = summary.get("headline", {})
        cells[cell["name"]] = {
            "status": cell["status"], "single_decode_tok_s": head.get("single.decode_tok_s", {}).get("value"),
            "peak_output_tok_s": head.get("peak.output_tok_s", {}).get("value"),
            "peak_note": head.get("peak.output_tok_s", {}).get("note"),
            "stop_reason": next((s["result"].get("stop_reason") for t in summary.get("trials", [])[:1]
                                 for s in t.get("steps", []) if s["name"] == "sweep"), None)}
    return {"exit_code": proc.returncode, "wall_s": round(wall, 1), "cells": cells,
            "verdicts": (result.get("comparison") or {}).get("verdicts", [])}


def client_cpu_single_stream(log_dir: Path, requests: int) -> dict:
    with start_engine(EngineSpec(engine="llamacpp", model="smollm2"), log_dir) as engine:
        cpu0, wall0 = time.process_time(), time.monotonic()
        result = bench(engine.url, BenchOptions(mode="single", single_requests=requests, warmup=1,
                                                workload=Workload(max_tokens=128)))
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        engine_cpu = sum(psutil.Process(engine.pid).cpu_times()[:2])
    level = result.levels[0]
    tokens = level.figures["output_tok_s"].value * level.window_s if level.figures["output_tok_s"].value else 0
    return {"requests": requests, "wall_s": round(wall, 2), "client_cpu_s": round(cpu, 3),
            "client_core_fraction": round(cpu / wall, 4), "tokens": round(tokens),
            "client_cpu_us_per_token": round(cpu / tokens * 1e6, 1) if tokens else None,
            "decode_tok_s": level.figures["decode_tok_s"].value, "engine_cpu_s_total": round(engine_cpu, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-run", action="store_true", help="only measure the client's CPU use")
    ap.add_argument("--requests", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = None if args.skip_run else time_main_job(Path(tmp) / "runs")
        cpu = client_cpu_single_stream(Path(tmp), args.requests)
    host = host_info()
    print(f"host: {host.cpu_model}, {host.cpu_cores_logical} CPUs, load avg {os.getloadavg()[0]:.2f}")
    print(f"{'measure':45} {'value':>12}  target")
    if run:
        print(f"{'servelab run: wall time (s)':45} {run['wall_s']:>12}  <= 180")
        for name, cell in run["cells"].items():
            print(f"{name + ': single-stream decode tok/s':45} {cell['single_decode_tok_s'] or 0:>12.1f}")
            print(f"{name + ': peak output tok/s':45} {cell['peak_output_tok_s'] or 0:>12.1f}  "
                  f"({cell['peak_note']})")
        for verdict in run["verdicts"]:
            print(f"verdict: {verdict}")
    print(f"{'client CPU, single stream (fraction of a core)':45} {cpu['client_core_fraction']:>12.3f}  < 0.10")
    print(f"{'client CPU per token (us)':45} {cpu['client_cpu_us_per_token'] or 0:>12.1f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"host": host.model_dump(), "loadavg_1m": os.getloadavg()[0],
                                   "main_job": run, "client_cpu_single_stream": cpu}, indent=2) + "\n")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
