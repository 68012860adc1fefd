"""Do the default head-to-head's verdicts survive a rerun, and does a busy machine get flagged instead of
flipping them? (issue #10)

Runs the default `servelab run` (misconfigured vs well-configured llama.cpp, trials interleaved) several times on
the machine as it is ("quiet"), then several times with a CPU hog: a busy-loop process pinned to one core,
started part-way through the run and stopped after a while (by default from 30 s to 90 s, about half the run),
and several times with the hog pinned to one core for the whole run ("sustained").

    .venv/bin/python benchmarks/verdict_stability.py [--quiet-runs 5] [--hog-runs 5] [--sustained-runs 2]
                                                     [--hog-start 30] [--hog-duration 60]
                                                     [--out benchmarks/results/...json]

Prints a table, one row per run: each figure's verdict (well-configured against misconfigured), which trials
were contended, the run's wall time; then the issue's three checks:
  1. no figure is "better" in one run and "worse" in another;
  2. every run with the hog has contended trials flagged;
  3. the load-TTFT verdict ("better": the story the default tells) appears in at least 4 of the quiet runs;
  4. every sustained run ended within twice the quiet runs' median wall time, or stopped early with its reason
     (exit 1);
  5. no better/worse verdict in any run rests on fewer than two clean trials on a side.
Writes every run's verdicts, trial ratios and environment readings to the JSON file.

"Quiet" means nothing was started on purpose: the run's own environment readings say how quiet it was.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "verdict_stability.json"
SHORT = {"single.decode_tok_s": "decode", "single.ttft_ms": "ttft", "single.itl_ms": "itl",
         "peak.output_tok_s": "peak", "load.ttft_ms": "load-ttft"}
MARK = {"better": "better", "worse": "WORSE", "within noise": "noise", "inconsistent": "incons.",
        "contended": "contended", "too few trials": "few", "no interval": "n/i", "missing": "-"}


def hog_process(cpu: int) -> subprocess.Popen:
    """A busy loop pinned to one CPU: what another tenant's job does to the engine's cores."""
    code = f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def one_run(out: Path, hog: tuple[float, float] | None) -> dict:
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "servelab.cli", "run", "--out", str(out), "--new", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    hog_window: list[float] = []
    stop = threading.Event()

    def hogger() -> None:
        start, duration = hog  # type: ignore[misc]  # duration None: to the end of the run
        if stop.wait(start):
            return
        p = hog_process(cpu=(os.cpu_count() or 1) - 1)
        hog_window.append(time.monotonic() - t0)
        stop.wait(duration)  # None: until the run ends
        p.kill()
        p.wait()
        hog_window.append(time.monotonic() - t0)

    thread = threading.Thread(target=hogger, daemon=True) if hog else None
    if thread:
        thread.start()
    stdout, _ = proc.communicate()
    stop.set()
    if thread:
        thread.join()
    wall = time.monotonic() - t0
    doc = json.loads(stdout) if stdout.strip().startswith("{") else {}
    return summarise(doc, proc.returncode, wall, hog_window)


def summarise(doc: dict, code: int, wall: float, hog_window: list[float]) -> dict:
    comparison = doc.get("comparison") or {}
    verdicts, ratios = {}, {}
    for row in comparison.get("rows", []):
        cell = row["ratios"][1] if len(row["ratios"]) > 1 else {}
        verdicts[row["key"]] = cell.get("verdict")
        ratios[row["key"]] = {"ratio": cell.get("ratio"), "ci": cell.get("ci"),
                              "trials": cell.get("trial_ratios")}
    contended: dict[str, list[str]] = {}
    clean: dict[str, int] = {}
    for run in doc.get("runs", []):
        name = run["run_id"].split("/")[-1]
        clean[name] = 0
        for trial in run.get("trials", []):
            levels = [lv for step in trial.get("steps", []) for lv in step["result"]["levels"]]
            busy = [lv["tag"] for lv in levels if (lv.get("environment") or {}).get("contended")]
            if busy or trial.get("status") == "contended":
                contended.setdefault(name, []).append(f"t{trial['index'] + 1}({','.join(busy) or 'stopped'})")
            elif trial.get("status") == "complete":
                clean[name] += 1
    return {"exit_code": code, "wall_s": round(wall, 1), "hog_s": [round(x, 1) for x in hog_window],
            "status": doc.get("status"), "stop_reason": doc.get("stop_reason"), "clean_trials": clean,
            "verdicts": verdicts, "ratios": ratios, "contended": contended,
            "sentences": comparison.get("verdicts", []), "warnings": comparison.get("warnings", [])}


def checks(runs: list[dict]) -> dict:
    directions: dict[str, set[str]] = {}
    for r in runs:
        for key, v in r["verdicts"].items():
            if v in ("better", "worse"):
                directions.setdefault(key, set()).add(v)
    flipped = sorted(k for k, v in directions.items() if len(v) > 1)
    hog_runs = [r for r in runs if r["kind"] == "hog"]
    quiet = [r for r in runs if r["kind"] == "quiet"]
    sustained = [r for r in runs if r["kind"] == "sustained"]
    walls = sorted(r["wall_s"] for r in quiet)
    median = walls[len(walls) // 2] if walls else None
    bounded = [r for r in sustained
               if (median is not None and r["wall_s"] <= 2 * median) or (r["exit_code"] == 1 and r["stop_reason"])]
    thin = [i for i, r in enumerate(runs, 1)
            if any(v in ("better", "worse") for v in r["verdicts"].values())
            and min(r["clean_trials"].values(), default=0) < 2]
    return {
        "no_flips": not flipped, "flipped": flipped,
        "hog_runs_flagged": all(r["contended"] for r in hog_runs),
        "load_ttft_better_quiet": sum(1 for r in quiet if r["verdicts"].get("load.ttft_ms") == "better"),
        "quiet_runs": len(quiet), "quiet_median_wall_s": median,
        "sustained_bounded": len(bounded) == len(sustained), "sustained_runs": len(sustained),
        "verdicts_on_thin_trials": thin,
    }


def table(runs: list[dict]) -> str:
    keys = list(SHORT)
    head = "| run | kind | wall s | " + " | ".join(SHORT[k] for k in keys) + " | contended trials |"
    lines = [head, "|" + "---|" * (len(keys) + 4)]
    for i, r in enumerate(runs, 1):
        busy = "; ".join(f"{cell}: {' '.join(ts)}" for cell, ts in r["contended"].items()) or "none"
        cells = []
        for k in keys:
            v = r["verdicts"].get(k)
            ratio = (r["ratios"].get(k) or {}).get("ratio")
            cells.append(f"{MARK.get(v, v or '-')}" + (f" x{ratio:.2f}" if ratio else ""))
        kind = r["kind"] + (f" {r['hog_s'][0]:.0f}-{r['hog_s'][1]:.0f}s" if len(r["hog_s"]) == 2 else "")
        if r.get("status") == "contended":
            kind += " (stopped, exit 1)"
        lines.append(f"| {i} | {kind} | {r['wall_s']:.0f} | " + " | ".join(cells) + f" | {busy} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quiet-runs", type=int, default=5)
    parser.add_argument("--hog-runs", type=int, default=5)
    parser.add_argument("--sustained-runs", type=int, default=2)
    parser.add_argument("--hog-start", type=float, default=30.0)
    parser.add_argument("--hog-duration", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    runs: list[dict] = []
    plan = ["quiet"] * args.quiet_runs + ["hog"] * args.hog_runs + ["sustained"] * args.sustained_runs
    with tempfile.TemporaryDirectory(prefix="servelab-stability-") as tmp:
        for i, kind in enumerate(plan, 1):
            hog = {"hog": (args.hog_start, args.hog_duration), "sustained": (0.0, None)}.get(kind)
            result = one_run(Path(tmp) / f"run{i}", hog) | {"kind": kind}
            runs.append(result)
            print(f"run {i}/{len(plan)} ({kind}): {result['wall_s']:.0f} s, "
                  + ", ".join(f"{SHORT.get(k, k)} {v}" for k, v in result["verdicts"].items())
                  + f"; contended: {result['contended'] or 'none'}", flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"runs": runs, "checks": checks(runs),
                                            "hog": {"start_s": args.hog_start, "duration_s": args.hog_duration}},
                                           indent=2) + "\n")
    print()
    print(table(runs))
    c = checks(runs)
    print()
    print(f"no figure better in one run and worse in another: {'yes' if c['no_flips'] else 'NO ' + str(c['flipped'])}")
    print(f"every hog run has contended trials flagged: {'yes' if c['hog_runs_flagged'] else 'NO'}")
    print(f"load-TTFT 'better' in quiet runs: {c['load_ttft_better_quiet']} of {c['quiet_runs']}")
    print(f"sustained-hog runs within 2x the quiet median ({c['quiet_median_wall_s']} s) or stopped with the "
          f"reason: {'yes' if c['sustained_bounded'] else 'NO'} ({c['sustained_runs']} runs)")
    print(f"better/worse verdicts on fewer than two clean trials: {c['verdicts_on_thin_trials'] or 'none'}")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
