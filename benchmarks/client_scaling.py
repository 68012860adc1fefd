"""How the client's ceiling grows with worker processes (issue 15): 1, 2, 4, … workers, through the coordinator,
as far as the machine's cores allow; the same workers placed by Ray when it is installed; and this process alone
(today's single-process client) as the baseline.

The client ceiling is the highest offered load timed within `--tolerance-ms` of the truth: a closed-loop level of
c streams against the calibration server (one token every `--itl-ms`, `--osl` tokens a request, `--requests-per-stream`
requests a stream) keeps up when no request failed and the p50 and p99 of the inter-token gaps the client measured
are within the tolerance of the gaps the server actually wrote (the definition of benchmarks/client_ceiling.py).
The ceiling is that level's streamed tokens/s as the server counted them. Concurrency climbs through LEVELS and
stops after `--misses` levels in a row that did not count. A level counts only when the server kept its schedule
too (its writes late by at most one inter-token interval at p99): a saturated server writes in bursts, and a
client that agrees with a bursty truth was not offered the load; the table says which side ran out first.

The calibration server runs as several processes sharing one port (SO_REUSEPORT), pinned to CPUs of their own
(`--server-cpus`, default a quarter of the CPUs), so it is not what runs out: every level also records the
server's own write lateness and CPU. The coordinator and its workers share the other CPUs; N workers are tried
for N up to that count minus one (the coordinator's). Runs unchanged on a many-core machine:

    .venv/bin/python benchmarks/client_scaling.py [--max-workers 8] [--no-ray] [--max 8192]

Prints a table, writes benchmarks/results/client_scaling.json. "scaling" is each ceiling over the one-worker
ceiling; the issue's target is at least 0.8 x N for N workers on N free cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
import uuid
from pathlib import Path

from servelab import aio
from servelab.bench.client import ClientOptions, Deadlines, RequestSpec, StreamClient
from servelab.bench.metrics import percentile, token_gaps_ms
from servelab.bench.workers import WorkerPool
from servelab.calibration import Script, separate_cpus, start_calibration_server
from servelab.provenance import host_info

RESULTS = Path(__file__).parent / "results" / "client_scaling.json"
LEVELS = [16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]


async def level(client, url: str, conc: int, per_stream: int, osl: int) -> dict:
    body = {"model": "calibration", "messages": [{"role": "user", "content": "x"}], "max_tokens": osl}
    records = []

    async def stream() -> None:
        for _ in range(per_stream):
            records.append(await client.send(RequestSpec(endpoint="/v1/chat/completions", body=body,
                                                         headers={"X-Calibration-Id": uuid.uuid4().hex})))

    t0 = time.perf_counter()
    await asyncio.gather(*(stream() for _ in range(conc)))
    wall = time.perf_counter() - t0
    ok = [r for r in records if r.ok]
    gaps = sorted(g for r in ok for g in token_gaps_ms(r))
    return {"failed": len(records) - len(ok), "wall_s": wall, "gaps": len(gaps),
            "gap_ms_p50": percentile(gaps, 50) if gaps else None, "gap_ms_p99": percentile(gaps, 99) if gaps else None}


def judge(row: dict, truth: dict, tolerance: float, itl_ms: float) -> dict:
    """The client kept up when its gaps match the truth's within `tolerance` at p50 and p99 and nothing failed.
    The level counts toward a ceiling only if the server also kept its schedule (its writes late by no more than
    one inter-token interval at p99): a saturated server writes in bursts, and agreeing with a bursty truth says
    nothing about the load that was meant to be offered."""
    t50, t99 = truth["itl_ms_p50"], truth["itl_ms_p99"]
    keeps = (row["failed"] == 0 and row["gap_ms_p50"] is not None and t50 is not None and t99 is not None
             and abs(row["gap_ms_p50"] - t50) <= tolerance and abs(row["gap_ms_p99"] - t99) <= tolerance)
    late = truth.get("late_ms_p99")
    server_ok = late is not None and late <= itl_ms
    return row | {"server_tokens_s": round(truth["tokens_s"] or 0.0, 1), "true_gap_ms_p50": t50,
                  "true_gap_ms_p99": t99, "server_late_ms_p99": late, "keeps_up": keeps,
                  "server_kept_schedule": server_ok, "counts": keeps and server_ok}


async def climb(name: str, make_client, cal, args, levels: list[int]) -> list[dict]:
    rows: list[dict] = []
    async with make_client() as client:
        misses = 0
        for conc in levels:
            since = time.perf_counter_ns()
            row = await level(client, cal.url, conc, args.requests_per_stream, args.osl)
            truth = await asyncio.get_running_loop().run_in_executor(None, cal.summary, since)
            row = judge({"client": name, "concurrency": conc} | row, truth, args.tolerance_ms, args.itl_ms)
            if hasattr(client, "provenance"):
                row["clock_error_us_max"] = max((w.clock_error_ns or 0) for w in client.provenance()) / 1000
            rows.append(row)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
            misses = 0 if row["counts"] else misses + 1
            if misses >= args.misses:
                break
    return rows


def ceiling(rows: list[dict]) -> dict | None:
    good = [r for r in rows if r["counts"]]
    return max(good, key=lambda r: r["server_tokens_s"]) if good else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--osl", type=int, default=100)
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--tolerance-ms", type=float, default=1.0)
    ap.add_argument("--max", type=int, default=8192, help="highest concurrency tried")
    ap.add_argument("--misses", type=int, default=2)
    ap.add_argument("--max-workers", type=int, default=None, help="default: the client CPUs minus one")
    ap.add_argument("--server-cpus", type=int, default=None, help="default: a quarter of the CPUs (at least 1)")
    ap.add_argument("--no-ray", dest="ray", action="store_false")
    ap.add_argument("--no-single", dest="single", action="store_false", help="skip the single-process baseline")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # workers inherit it: thousands of streams
    cpus = len(os.sched_getaffinity(0))
    server_cpus = args.server_cpus or max(1, cpus // 4)
    client_cpus = max(1, cpus - server_cpus)
    max_workers = args.max_workers or max(1, client_cpus - 1)
    counts = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= max_workers]
    levels = [c for c in LEVELS if c <= args.max]
    script = Script(ttft_ms=0, itl_ms=args.itl_ms, output_tokens=args.osl, usage_style="llamacpp_timings")
    opts = ClientOptions(stream_extras={"timings_per_token": True}, deadlines=Deadlines(idle_s=30, total_s=600))
    try:
        import ray  # noqa: F401
        have_ray = args.ray
    except ImportError:
        have_ray = False
    rows: list[dict] = []
    with start_calibration_server(script, writer="auto", processes=server_cpus) as cal, \
            separate_cpus(cal.pids, server_cpus=server_cpus) as pinning:
        async def run_all() -> None:
            if args.single:
                rows.extend(await climb("single process", lambda: StreamClient(cal.url, opts), cal, args, levels))
            for n in counts:
                rows.extend(await climb(f"{n} worker(s)", lambda n=n: WorkerPool(cal.url, opts, n), cal, args,
                                        levels))
            if have_ray:
                import ray

                from servelab.bench.workers.ray_backend import RayActors

                ray.init(num_cpus=max(counts), include_dashboard=False, logging_level="ERROR")
                try:
                    for n in counts:
                        rows.extend(await climb(f"{n} Ray actor(s)",
                                                lambda n=n: WorkerPool(cal.url, opts, n, backend=RayActors("auto")),
                                                cal, args, levels))
                finally:
                    ray.shutdown()

        aio.run(run_all())

    names = list(dict.fromkeys(r["client"] for r in rows))
    ceilings = {name: ceiling([r for r in rows if r["client"] == name]) for name in names}
    one = ceilings.get("1 worker(s)")
    host = host_info()
    print(f"\nhost: {host.cpu_model}, {cpus} CPUs ({server_cpus} for the calibration server, {client_cpus} for the "
          f"coordinator and workers), load avg {os.getloadavg()[0]:.2f}; truth: {args.itl_ms} ms between tokens, "
          f"{args.osl} tokens a request; tolerance {args.tolerance_ms} ms on p50 and p99 gaps")
    print(f"{'client':18} {'ceiling tok/s':>14} {'at conc':>8} {'x 1 worker':>11} {'target':>7}  first level out")
    summary = {}
    for name in names:
        best = ceilings[name]
        n = int(name.split()[0]) if name[0].isdigit() else None
        ratio = best["server_tokens_s"] / one["server_tokens_s"] if best and one else None
        mine = [r for r in rows if r["client"] == name]
        out = next((r for r in mine if not r["counts"]), None)
        limit = None if out is None else ("client" if not out["keeps_up"] and out["server_kept_schedule"] else
                                          "server" if out["keeps_up"] else "both")
        summary[name] = {"ceiling_tokens_s": best["server_tokens_s"] if best else None, "limit": limit,
                         "at_concurrency": best["concurrency"] if best else None, "x_one_worker": ratio,
                         "target_x": 0.8 * n if n else None}
        print(f"{name:18} {best['server_tokens_s'] if best else 0:>14,.0f} {best['concurrency'] if best else '-':>8} "
              f"{'' if ratio is None else f'{ratio:.2f}':>11} {'' if not n else f'{0.8 * n:.1f}':>7}"
              + (f"  c{out['concurrency']}: {limit} (server late p99 {out['server_late_ms_p99']:.1f} ms)"
                 if out else "") + ("" if best else "   never kept up"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"host": host.model_dump(), "cpus": cpus, "server_cpus": server_cpus,
                                    "pinning": pinning, "loadavg_1m": os.getloadavg()[0],
                                    "event_loop": aio.loop_name(),
                                    "settings": {**vars(args), "out": str(args.out)}, "levels": rows,
                                    "ceilings": summary}, indent=2, default=str) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
