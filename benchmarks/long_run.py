"""A soak in bounded memory: `servelab bench` held at one offered load for 1, 5 and 20 minutes.

Each run starts a fresh calibration server (its own process, pinned to the last CPU; `bench` on the others) whose
every stream is scripted: TTFT 20 ms, one token every `--itl-ms`, `--osl` tokens. `servelab bench --mode
concurrency --concurrency C --duration D --out DIR` runs as a subprocess, exactly as a user runs it; this script
samples its RSS (psutil, the process and its children) every second and, at the end, reads:

- peak RSS, and RSS at 60 s (the same point of every run, so runs of different lengths compare);
- bytes on disk per streamed token: the run directory's records file over the tokens its records hold;
- what the run costs on disk in all: its run directory plus the run store `bench --out` writes beside it
  (servelab.db and any -wal/-shm left), over the records file alone (`disk_ratio`; the target is at most 1.2: the
  store indexes the run and points at the records file rather than keeping a second copy);
- the client's timing error over the run's last two minutes: the ITL p50 and p99 of the requests sent then
  (from the records file) against the gaps the server actually wrote for the requests it received then
  (`/calibration/summary?since_ns=`, the truth; the server keeps its last 4,096 requests, so a window at the end
  of every run, the same length whatever the run's, is what both sides hold); it must not degrade as the run
  grows;
- the RSS slope over the second half of the longest run, and the RSS that slope gives at one hour.

With `--baseline REF` the shortest duration also runs with servelab as it was at git REF (a worktree under
/tmp), so the table shows before and after measured in one session on the same machine.

    .venv/bin/python benchmarks/long_run.py [--minutes 1,5,20] [--concurrency 64] [--baseline 2e65285]

Prints a table, writes benchmarks/results/long_run.json.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servelab.bench.metrics import percentile, token_gaps_ms  # noqa: E402
from servelab.calibration import Script, separate_cpus, start_calibration_server  # noqa: E402
from servelab.store.rundir import iter_records  # noqa: E402
from servelab.provenance import host_info  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "long_run.json"
ERROR_WINDOW_S = 120.0  # the timing error is taken over each run's last two minutes
DISK_RATIO_TARGET = 1.2  # run directory + store over the records file alone


def rss_bytes(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def one_run(minutes: float, args, python: str, pythonpath: str | None, label: str) -> dict:
    script = Script(ttft_ms=20.0, itl_ms=args.itl_ms, output_tokens=args.osl, prompt_tokens=32)
    server = start_calibration_server(script, writer="auto")
    out = Path(tempfile.mkdtemp(prefix="servelab-soak-"))
    duration = minutes * 60
    cmd = [python, "-m", "servelab.cli", "bench", server.url, "--mode", "concurrency", "--concurrency",
           str(args.concurrency), "--duration", str(duration), "--max-tokens", str(args.osl), "--warmup", "0",
           "--tokenizer", "none", "--max-level-duration", str(duration + 120), "--out", str(out)]
    env = dict(os.environ)
    if pythonpath:  # the baseline's tree first; what PYTHONPATH already held (its dependencies) after it
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    samples: list[tuple[float, int]] = []
    try:
        with separate_cpus(server.pids if hasattr(server, "pids") else server.pid):
            since = time.perf_counter_ns()
            t0 = time.monotonic()
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                                    cwd=pythonpath or ROOT)
            ps = psutil.Process(proc.pid)
            next_report = 60.0
            while proc.poll() is None:
                samples.append((time.monotonic() - t0, rss_bytes(ps)))
                if samples[-1][0] >= next_report:
                    print(f"  {label} {minutes:g} min: {samples[-1][0]:.0f} s, RSS {samples[-1][1] / 2**20:.0f} MB",
                          flush=True)
                    next_report += 60.0
                time.sleep(1.0)
            stderr = proc.stderr.read() if proc.stderr else ""
            end_window = max(since, time.perf_counter_ns() - int(ERROR_WINDOW_S * 1e9))
            truth = server.summary(end_window)
    finally:
        server.stop()
    if proc.returncode not in (0,):
        print(f"  bench exited {proc.returncode}: {stderr[-2000:]}", file=sys.stderr)
    (summary_path,) = out.glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    level = summary["levels"][0]
    records = next((p for p in summary_path.parent.glob("records.jsonl*")), None)
    itl = level["figures"]["itl_ms"]["dist"]
    tokens, end_gaps = 0, []
    for r in iter_records(records) if records else ():
        tokens += r.output_tokens
        if r.ok and r.t_send_ns >= end_window:
            end_gaps.extend(token_gaps_ms(r))
    end_gaps.sort()
    rss_60 = next((r for t, r in samples if t >= 60.0), samples[-1][1] if samples else None)
    half = [(t, r) for t, r in samples if t >= samples[-1][0] / 2] if samples else []
    slope = _slope(half)
    run_dir_bytes = sum(p.stat().st_size for p in summary_path.parent.rglob("*") if p.is_file())
    store_bytes = sum(p.stat().st_size for p in out.glob("servelab.db*") if p.is_file())
    records_bytes = records.stat().st_size if records else None
    row = {
        "code": label, "minutes": minutes, "concurrency": args.concurrency, "itl_ms": args.itl_ms, "osl": args.osl,
        "requests": level["requests"], "tokens": tokens,
        "output_tok_s": level["figures"]["output_tok_s"]["value"],
        "peak_rss_mb": round(max(r for _, r in samples) / 2**20, 1) if samples else None,
        "rss_60s_mb": round(rss_60 / 2**20, 1) if rss_60 else None,
        "rss_slope_mb_per_min": round(slope * 60 / 2**20, 3) if slope is not None else None,
        "records_file": records.name if records else None,
        "records_bytes": records_bytes,
        "bytes_per_token": round(records_bytes / tokens, 2) if records_bytes and tokens else None,
        "run_dir_bytes": run_dir_bytes, "store_bytes": store_bytes,
        "disk_ratio": round((run_dir_bytes + store_bytes) / records_bytes, 3) if records_bytes else None,
        "disk_bytes_per_token": round((run_dir_bytes + store_bytes) / tokens, 2) if tokens else None,
        "run_itl_p50_ms": itl["p50"], "run_itl_p99_ms": itl["p99"], "run_itl_samples": itl["n"],
        "run_itl_note": level["figures"]["itl_ms"].get("note"),
        "error_window_s": ERROR_WINDOW_S,
        "itl_p50_ms": percentile(end_gaps, 50) if end_gaps else None,
        "itl_p99_ms": percentile(end_gaps, 99) if end_gaps else None, "itl_samples": len(end_gaps),
        "true_itl_p50_ms": truth.get("itl_ms_p50"), "true_itl_p99_ms": truth.get("itl_ms_p99"),
        "true_itl_samples": truth.get("itl_samples"), "server_late_ms_p99": truth.get("late_ms_p99"),
        "contended": (level.get("environment") or {}).get("contended"),
        "exit": proc.returncode,
    }
    row["error_p50_ms"] = _err(row["itl_p50_ms"], row["true_itl_p50_ms"])
    row["error_p99_ms"] = _err(row["itl_p99_ms"], row["true_itl_p99_ms"])
    return row


def _f(v) -> str:
    return f"{v:.2f}" if v is not None else "-"


def save(path: Path, rows: list[dict], verdict: dict | None) -> None:
    """Written after every run, so a crash (or Ctrl-C) later loses none that finished."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": host_info().model_dump(), "rows": rows, "verdict": verdict,
                                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2))


