"""What the warm-up does to the default run's comparison (issue 21): the single-stream TTFT and ITL intervals.

    .venv/bin/python benchmarks/warmup_effect.py --label after                 # runs `servelab run --json` now
    .venv/bin/python benchmarks/warmup_effect.py --label one --run-args="--warmup 1"  # the old default, same code
    .venv/bin/python benchmarks/warmup_effect.py --label before --from run.json  # a run made earlier (another tree)

Each label gets, from the comparison: every row's ratio (well-configured / misconfigured), its 95 % interval and
the interval's width as hi/lo, the verdict, and each cell's trial values; from the run's records: each measured
single-stream request's TTFT with the prompt tokens the server had cached (llama.cpp's `cached_tokens`), which
tells a cold prefill from a prefix-cache hit. Merged into benchmarks/results/warmup_effect.json. One run per label
on a shared 2-core machine: read the numbers as sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from servelab.store.rundir import iter_records

RESULTS = Path(__file__).parent / "results" / "warmup_effect.json"
ROWS = ("single.ttft_ms", "single.itl_ms", "single.decode_tok_s", "peak.output_tok_s", "load.ttft_ms")


def run_default(out: Path, extra: list[str]) -> tuple[dict, float, str]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "servelab.cli", "run", "--out", str(out), "--json", *extra],
                          capture_output=True, text=True)
    return json.loads(proc.stdout), time.monotonic() - t0, proc.stderr


def summarize(result: dict) -> dict:
    comparison = result.get("comparison")
    if comparison is None:  # stopped (a busy machine) before a comparison: nothing to read
        return {"comparison_error": result.get("comparison_error"), "rows": {}, "single_requests": {}}
    names = [r["name"] for r in comparison["runs"]]
    rows = {}
    for row in comparison["rows"]:
        if row["key"] not in ROWS:
            continue
        ratio = row["ratios"][1]
        lo, hi = ratio["ci"] or (None, None)
        rows[row["key"]] = {
            "label": row["label"], "ratio": ratio["ratio"], "ci": ratio["ci"], "verdict": ratio["verdict"],
            "ci_width_hi_over_lo": hi / lo if lo else None,
            "cells": {name: {"value": f["value"], "ci": f["ci"], "trial_values": f["trial_values"]}
                      for name, f in zip(names, row["figures"])}}
    single = {}
    out_dir = Path(result["out_dir"])
    for name in names:
        path = out_dir / name / "records.jsonl.gz"
        if not path.exists():
            continue
        single[name] = [{"trial": r.trial, "index": r.index, "warmup": r.warmup,
                         "ttft_ms": round((r.events[0].t_ns - r.t_send_ns) / 1e6, 1) if r.events else None,
                         "prompt_tokens": r.usage.prompt_tokens if r.usage else None,
                         "cached_tokens": r.usage.cached_tokens if r.usage else None}
                        for r in iter_records(path) if r.tag == "single"]
    return {"excluded_trials": {r["name"]: r["excluded_trials"] for r in comparison["runs"]},
            "warnings": comparison.get("warnings", []), "rows": rows, "single_requests": single}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--from", dest="source", type=Path, help="a `servelab run --json` output made earlier")
    ap.add_argument("--out", type=Path, help="run root (default: /tmp/warmup_effect_runs/LABEL, a fresh store)")
    ap.add_argument("--note", default="", help="what else was running")
    ap.add_argument("--run-args", default="", help="more `servelab run` options, e.g. '--warmup 1'")
    args = ap.parse_args()
    load_before = os.getloadavg()
    wall = None
    if args.source:
        result = json.loads(args.source.read_text())
    else:
        out = args.out or Path("/tmp/warmup_effect_runs") / args.label
        result, wall, stderr = run_default(out, args.run_args.split())
        (out / "stderr.txt").write_text(stderr)
    now = not args.source  # the load of a run made earlier is not known here: say it in --note
    entry = {"load_avg_1m_at_start": round(load_before[0], 2) if now else None,
             "load_avg_1m_at_end": round(os.getloadavg()[0], 2) if now else None,
             "wall_s": round(wall, 1) if wall else None, "note": args.note, "status": result["status"],
             "run_args": args.run_args, "code": "see note" if args.source else "this tree",
             **summarize(result)}
    doc = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    doc[args.label] = entry
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    for key, row in entry["rows"].items():
        ci = row["ci"]
        print(f"{args.label:8} {key:22} x{row['ratio']:.2f} "
              + (f"[{ci[0]:.3g}-{ci[1]:.3g}] width x{row['ci_width_hi_over_lo']:.2f}" if ci else "no interval")
              + f" {row['verdict']}")


if __name__ == "__main__":
    main()
