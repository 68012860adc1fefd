"""bench --workers (issue 15): worker processes send, one coordinator owns the schedule, the level control and the
figures. Against the calibration server: records come back whole and figures equal one process's on the same
records, open-loop sends keep the schedule across workers, a worker that dies is reported with its records kept,
clocks are measured, and the CLI records every worker in the run's provenance."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from servelab.bench.client import ClientOptions, StreamClient
from servelab.bench.loads import Recorder, Target, run_concurrency, run_rate
from servelab.bench.loads.arrivals import schedule_ns
from servelab.bench.metrics import summarize
from servelab.bench.workers import WorkerPool, auto_workers, parse_workers
from servelab.bench.workers.clock import Exchange, estimate
from servelab.bench.workers.protocol import decode_record, encode_record
from servelab.bench.workloads import Workload
from servelab.calibration import Script, start_calibration_server
from servelab.errors import UserError
from servelab.store.rundir import RunDir, read_records

MS = 1_000_000
TARGET = Target(model="calibration")


@pytest.fixture(scope="module")
def cal():
    with start_calibration_server(Script(ttft_ms=5, itl_ms=2, output_tokens=8)) as handle:
        yield handle


def figures(summary) -> dict:
    return {k: v.model_dump() for k, v in summary.figures.items()}


def shifted(record, by_ns: int):
    """The record as a worker whose clock reads `by_ns` more than the coordinator's would have sent it."""
    return decode_record(encode_record(record), -by_ns)


def test_records_through_the_wire_give_the_figures_one_process_gives(cal) -> None:
    async def one_process():
        async with StreamClient(cal.url) as client:
            return await run_concurrency(client, Workload(max_tokens=8), TARGET, Recorder(), concurrency=3,
                                         duration_s=None, max_requests=12)

    records, window = asyncio.run(one_process())
    assert len(records) == 12 and all(r.ok and r.output_tokens for r in records)
    alone = summarize(records, tag="c3", mode="concurrency", concurrency=3, window=window)
    for offset_ns in (0, 123_456_789_012, -987_654_321):  # the same host; hosts whose clocks differ
        back = [decode_record(encode_record(shifted(r, offset_ns)), offset_ns) for r in records]
        assert [b.model_dump() for b in back] == [r.model_dump() for r in records]  # exact, every field
        via = summarize(back, tag="c3", mode="concurrency", concurrency=3, window=window)
        assert figures(via) == figures(alone)


def test_a_level_through_two_workers_streams_every_record_back(cal, tmp_path) -> None:
    rundir = RunDir.create(tmp_path, "bench", "workers")
    rundir.open_records()
    recorder = Recorder(on_record=rundir.append_record)

    async def go():
        async with WorkerPool(cal.url, ClientOptions(), 2) as pool:
            measured, window = await run_concurrency(pool, Workload(max_tokens=8), TARGET, recorder,
                                                     concurrency=4, duration_s=None, max_requests=40)
            return measured, window, pool.provenance()

    measured, window, workers = asyncio.run(go())
    rundir.close()
    assert len(measured) == 40 and all(r.ok and r.output_tokens == 8 for r in measured)
    assert sorted(r.index for r in measured) == list(range(40))  # the coordinator numbered them, none lost
    # Both workers sent, sharing the four streams (each request went to the worker with fewer in hand: about
    # even, the quicker worker taking a few more on a busy machine).
    assert sum(w.requests for w in workers) == 40 and all(w.requests >= 12 for w in workers)
    assert all(w.status == "ok" for w in workers)
    stored = read_records(rundir.path / "records.jsonl.gz")
    assert [r.model_dump_json() for r in stored] == [r.model_dump_json() for r in measured]  # as written
    assert figures(summarize(stored, tag="c4", mode="concurrency", concurrency=4, window=window)) == \
        figures(summarize(measured, tag="c4", mode="concurrency", concurrency=4, window=window))
    # One host, one boot: the clocks are one, so nothing is shifted, and the measured offset is within its bound.
    for w in workers:
        assert w.shared_clock and w.applied_offset_ns == 0
        assert abs(w.clock_offset_ns) <= w.clock_error_ns and w.clock_error_ns < 50 * MS
        assert w.host and w.pid and w.pid != os.getpid()


