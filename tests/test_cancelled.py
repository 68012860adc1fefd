"""Nothing sent is lost on Ctrl-C: requests in flight when a level is interrupted are recorded with error_kind
"cancelled" and what they had received, passed on like any other record (records.jsonl, the level's records),
and counted apart from failures: outside every latency figure, the error count and the SLO judgements."""

from __future__ import annotations

import asyncio
import csv
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from servelab.bench.client import StreamClient
from servelab.bench.loads import Recorder, Target, run_concurrency, run_rate
from servelab.bench.metrics import summarize
from servelab.bench.slo import level_verdict, parse_slos
from servelab.bench.workloads import Workload
from servelab.calibration import Script, start_calibration_server
from servelab.records import RequestRecord, Summary, TokenEvent
from servelab.report.terminal import sent_cell
from servelab.store.rundir import read_records
from test_load_modes import Scripted

SERVELAB = [sys.executable, "-m", "servelab.cli"]
MS = 1_000_000


@pytest.fixture(scope="module")
def slow():
    """Long streams (a token every 200 ms, 50 tokens: 10 s each), so requests are in flight when interrupted."""
    with start_calibration_server(Script(ttft_ms=5, itl_ms=200, output_tokens=50)) as handle:
        yield handle


def server_progress(url: str, since_ns: int) -> dict[str, Any]:
    """The calibration server's own count of requests received and token events sent since `since_ns`."""
    with urllib.request.urlopen(f"{url}/calibration/summary?since_ns={since_ns}", timeout=5) as r:
        return json.loads(r.read())


def interrupt_bench(url: str, out: Path, *args: str, in_flight: int) -> tuple[subprocess.CompletedProcess, Path]:
    """`servelab bench` in a subprocess, sent SIGINT (Ctrl-C) once `in_flight` requests have each received some
    tokens (judged by the server: nothing comes back to the client before a 10 s request ends)."""
    since = time.perf_counter_ns()  # CLOCK_MONOTONIC: the same clock in the server's process
    proc = subprocess.Popen([*SERVELAB, "bench", url, *args, "--duration", "60", "--warmup", "0",
                             "--out", str(out), "--csv"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            seen = server_progress(url, since)
            if seen["requests"] >= in_flight and seen["tokens"] >= 3 * in_flight:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"the bench never got {in_flight} requests streaming (exit {proc.poll()})")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    (records,) = out.glob("*/records.jsonl.gz")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), records.parent


