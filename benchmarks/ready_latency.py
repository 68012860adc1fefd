"""How late servelab declares an engine ready, after the engine really is (target: <= 0.5 s, issue #4).

For each engine, an independent poller in its own thread GETs the readiness probe every 10 ms from the moment
the port is known; the engine "is ready" at its first 200. servelab "declares ready" when start_engine returns.
The delay between the two is what servelab adds (its 50 ms probe cadence, its evidence sampling, the return).
Engines: the embedded llama.cpp (xllamacpp + SmolLM2, real) and the replayed SGLang and vLLM start-ups.

    .venv/bin/python benchmarks/ready_latency.py [--runs 5]

Prints a table and writes benchmarks/results/ready_latency.json. On a shared 2-core machine single runs vary:
read the median and the max, not one number.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from servelab.engines import EngineSpec, get_engine
from servelab.lifecycle.launch import start_engine
from servelab.lifecycle.ports import free_port
from servelab.provenance import host_info

RESULTS = Path(__file__).parent / "results" / "ready_latency.json"
TARGET_S = 0.5
POLL_S = 0.01

ENGINES = {
    "llamacpp (real)": dict(engine="llamacpp", model="smollm2"),
    "replay-sglang speed 50": dict(engine="replay-sglang", model="smollm2", options={"speed": "50"}),
    "replay-vllm speed 50": dict(engine="replay-vllm", model="smollm2", options={"speed": "50"}),
}


class FirstOk:
    """GETs `path` every 10 ms until the first 200; remembers when it came (monotonic)."""

    def __init__(self, port: int, path: str):
        self.port, self.path = port, path
        self.at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
            try:
                conn.request("GET", self.path)
                if conn.getresponse().status == 200:
                    self.at = time.monotonic()
                    return
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()
            time.sleep(POLL_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def one_run(fields: dict) -> float | None:
    port = free_port()
    spec = EngineSpec(port=port, **fields)
    poller = FirstOk(port, get_engine(spec.engine).probe_path)
    with tempfile.TemporaryDirectory() as logs:
        running = start_engine(spec, Path(logs), ready_timeout_s=300)
        declared = time.monotonic()
        poller.stop()
        running.stop()
    return None if poller.at is None else declared - poller.at


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for label, fields in ENGINES.items():
        delays = [d for d in (one_run(fields) for _ in range(args.runs)) if d is not None]
        rows.append({"engine": label, "runs": len(delays), "median_s": round(statistics.median(delays), 3),
                     "max_s": round(max(delays), 3), "min_s": round(min(delays), 3),
                     "within_target": max(delays) <= TARGET_S, "delays_s": [round(d, 3) for d in delays]})
    print(f"{'engine':26} {'runs':>4} {'median s':>9} {'max s':>7} {'min s':>7}  target {TARGET_S} s")
    for r in rows:
        print(f"{r['engine']:26} {r['runs']:>4} {r['median_s']:>9.3f} {r['max_s']:>7.3f} {r['min_s']:>7.3f}  "
              f"{'ok' if r['within_target'] else 'MISSED'}")
    host = host_info()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"target_s": TARGET_S, "poller_interval_s": POLL_S, "rows": rows,
                                   "host": {"cpu": host.cpu_model, "cores": host.cpu_cores_logical},
                                   "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2) + "\n")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