def test_open_loop_sends_keep_the_schedule_across_workers(cal) -> None:
    rate, n, seed, arrival = 60.0, 36, 7, "gamma"  # bursty (burstiness 0.5): the harder case of Poisson's family

    async def go():
        async with WorkerPool(cal.url, ClientOptions(), 2) as pool:
            out = await run_rate(pool, Workload(max_tokens=8), TARGET, Recorder(), rate=rate, arrival=arrival,
                                 burstiness=0.5, seed=seed, requests=n)
            return out, pool.provenance()

    (records, (start, end)), workers = asyncio.run(go())
    planned = schedule_ns(rate=rate, arrival=arrival, burstiness=0.5, seed=seed, count=n)
    assert sorted(r.scheduled_ns - start for r in records) == planned  # exactly the schedule, whoever sent it
    assert end - start == planned[-1]
    assert all(w.requests > 0 for w in workers)
    lags_ms = sorted((r.t_send_ns - r.scheduled_ns) / MS for r in records)
    # Each worker held its requests until their time on its own clock: never early, and on time within what a
    # busy two-core machine allows (the coordinator handed them over 20 ms ahead).
    assert lags_ms[0] >= 0 and lags_ms[len(lags_ms) // 2] < 10 and lags_ms[-1] < 100


def test_a_worker_that_dies_mid_level_is_reported_and_its_records_kept(tmp_path) -> None:
    slow = Script(ttft_ms=20, itl_ms=10, output_tokens=30)  # about 0.3 s a request
    with start_calibration_server(slow) as server:
        recorder = Recorder()
        warnings: list[str] = []

        async def go():
            async with WorkerPool(server.url, ClientOptions(), 2, on_warning=warnings.append) as pool:
                victim = pool.workers[0]

                async def kill_when_it_has_returned_some():
                    while victim.requests - len(victim.pending) < 3:
                        await asyncio.sleep(0.02)
                    os.kill(int(victim.hello["pid"]), signal.SIGKILL)

                killer = asyncio.create_task(kill_when_it_has_returned_some())
                measured, window = await run_concurrency(pool, Workload(max_tokens=30), TARGET, recorder,
                                                         concurrency=4, duration_s=2.0)
                await killer
                return measured, pool.provenance()

        measured, workers = asyncio.run(go())
    dead, alive = workers
    assert dead.status == "died" and "SIGKILL" in (dead.died or "") and alive.status == "ok"
    # No request was lost: every one handed to a worker has a record, the dead one's finished ones included.
    assert len(measured) == len(recorder.records) == dead.requests + alive.requests
    lost = [r for r in measured if r.error_kind == "cancelled"]
    assert lost and all("died with the request in flight" in (r.error_detail or "") for r in lost)
    assert len(lost) <= 4
    # The other worker took the dead one's share: requests went on finishing after the death.
    death = min(r.t_end_ns for r in lost)
    assert sum(1 for r in measured if r.ok and r.t_send_ns > death) >= 4
    assert len(warnings) == 1 and "worker 0" in warnings[0] and "died" in warnings[0] and "kept" in warnings[0]


def test_clock_estimate_takes_the_shortest_round_trip() -> None:
    # A worker 1 s ahead; the exchanges' round trips 900, 100, 400 us: the 100 us one decides, +- 50 us.
    true = 1_000_000_000
    ex = [Exchange(0, true + 600_000, 900_000), Exchange(10_000_000, 10_000_000 + true + 90_000, 10_100_000),
          Exchange(20_000_000, 20_000_000 + true + 10_000, 20_400_000)]
    est = estimate(ex)
    assert est.rtt_ns == 100_000 and est.error_ns == 50_000
    assert abs(est.offset_ns - true) <= est.error_ns
    with pytest.raises(ValueError):
        estimate([])


def test_worker_counts() -> None:
    assert parse_workers("4") == 4 and parse_workers("auto") == "auto" and parse_workers(None) is None
    for bad in ("0", "x", "-2", "5000"):
        with pytest.raises(UserError):
            parse_workers(bad)
    # auto: enough workers that none carries more than the selftest's ceiling, at most one per CPU but one.
    assert auto_workers(1024, 256, cpus=16) == 4
    assert auto_workers(1024, 256, cpus=3) == 2
    assert auto_workers(8, 256, cpus=16) == 1
    assert auto_workers(1024, None, cpus=16) == 15  # no selftest: one per CPU but one
    assert auto_workers(64, 16, cpus=1) == 1


def test_bench_cli_with_workers_records_each_worker_in_the_provenance(cal, tmp_path) -> None:
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "servelab.cli", "bench", cal.url, "--mode", "concurrency",
                           "--concurrency", "4", "--requests", "24", "--max-tokens", "8", "--workers", "2",
                           "--tokenizer", "none", "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert [w["id"] for w in result["workers"]] == [0, 1]
    assert all(w["backend"] == "process" and w["host"] and w["clock_error_ns"] is not None
               for w in result["workers"])
    level = result["levels"][0]
    assert level["ok"] == 24 and level["failed"] == 0
    # The workers' CPU is the client's, not "other" load, in the level's environment.
    assert "python" not in " ".join(p["name"] for p in level["environment"]["top_others"]) or \
        all(p["pid"] not in {w["pid"] for w in result["workers"]} for p in level["environment"]["top_others"])
    from servelab.store.db import Store

    with Store.open(out / "servelab.db") as db:
        (prov,) = db.db.execute("SELECT provenance FROM runs").fetchone()
    assert [w["pid"] for w in json.loads(prov)["workers"]] == [w["pid"] for w in result["workers"]]


def test_workers_refuse_nonsense_before_anything_is_sent() -> None:
    from servelab.bench.options import BenchArgs, build_options

    with pytest.raises(UserError, match="--workers"):
        build_options(BenchArgs(mode="single", workers="0"))
    with pytest.raises(UserError, match="--workers"):
        build_options(BenchArgs(mode="single", ray="auto"))


def test_an_interrupted_level_gets_each_request_in_flight_back_from_its_worker() -> None:
    slow = Script(ttft_ms=5, itl_ms=20, output_tokens=50)  # about 1 s a request

    async def go(url: str):
        recorder = Recorder()
        async with WorkerPool(url, ClientOptions(), 2) as pool:
            level = asyncio.create_task(run_concurrency(pool, Workload(max_tokens=50), TARGET, recorder,
                                                        concurrency=4, duration_s=30))
            while sum(1 for r in recorder.records if r.ok) < 4:  # a round of requests done, the next in flight
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            level.cancel()  # what Ctrl-C does to the level
            with pytest.raises(asyncio.CancelledError):
                await level
            handed = sum(w.requests for w in pool.workers)
        recorder.add_cancelled(pool)  # what the runner does last: records that came back late, if any
        return recorder.records, handed

    with start_calibration_server(slow) as server:
        records, handed = asyncio.run(go(server.url))
    assert len(records) == handed  # every request handed to a worker has its record
    cut = [r for r in records if r.error_kind == "cancelled"]
    assert len(cut) == 4
    # Each is the worker's own record of it: what it had received when it was cancelled, not a stand-in.
    assert all((r.error_detail or "").startswith("cancelled after") and r.events for r in cut)


def test_a_record_that_comes_back_as_its_send_is_cancelled_again_is_kept() -> None:
    """Ctrl-C cancels a level's sends twice (the gather, then stop_in_flight). When the worker's record of a request
    arrived in the same loop turn as the second cancel, the read loop had taken it off `pending` and the send
    dropped it: one request in 25 handed to a worker had no record on a loaded machine."""
    from servelab.bench.client import RequestSpec
    from servelab.records import RequestRecord

    async def go() -> tuple[list[RequestRecord], RequestRecord]:
        pool = WorkerPool("http://127.0.0.1:1", ClientOptions(), 1)  # no process: the worker's side is played here
        pool.workers[0].alive = True
        send = asyncio.create_task(pool.send(RequestSpec(endpoint="/v1/chat/completions", body={}, index=7)))
        await asyncio.sleep(0)  # handed over: waiting for the worker's record
        send.cancel()  # Ctrl-C: the send asks the worker for its record of the request
        await asyncio.sleep(0)
        (rid, (fut, *_)), = pool.workers[0].pending.items()
        back = RequestRecord(index=7, endpoint="/v1/chat/completions", t_send_ns=1, t_end_ns=2,
                             error_kind="cancelled", error_detail="cancelled after 3 events")
        send.cancel()  # the second cancel, and in the same loop turn the record comes back:
        del pool.workers[0].pending[rid]  # what the read loop does with it
        fut.set_result(back)
        with pytest.raises(asyncio.CancelledError):
            await send
        return pool.cancelled, back

    cancelled, back = asyncio.run(go())
    assert cancelled == [back]