def _err(a, b):
    return round(abs(a - b), 3) if a is not None and b is not None else None


def _slope(points: list[tuple[float, int]]) -> float | None:
    """Least-squares slope, bytes per second."""
    if len(points) < 10:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mr = sum(r for _, r in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (r - mr) for t, r in points) / var if var else None


def baseline_tree(ref: str) -> str:
    path = Path(tempfile.gettempdir()) / f"servelab-baseline-{ref}"
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref], check=True,
                       capture_output=True)
    return str(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", default="1,5,20")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--osl", type=int, default=256)
    ap.add_argument("--baseline", default=None, help="a git ref to run the shortest duration with, for before/after")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    minutes = [float(m) for m in args.minutes.split(",")]
    rows = []
    if args.baseline:
        tree = baseline_tree(args.baseline)
        print(f"baseline {args.baseline}: {min(minutes):g} min", flush=True)
        rows.append(one_run(min(minutes), args, sys.executable, tree, f"before ({args.baseline})"))
        save(args.out, rows, None)
    for m in minutes:
        print(f"now: {m:g} min", flush=True)
        rows.append(one_run(m, args, sys.executable, None, "now"))
        save(args.out, rows, None)
    now = [r for r in rows if r["code"] == "now"]
    longest = max(now, key=lambda r: r["minutes"])
    shortest = min(now, key=lambda r: r["minutes"])
    extrapolated = None
    # a slope over a short run's second half is its warm-up, not a leak: extrapolated from 5 minutes on only
    if longest["rss_slope_mb_per_min"] is not None and longest["minutes"] >= 5:
        extrapolated = round(longest["peak_rss_mb"] + longest["rss_slope_mb_per_min"] * (60 - longest["minutes"]), 1)
    verdict = {
        "rss_ratio_longest_to_shortest": round(longest["peak_rss_mb"] / shortest["peak_rss_mb"], 3),
        "rss_at_one_hour_mb_extrapolated": extrapolated,
        "bytes_per_token_before_issue_14": 66,
        "disk_ratio_max": max((r["disk_ratio"] for r in now if r["disk_ratio"] is not None), default=None),
        "disk_ratio_target": DISK_RATIO_TARGET,
    }
    verdict["disk_ratio_ok"] = (verdict["disk_ratio_max"] <= DISK_RATIO_TARGET
                                if verdict["disk_ratio_max"] is not None else None)
    save(args.out, rows, verdict)
    print()
    header = ["code", "min", "requests", "tokens", "tok/s", "peak RSS MB", "RSS@60s MB", "MB/min (2nd half)",
              "B/token", "store MB", "disk/records", "ITL p50 / truth (last 2 min)", "ITL p99 / truth", "err p99 ms", "contended"]
    print(" | ".join(header))
    for r in rows:
        print(" | ".join(str(x) for x in [
            r["code"], f"{r['minutes']:g}", f"{r['requests']:,}", f"{r['tokens']:,}",
            f"{r['output_tok_s']:,.0f}" if r["output_tok_s"] else "-", r["peak_rss_mb"], r["rss_60s_mb"],
            r["rss_slope_mb_per_min"], r["bytes_per_token"], f"{r['store_bytes'] / 2**20:.2f}",
            r["disk_ratio"],
            f"{_f(r['itl_p50_ms'])} / {_f(r['true_itl_p50_ms'])}", f"{_f(r['itl_p99_ms'])} / {_f(r['true_itl_p99_ms'])}",
            r["error_p99_ms"], r["contended"]]))
    print(json.dumps(verdict, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
