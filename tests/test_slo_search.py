"""The max-load search under latency targets finds a server's known capacity.

The server is tests/slot_server.py: it serves SLOTS requests at a time and queues the rest, so its latency rises
with load and its capacity is known by construction (the calibration server's timing does not depend on load,
so it has no capacity to find). Each request holds a slot for ttft + (tokens - 1) * itl = 20 + 3 * 10 = 50 ms:
- closed loop: up to SLOTS streams never queue (TTFT ~20 ms); one stream more and about a third of the requests
  wait ~50 ms for a slot (TTFT ~70 ms), so `ttft_p90_ms=55` holds at exactly SLOTS streams and not above;
- open loop, constant arrivals: SLOTS / 50 ms = 40 req/s fit; above that the queue grows with every request.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servelab.bench.options import BenchArgs, build_options
from servelab.bench.runner import bench

SLOTS = 2
CAPACITY_REQ_S = SLOTS / 0.050


@pytest.fixture(scope="module")
def slot_server():
    proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "slot_server.py"), "--slots", str(SLOTS),
                             "--ttft-ms", "20", "--itl-ms", "10", "--tokens", "4"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        assert line and line[0] == "LISTENING", line
        yield f"http://127.0.0.1:{line[1]}"
    finally:
        proc.terminate()
        proc.wait(10)


def test_concurrency_search_finds_the_slot_count(slot_server: str) -> None:
    opts = build_options(BenchArgs(mode="slo-search", search="concurrency", concurrency=1, max_concurrency=16,
                                   requests=24, slo="ttft_p90_ms=55", warmup=1))
    result = bench(slot_server, opts)
    search = result.search
    assert search["best"] == SLOTS and search["lowest_failing"] == SLOTS + 1, search
    assert isinstance(search["best"], int)  # streams are whole numbers in the result too
    assert result.headline["slo.max_concurrency"].value == SLOTS
    assert result.headline["slo.goodput_req_s"].value > 0
    probed = [p["load"] for p in search["probes"]]
    assert probed[:3] == [1, 2, 4] and len(probed) == len(set(probed))  # doubling, then bisection
    for lv in result.levels:  # every probe kept as a level, with its verdict
        assert lv.slo["passed"] == (lv.concurrency <= SLOTS)


def test_rate_search_brackets_the_capacity(slot_server: str) -> None:
    opts = build_options(BenchArgs(mode="slo-search", rate="16", arrival="constant", requests=30,
                                   slo="ttft_p90_ms=55", warmup=1, max_probes=6))
    opts.plan.tolerance = 0.15
    result = bench(slot_server, opts)
    search = result.search
    best, failing = search["best"], search["lowest_failing"]
    # Never above what the server can do; never a failure well below it (sleep overshoot on a busy machine makes
    # the real service time a little longer than 50 ms, so the found rate may sit somewhat under 40 req/s).
    assert best is not None and failing is not None, search
    assert 0.5 * CAPACITY_REQ_S <= best <= 1.1 * CAPACITY_REQ_S, search
    assert failing >= 0.6 * CAPACITY_REQ_S, search
    best_level = next(lv for lv in result.levels if lv.rate == best)
    assert best_level.figures["goodput_req_s"].value == pytest.approx(best_level.figures["request_s"].value,
                                                                       rel=0.2)
    assert result.headline["slo.max_rate"].value == best
