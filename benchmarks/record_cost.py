"""What a finished request costs the client's event loop: folding it into its level's tally and writing it.

Both run in the event loop that stamps every other stream's token times, so whatever they take is a timing error
for the streams whose tokens arrive meanwhile (docs/metrics.md#bounded-memory). On a quiet 16-core host, ~1.6 ms
per 256-token request put the soak's ITL p99 1.46 ms above the truth server's; ~0.3 ms puts it within 0.03 ms
(results/long_run_quiet.json). This measures the cost directly, per record and per token, for answers of 64, 256
and 1,024 tokens (one token per event, and 4-token events as a speculative decoder sends them), against the cost
of `RequestRecord.model_dump_json` of the same record: the ratio says how many JSON dumps a fold is worth, so it
means the same on a fast and a slow machine.

    .venv/bin/python benchmarks/record_cost.py [--records 400]

Target: fold + write of a 256-token record at most ~0.6 ms p50 on the 2-core VM, about 4 JSON dumps of it: the
cost at which the quiet host read the soak's ITL p99 within 0.03 ms of the truth. A rise here is a timing error in
every concurrent run. Measured on the 2-core VM (results/record_cost.json; two runs a minute apart, so read the
spread): 256 tokens 0.37–0.59 ms (fold 0.16–0.34, write 0.21–0.25), 1,024 tokens 1.2–2.0 ms, 4-token events
0.16–0.26 ms; ~1–3 µs per token.
Prints a table, writes benchmarks/results/record_cost.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servelab.bench.tally import LevelTally  # noqa: E402
from servelab.provenance import host_info  # noqa: E402
from servelab.records import RequestRecord, TokenEvent  # noqa: E402
from servelab.store.rundir import RunDir  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "record_cost.json"
NS_PER_MS = 1_000_000


def record(i: int, tokens: int, per_event: int, rng: random.Random) -> RequestRecord:
    t0 = 1_000_000_000 + i * 10_000_000
    t = t0 + 20 * NS_PER_MS
    events = []
    for _ in range(tokens // per_event):
        events.append(TokenEvent(t + rng.randint(0, 50_000), "answer", per_event, "tok" * per_event))
        t += 10 * NS_PER_MS * per_event
    return RequestRecord(index=i, tag="c64", endpoint="/v1/chat/completions", t_send_ns=t0,
                         t_first_byte_ns=t0 + 19 * NS_PER_MS, t_end_ns=events[-1].t_ns + 100_000, ok=True,
                         events=events, finish_reason="length", count_method="server_per_chunk")


def timed(fn, records: list[RequestRecord]) -> list[int]:
    out = []
    for r in records:
        t0 = time.perf_counter_ns()
        fn(r)
        out.append(time.perf_counter_ns() - t0)
    out.sort()
    return out


def q(values: list[int], p: float) -> float:
    return values[min(int(len(values) * p), len(values) - 1)] / 1e3  # microseconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=400)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    rng = random.Random(0)
    rows = []
    gc.freeze()  # as the client does: the collector does not walk what was alive before the level
    for tokens, per_event in ((64, 1), (256, 1), (1024, 1), (256, 4)):
        records = [record(i, tokens, per_event, rng) for i in range(args.records)]
        run_dir = RunDir.create(Path(tempfile.mkdtemp(prefix="servelab-record-cost-")), "bench", "concurrency")
        run_dir.open_records()
        tally = LevelTally(window_start_ns=0, floor=lambda: 2**62)  # every event inside: the usual case
        dump = timed(lambda r: r.model_dump_json(), records)
        fold = timed(tally.append, records)
        write = timed(run_dir.append_record, records)
        run_dir.close()
        both = sorted(a + b for a, b in zip(fold, write))
        row = {"tokens": tokens, "tokens_per_event": per_event, "records": args.records,
               "fold_us_p50": q(fold, 0.5), "fold_us_p99": q(fold, 0.99),
               "write_us_p50": q(write, 0.5), "write_us_p99": q(write, 0.99),
               "fold_and_write_us_p50": q(both, 0.5), "fold_and_write_us_p99": q(both, 0.99),
               "ns_per_token_p50": round(q(both, 0.5) * 1e3 / tokens, 1),
               "json_dump_us_p50": q(dump, 0.5),
               "ratio_to_json_dump": round(q(both, 0.5) / q(dump, 0.5), 2)}
        rows.append(row)
    header = ["tokens", "per event", "fold p50/p99 µs", "write p50/p99 µs", "both p50/p99 µs", "ns/token",
              "× JSON dump"]
    print(" | ".join(header))
    for r in rows:
        print(" | ".join([str(r["tokens"]), str(r["tokens_per_event"]),
                          f"{r['fold_us_p50']:.0f} / {r['fold_us_p99']:.0f}",
                          f"{r['write_us_p50']:.0f} / {r['write_us_p99']:.0f}",
                          f"{r['fold_and_write_us_p50']:.0f} / {r['fold_and_write_us_p99']:.0f}",
                          f"{r['ns_per_token_p50']:.0f}", f"{r['ratio_to_json_dump']:.2f}"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"host": host_info().model_dump(), "rows": rows,
                                    "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
