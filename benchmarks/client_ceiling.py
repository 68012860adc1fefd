"""How much streaming load one benchmark-client process can measure accurately, servelab against its peers.

Every tool is pointed at the same calibration server (its own process, `--writer auto`: beyond two streams
one timer writes every stream, so the server stays cheaper per event than any client and the client, not the
server, is what runs out), whose token events are scripted: one token per event, `itl_ms` apart, `osl` tokens
per request. Concurrency rises through LEVELS; at each level the tool sends `requests_per_stream` requests per stream.

Accuracy is judged on the distribution of gaps, the figure every tool reports: the tool's own per-gap
inter-token latencies (pooled over all requests) against the gaps the server actually wrote
(`/calibration/summary`, which needs no cooperation from the client). A client that falls behind reads
several events in one go: its gaps bunch into near-zero and long ones, and its p99 drifts from the truth.
A tool keeps up at a level when no request failed and its p50 and p99 gaps are within `--tolerance-ms` of the
server's. Its ceiling is the highest streamed tokens/s (counted by the server: tokens written over the span
from the first request's receipt to the last token's write) at which it kept up.

    .venv/bin/python benchmarks/client_ceiling.py [--max 2048] [--tools servelab,aiperf,vllm] [--itl-ms 5]

Measured here (2-core Xeon VM, server and client pinned to a CPU each; results/client_ceiling*.json):
5 ms between tokens, run 1 (ticker writer): servelab 30.7k tok/s (c256, where the server itself saturates),
vllm bench serve 11.9k (c64), aiperf never within 1 ms at p99 on one CPU: 2.57x; run 2 (auto writer, a noisier
hour: the truth's own p99 gap at c1 was 7.4 ms): servelab 26.6k (c192), vllm bench and aiperf never (both
failed c1 and c4); 20 ms: servelab 8.9k (c192), vllm bench 0.8k (c16), aiperf 50 (c1): 11x. Levels near the
edge flip between runs (the p99 of a bursty distribution is noisy): read the rows.

Peers are optional and never dependencies (benchmarks/install_peers.sh; benchmarks/peers.py finds and drives
them). Client and server share this machine's cores: every tool pays the same tax, in one run, so the ratio is
what counts. Prints a table, writes benchmarks/results/client_ceiling.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import PeerLevel, aiperf_level, find_peers, vllm_level, whitespace_tokenizer  # noqa: E402

from servelab import aio  # noqa: E402
from servelab.bench.client import ClientOptions, Deadlines, RequestSpec, StreamClient  # noqa: E402
from servelab.bench.metrics import percentile, token_gaps_ms  # noqa: E402
from servelab.calibration import Script, separate_cpus, start_calibration_server  # noqa: E402
from servelab.provenance import host_info  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "client_ceiling.json"
LEVELS = [1, 4, 16, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048]


def server_truth(url: str, since_ns: int) -> dict:
    """The calibration server's own account of the gaps it wrote, for requests received since `since_ns`."""
    with urllib.request.urlopen(f"{url}/calibration/summary?since_ns={since_ns}", timeout=60) as r:
        return json.loads(r.read())


async def _servelab(url: str, conc: int, n_requests: int, osl: int) -> PeerLevel:
    body = {"model": "calibration", "messages": [{"role": "user", "content": "x"}], "max_tokens": osl}
    opts = ClientOptions(stream_extras={"timings_per_token": True}, deadlines=Deadlines(idle_s=30, total_s=600))
    records = []
    remaining = n_requests
    async with StreamClient(url, opts) as client:
        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                records.append(await client.send(RequestSpec(endpoint="/v1/chat/completions", body=body,
                                                             headers={"X-Calibration-Id": uuid.uuid4().hex})))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        wall = time.perf_counter() - t0
    ok = [r for r in records if r.ok]
    return PeerLevel(tokens_s=sum(r.output_tokens for r in ok) / wall, requests_s=len(ok) / wall,
                     gaps_ms=[g for r in ok for g in token_gaps_ms(r)],
                     ttft_ms=[(r.events[0].t_ns - r.t_send_ns) / 1e6 for r in ok if r.events],
                     failed=len(records) - len(ok), wall_s=wall)


def servelab_level(url: str, conc: int, n_requests: int, osl: int, tokenizer_dir: Path, workdir: Path) -> PeerLevel:
    return aio.run(_servelab(url, conc, n_requests, osl))


def run_level(tool: str, exe: str | None, url: str, conc: int, n: int, osl: int, tok_dir: Path,
              workdir: Path) -> PeerLevel:
    if tool == "servelab":
        return servelab_level(url, conc, n, osl, tok_dir, workdir)
    driver = aiperf_level if tool == "aiperf" else vllm_level
    return driver(exe, url, conc, n, osl, tok_dir, workdir)