def check_interrupted_run(proc: subprocess.CompletedProcess, run: Path, tag: str, at_least: int) -> None:
    assert proc.returncode == 130, proc.stderr
    kept = read_records(run / "records.jsonl.gz")
    assert len(kept) >= at_least
    # Each request was in flight (a 10 s stream), so each is recorded cancelled, with the tokens it had received.
    for r in kept:
        assert r.tag == tag and not r.warmup and not r.ok and r.error_kind == "cancelled", r
        assert r.output_tokens >= 1 and r.events and r.chunks >= 1
        assert r.t_end_ns is not None and r.events[-1].t_ns <= r.t_end_ns
        assert r.output_tokens < 50  # partial: cut off long before the end of the stream
    assert sum(r.output_tokens for r in kept) >= 2 * at_least
    (level,) = json.loads((run / "summary.json").read_text())["levels"]
    assert level["tag"] == tag and level["requests"] == len(kept)
    assert level["cancelled"] == len(kept) and level["failed"] == 0 and level["ok"] == 0 and level["errors"] == {}
    assert level["figures"]["e2e_ms"]["dist"] is None and level["figures"]["ttft_ms"]["dist"] is None
    assert any(f"{len(kept)} of {len(kept)} requests were cancelled" in w for w in level["warnings"])
    assert "cancelled" in proc.stdout  # the terminal table and warnings say so
    # The CSV written on the way out has them too.
    with open(run / "levels.csv", newline="", encoding="utf-8") as fh:
        (row,) = list(csv.DictReader(fh))
    assert row["cancelled"] == str(len(kept)) and row["failed"] == "0"
    with open(run / "records.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(kept) and {row["error_kind"] for row in rows} == {"cancelled"}


def test_ctrl_c_during_a_closed_loop_level_records_the_requests_in_flight_as_cancelled(slow, tmp_path: Path
                                                                                       ) -> None:
    proc, run = interrupt_bench(slow.url, tmp_path, "--mode", "concurrency", "--concurrency", "3", in_flight=3)
    check_interrupted_run(proc, run, "c3", at_least=3)
    assert len(read_records(run / "records.jsonl.gz")) == 3  # closed loop: exactly the three streams in flight


def test_ctrl_c_during_an_open_loop_level_records_the_requests_in_flight_as_cancelled(slow, tmp_path: Path
                                                                                      ) -> None:
    # 10 req/s of 10 s streams: every request sent is still running at the interrupt, and the sender is asleep
    # between two sends, so the level itself has to cancel its request tasks and wait for them.
    proc, run = interrupt_bench(slow.url, tmp_path, "--mode", "rate", "--rate", "10", "--arrival", "constant",
                                in_flight=4)
    check_interrupted_run(proc, run, "r10", at_least=4)


def cancel_level(url: str, level, after_s: float) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """Run a load level through the real client and cancel its task after `after_s` (what Ctrl-C does to it).
    Returns (what the recorder's on_record saw, what stayed on the client's cancelled list)."""
    seen: list[RequestRecord] = []

    async def go():
        async with StreamClient(url) as client:
            task = asyncio.create_task(level(client, Recorder(on_record=seen.append)))
            await asyncio.sleep(after_s)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return list(client.cancelled)
    left = asyncio.run(go())
    return seen, left


def test_a_cancelled_level_hands_its_in_flight_requests_on_with_the_finished_ones(slow) -> None:
    # Request 0 is short (4 tokens, done in ~30 ms); the others are 10 s streams.
    mixed = Scripted(lambda i: {"itl_ms": 5, "output_tokens": 4} if i == 0 else None, base=Workload(max_tokens=50))
    target = Target(model="calibration")

    seen, left = cancel_level(slow.url, lambda client, rec: run_concurrency(
        client, mixed, target, rec, concurrency=3, duration_s=60), after_s=1.0)
    assert left == []  # taken off the client's list: a second collection records nothing twice
    done = [r for r in seen if r.ok]
    cancelled = [r for r in seen if r.error_kind == "cancelled"]
    assert len(done) == 1 and done[0].index == 0 and done[0].output_tokens == 4
    # The worker that finished request 0 sent request 3 at once: three streams were in flight at the cancel.
    assert sorted(r.index for r in cancelled) == [1, 2, 3] and len(seen) == 4
    assert all(1 <= r.output_tokens < 50 and not r.ok for r in cancelled)

    seen, left = cancel_level(slow.url, lambda client, rec: run_rate(
        client, mixed, target, rec, rate=4, arrival="constant", duration_s=60), after_s=0.9)
    assert left == []
    assert [r.index for r in seen if r.ok] == [0]
    cancelled = sorted((r for r in seen if not r.ok), key=lambda r: r.index)
    assert [r.index for r in cancelled] == [1, 2, 3]  # sent at 250, 500, 750 ms; the 4th was due at 1 s
    assert all(r.error_kind == "cancelled" and r.scheduled_ns is not None for r in cancelled)
    assert cancelled[0].output_tokens >= 2  # ~650 ms of a token every 200 ms


def record(index: int, *, ok: bool = True, error_kind=None, gaps_ms=(10, 10), ttft_ms: float = 100,
           end_ms: float | None = None, warmup: bool = False) -> RequestRecord:
    """A synthetic record sent at 0: first token at ttft_ms, then one token after each gap."""
    t = ttft_ms * MS
    events = [TokenEvent(t_ns=int(t), kind="answer", tokens=1)]
    for g in gaps_ms:
        t += g * MS
        events.append(TokenEvent(t_ns=int(t), kind="answer", tokens=1))
    return RequestRecord(index=index, tag="c2", endpoint="/v1/chat/completions", t_send_ns=0,
                         t_end_ns=int((end_ms if end_ms is not None else t / MS + 1) * MS), events=events,
                         ok=ok, error_kind=error_kind, warmup=warmup, count_method="server_per_chunk",
                         scheduled_ns=0)


def test_summarize_keeps_cancelled_requests_out_of_latency_figures_and_the_error_rate() -> None:
    records = [
        record(0), record(1), record(2, ttft_ms=120),
        record(3, ok=False, error_kind="timeout_idle", gaps_ms=()),
        # In flight at the interrupt: a huge TTFT and a stall so far, which must not reach any figure.
        record(4, ok=False, error_kind="cancelled", ttft_ms=5000, gaps_ms=(900,), end_ms=6000),
        record(5, ok=False, error_kind="cancelled", ttft_ms=7000, gaps_ms=(), end_ms=7500),
        record(6, warmup=True, ok=False, error_kind="cancelled"),  # warm-up: outside everything
    ]
    slos = parse_slos("ttft_p99_ms=500,itl_p99_ms=50")
    s = summarize(records, tag="c2", mode="concurrency", concurrency=2, window=(0, 10_000 * MS), slos=slos)
    assert (s.requests, s.ok, s.failed, s.cancelled) == (6, 3, 1, 2)
    assert s.errors == {"timeout_idle": 1}  # cancelled is not an error kind of the level
    f = s.figures
    assert f["ttft_ms"].dist.n == 3 and f["ttft_ms"].dist.max == pytest.approx(120)
    assert f["itl_ms"].dist.n == 6 and f["itl_ms"].dist.max == pytest.approx(10)
    assert f["e2e_ms"].dist.n == 3 and f["e2e_ms"].dist.max < 200
    assert f["output_tokens"].dist.n == 3 and f["decode_tok_s"].dist.n == 3
    assert f["output_tok_s"].value == pytest.approx(9 / 10)  # the ok requests' 9 tokens over 10 s
    assert f["request_s"].value == pytest.approx(3 / 10)
    assert f["client_lag_ms"].dist.n == 6  # sends: complete for every request that went out
    assert any("1 of 4 requests failed" in w for w in s.warnings)
    assert any("2 of 6 requests were cancelled" in w for w in s.warnings)
    # SLOs: the failure counts (infinitely slow), the cancelled requests do not.
    assert f["slo_attainment"].value == pytest.approx(3 / 4)
    verdict = level_verdict(records, slos)
    assert verdict["targets"]["itl_p99_ms"]["observed_ms"] is None  # the failure's infinite sample
    assert level_verdict([r for r in records if r.error_kind != "timeout_idle"], slos)["passed"] is True
    assert sent_cell(s) == "3/6 (1 failed, 2 cancelled)"


def test_a_summary_written_before_the_cancelled_field_still_loads() -> None:
    old = {"tag": "c1", "mode": "concurrency", "concurrency": 1, "requests": 4, "ok": 3, "failed": 1,
           "errors": {"http": 1}, "window_s": 5.0}
    s = Summary.model_validate(old)
    assert s.cancelled == 0 and sent_cell(s) == "3/4 (1 failed)"