def judge(tool: str, conc: int, res: PeerLevel, truth: dict, tolerance: float, cpu_s: float | None) -> dict:
    gaps = sorted(res.gaps_ms)
    p50, p99 = (percentile(gaps, 50), percentile(gaps, 99)) if gaps else (None, None)
    t50, t99 = truth["itl_ms_p50"], truth["itl_ms_p99"]
    accurate = (p50 is not None and t50 is not None and abs(p50 - t50) <= tolerance
                and p99 is not None and t99 is not None and abs(p99 - t99) <= tolerance)
    row = {"tool": tool, "concurrency": conc, "server_tokens_s": round(truth["tokens_s"] or 0.0, 1),
           "tool_tokens_s": round(res.tokens_s, 1), "tool_requests_s": round(res.requests_s, 2),
           "gap_ms_p50": _r(p50), "gap_ms_p99": _r(p99), "true_gap_ms_p50": _r(t50), "true_gap_ms_p99": _r(t99),
           "gaps": len(res.gaps_ms), "true_gaps": truth["itl_samples"], "failed": res.failed,
           "requests": truth["requests"], "keeps_up": accurate and res.failed == 0}
    if cpu_s is not None:  # servelab runs in this process: its CPU per streamed token
        row["client_cpu_us_per_token"] = round(cpu_s / max(truth["tokens"], 1) * 1e6, 2)
    return row


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--osl", type=int, default=100)
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--max", type=int, default=2048, help="highest concurrency tried")
    ap.add_argument("--tolerance-ms", type=float, default=1.0)
    ap.add_argument("--tools", default="servelab,aiperf,vllm", help="comma-separated; peers not installed are "
                                                                    "listed as such")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="let client and server share every CPU")
    ap.add_argument("--misses", type=int, default=2, help="stop a tool after this many levels in a row where it "
                                                         "did not keep up")
    args = ap.parse_args()

    installed = find_peers()
    wanted = [t.strip() for t in args.tools.split(",") if t.strip()]
    tools = [t for t in wanted if t == "servelab" or t in installed]
    script = Script(ttft_ms=0, itl_ms=args.itl_ms, output_tokens=args.osl, usage_style="llamacpp_timings")
    rows: list[dict] = []
    problems: dict[str, str] = {}
    with start_calibration_server(script, writer="auto") as cal, tempfile.TemporaryDirectory() as tmp, \
            (separate_cpus(cal.proc.pid) if args.pin else contextlib.nullcontext()) as pinning:
        tok_dir = whitespace_tokenizer(Path(tmp) / "tok")
        for tool in tools:
            misses = 0
            for conc in [c for c in LEVELS if c <= args.max]:
                n = conc * args.requests_per_stream
                since = time.perf_counter_ns()
                cpu0 = _cpu_s()
                try:
                    res = run_level(tool, installed.get(tool), cal.url, conc, n, args.osl, tok_dir, Path(tmp))
                except Exception as exc:  # noqa: BLE001 - a peer that breaks is reported, not fatal
                    problems[tool] = f"c{conc}: {str(exc)[-400:]}"
                    print(f"{tool} c{conc}: {exc}", flush=True)
                    break
                cpu = _cpu_s() - cpu0 if tool == "servelab" else None
                row = judge(tool, conc, res, server_truth(cal.url, since), args.tolerance_ms, cpu)
                rows.append(row)
                print(json.dumps(row), flush=True)
                misses = 0 if row["keeps_up"] else misses + 1
                if misses >= args.misses:
                    break

    ceilings = {}
    for tool in tools:
        good = [r for r in rows if r["tool"] == tool and r["keeps_up"]]
        ceilings[tool] = max(good, key=lambda r: r["server_tokens_s"]) if good else None
    host = host_info()
    print(f"\nhost: {host.cpu_model}, {host.cpu_cores_logical} CPUs, load avg {os.getloadavg()[0]:.2f}; event loop "
          f"{aio.loop_name()}; truth: {args.itl_ms} ms between tokens, {args.osl} tokens per request, tolerance "
          f"{args.tolerance_ms} ms on p50 and p99 gaps; CPUs {pinning or 'shared'}")
    print(f"{'tool':10} {'ceiling tok/s':>14} {'req/s':>8} {'at conc':>8} {'gap p50/p99 ms':>16} "
          f"{'true p50/p99 ms':>16}")
    for tool in wanted:
        best = ceilings.get(tool)
        if tool not in tools:
            print(f"{tool:10} not installed (benchmarks/install_peers.sh)")
        elif best:
            print(f"{tool:10} {best['server_tokens_s']:>14,.0f} {best['tool_requests_s']:>8.1f} "
                  f"{best['concurrency']:>8} {best['gap_ms_p50']:>7.2f}/{best['gap_ms_p99']:<8.2f} "
                  f"{best['true_gap_ms_p50']:>7.2f}/{best['true_gap_ms_p99']:<8.2f}")
        else:
            print(f"{tool:10} {'never kept up':>14}")
        if tool in problems:
            print(f"{'':10} stopped: {problems[tool][:200]}")
    peers = [b["server_tokens_s"] for t, b in ceilings.items() if t != "servelab" and b]
    ratio = ceilings["servelab"]["server_tokens_s"] / max(peers) if ceilings.get("servelab") and peers else None
    if ratio is not None:
        print(f"servelab / best peer: {ratio:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"host": host.model_dump(), "loadavg_1m": os.getloadavg()[0],
                                   "event_loop": aio.loop_name(), "pinning": pinning,
                                   "settings": {**vars(args), "out": str(args.out)},
                                   "levels": rows,
                                   "ceilings": ceilings, "ratio_to_best_peer": ratio, "problems": problems,
                                   "not_installed": [t for t in wanted if t not in tools]}, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
