"""Faults the bench client and its load modes survive (issue 11: items 1, 3, 4, 6, 7, 10, 14, 15, 19, 23, 24, 25).

Each test reproduces one defect against a local fault server (the calibration server with a scripted fault, or a
small aiohttp/asyncio fake written here in a real engine's format) and checks what it became: one bad response
costs one request (recorded, with an error kind that says what arrived), never the run; the load backs off, waits,
or stops instead of hammering; absurd options are one-line usage errors. Timings are asserted only as loose
bounds."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from servelab.host import environment as environment_module
from servelab.bench.client import ClientOptions, Deadlines, RequestSpec, StreamClient, parse_retry_after
from servelab.bench.failures import error_gate
from servelab.bench.loads import Recorder, Target, run_concurrency
from servelab.bench.loads.control import LevelControl
from servelab.bench.metrics import summarize
from servelab.bench.options import BenchArgs, build_options
from servelab.bench.runner import bench
from servelab.protocol.sse import SSEDecodeError, SSEParser
from servelab.bench.steady import SteadyRule
from servelab.bench.workloads import Workload
from servelab.calibration import Script, start_calibration_server
from servelab.errors import UserError
from servelab.store.rundir import read_records
from openai_fake import serving
from test_load_modes import Scripted

SERVELAB = [sys.executable, "-m", "servelab.cli"]
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def cal():
    """A well-behaved calibration server; each test scripts its fault per request."""
    with start_calibration_server(Script(ttft_ms=5, itl_ms=5, output_tokens=8)) as handle:
        yield handle


@pytest.fixture(autouse=True)
def no_selftest(tmp_path, monkeypatch):
    """No selftest result from the developer's cache: what bench says must not depend on one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path.parent / f"{tmp_path.name}-cache"))


def received(url: str, since_ns: int) -> int:
    """Requests the calibration server received since `since_ns` (its own count)."""
    with urllib.request.urlopen(f"{url}/calibration/summary?since_ns={since_ns}", timeout=5) as r:
        return json.loads(r.read())["requests"]


def send(url: str, script: dict[str, Any] | None = None, *, extras: dict | None = None, max_tokens: int = 64,
         deadlines: Deadlines | None = None):
    """One request through the real client."""
    body: dict[str, Any] = {"model": "calibration", "max_tokens": max_tokens, "messages": [{"role": "user",
                                                                                         "content": "hi"}]}
    if script is not None:
        body["calibration"] = script

    async def go():
        opts = ClientOptions(stream_extras=extras or {}, deadlines=deadlines or Deadlines())
        async with StreamClient(url, opts) as client:
            return await client.send(RequestSpec(endpoint=CHAT, body=body))
    return asyncio.run(go())


def run_dirs(out: Path) -> list[Path]:
    """The run directories `bench --out` made (beside them, the run store)."""
    return [p for p in out.iterdir() if p.is_dir()] if out.exists() else []


def options(**kw):
    return build_options(BenchArgs(**{"warmup": 0, "model": "calibration", "tokenizer": "none", **kw}))


# ---------------------------------------------------------------------------------------------------------------
# 1. One malformed chunk among good ones costs its request, never the run
# ---------------------------------------------------------------------------------------------------------------

MALFORMED = ['data: {"choices":[1]}\n\n', 'data: "abc"\n\n', 'data: {"choices":"abc"}\n\n',
             'data: {"choices":[{"delta":{"content":"x"},"finish_reason":7}]}\n\n']


@pytest.mark.parametrize("frame", MALFORMED, ids=["choices-int", "string", "choices-str", "finish-int"])
def test_a_malformed_chunk_is_a_parse_failure_of_its_request(cal, frame: str) -> None:
    record = send(cal.url, {"raw_frame": frame, "raw_frame_after_events": 3})
    assert not record.ok and record.error_kind == "parse", (record.error_kind, record.error_detail)
    assert "not an OpenAI streaming chunk" in record.error_detail
    assert record.output_tokens == 3  # the three tokens before it are kept


def test_an_object_that_is_no_chunk_at_all_is_ignored(cal) -> None:
    record = send(cal.url, {"raw_frame": 'data: {"a":1}\n\n', "raw_frame_after_events": 3})
    assert record.ok and record.output_tokens == 8


def test_whatever_breaks_inside_the_handler_costs_one_request(cal, monkeypatch) -> None:
    # A shape no check foresaw (here: the chunk reader itself raising) fails the request as `parse`.
    from servelab.protocol.dialects import dialect_for

    def broken(obj):
        raise AttributeError("'int' object has no attribute 'get'")
    monkeypatch.setattr(dialect_for("/v1/chat/completions"), "read", broken)
    record = send(cal.url)
    assert not record.ok and record.error_kind == "parse"
    assert "AttributeError" in record.error_detail


def test_a_run_with_malformed_chunks_keeps_every_request_and_its_summary(cal) -> None:
    # Issue 11 item 1: `--mode concurrency --concurrency 16 --requests 64`, one bad chunk in every 4th stream:
    # the run died with AttributeError (rc 3), 33 sent, 17 recorded, no summary.
    bad = Scripted(lambda i: {"raw_frame": 'data: {"choices":[1]}\n\n'} if i % 4 == 0 else None,
                   base=Workload(max_tokens=8))
    opts = options(mode="concurrency", concurrency=16, requests=64)
    opts.workload = bad
    seen = []
    since = time.perf_counter_ns()
    result = bench(cal.url, opts, on_record=seen.append)
    (level,) = result.levels
    assert len(seen) == 64 == received(cal.url, since)  # every request sent is recorded
    assert (level.ok, level.failed, level.errors) == (48, 16, {"parse": 16})
    assert "not an OpenAI streaming chunk" in level.top_errors[0].detail


def test_the_cli_survives_a_server_whose_every_stream_has_a_malformed_chunk(tmp_path: Path) -> None:
    with start_calibration_server(Script(ttft_ms=2, itl_ms=2, output_tokens=4,
                                         raw_frame='data: {"choices":[1]}\n\n')) as bad:
        since = time.perf_counter_ns()
        proc = subprocess.run([*SERVELAB, "bench", bad.url, "--mode", "concurrency", "--concurrency", "16",
                               "--requests", "64", "--warmup", "0", "--out", str(tmp_path)],
                              capture_output=True, text=True, timeout=120)
        sent = received(bad.url, since)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the error gate, not an internal error (3)
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    (run,) = run_dirs(tmp_path)
    records = read_records(run / "records.jsonl.gz")
    assert len(records) == sent >= 20  # the first 20 failures end the level early; nothing sent is lost
    assert {r.error_kind for r in records} == {"parse"}
    assert json.loads((run / "summary.json").read_text())["levels"][0]["failed"] == len(records)


# ---------------------------------------------------------------------------------------------------------------
# 3. A compressed body is inflated within bounds
# ---------------------------------------------------------------------------------------------------------------

def gzip_of_zeros(megabytes: int) -> bytes:
    enc = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    return b"".join(enc.compress(block) for _ in range(megabytes)) + enc.flush()


async def serve_raw(response: bytes, deadlines: Deadlines | None = None):
    """Answer one request with `response` (exact bytes); return the client's record."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        try:
            writer.write(response)
            await writer.drain()
            writer.close()
        except ConnectionError:
            pass  # the client stopped reading: that is the point

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        opts = ClientOptions(deadlines=deadlines or Deadlines(idle_s=10, first_byte_s=10, total_s=30))
        async with StreamClient(f"http://127.0.0.1:{port}", opts) as client:
            return await client.send(RequestSpec(endpoint=CHAT, body={"model": "m", "messages": []}))


def bounded(coro) -> tuple[Any, int]:
    """Run `coro`; return its result and the peak of Python memory allocated meanwhile."""
    tracemalloc.start()
    try:
        result = asyncio.run(coro)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("status", [200, 500])
def test_a_gzip_bomb_is_a_bounded_failure_not_gigabytes(status: int) -> None:
    bomb = gzip_of_zeros(64)  # 64 MiB of zeros in ~64 KB: it inflated whole, in one call
    ctype = b"text/event-stream" if status == 200 else b"application/json"
    response = (b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
                % (status, ctype, len(bomb))) + bomb
    record, peak = bounded(serve_raw(response))
    assert not record.ok
    if status == 200:
        assert record.error_kind == "parse" and "decompression bomb" in record.error_detail
    else:
        assert record.error_kind == "http" and record.http_status == 500  # read up to the 64 KB error cap
    # Bounded by the 16 MiB event bound (twice, while a growing event is copied), not by the 64 MiB it holds.
    assert peak < 48 << 20, f"peak {peak >> 20} MiB"


def test_an_endless_event_is_refused_past_its_bound() -> None:
    body = b"data: " + b"x" * (17 << 20)  # no blank line, ever: one event growing without end
    response = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    record = asyncio.run(serve_raw(response))
    assert record.error_kind == "parse" and "grew past 16 MiB" in record.error_detail


# ---------------------------------------------------------------------------------------------------------------
# 4. A server's token count is not trusted to size anything
# ---------------------------------------------------------------------------------------------------------------

def test_a_running_count_of_10_to_the_18_fails_its_request_and_the_figures_survive(cal) -> None:
    script = {"usage_style": "llamacpp_timings", "bogus_running_count": 10**18}
    bad = send(cal.url, script, extras={"timings_per_token": True}, max_tokens=16)
    assert bad.error_kind == "parse" and "not a plausible token count" in bad.error_detail
    good = send(cal.url, {"usage_style": "llamacpp_timings"}, extras={"timings_per_token": True})
    assert good.ok and good.count_method == "server_per_chunk"
    # summarize sized a list by the server's number: MemoryError. Now it is a figure over the good request.
    summary = summarize([bad, good], tag="c1", mode="concurrency", concurrency=1,
                        window=(good.t_send_ns, good.t_end_ns))
    assert summary.failed == 1 and summary.ok == 1 and summary.figures["itl_ms"].dist.n == 7


def test_an_implausible_usage_count_fails_its_request(cal) -> None:
    frame = 'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1000000000000000000}}\n\n'
    record = send(cal.url, {"raw_frame": frame, "raw_frame_after_events": 99, "output_tokens": 4})
    assert record.error_kind == "parse" and "usage.completion_tokens" in record.error_detail


# ---------------------------------------------------------------------------------------------------------------
# 6. A huge concurrency with a small budget allocates nothing for the streams it will not open
# ---------------------------------------------------------------------------------------------------------------

def test_a_billion_streams_for_four_requests_start_four_workers(cal) -> None:
    t0 = time.monotonic()
    seen = []
    result = bench(cal.url, options(mode="concurrency", concurrency=1_000_000_000, requests=4),
                   on_record=seen.append)
    assert len(seen) == 4 and result.levels[0].ok == 4
    assert time.monotonic() - t0 < 30  # it grew memory at ~100 MB/s before sending anything


def test_the_closed_loop_starts_no_more_workers_than_its_budget(cal) -> None:
    started = []

    async def go():
        async with StreamClient(cal.url) as client:
            original = asyncio.create_task

            def counting(coro, **kw):
                started.append(coro)
                return original(coro, **kw)
            asyncio.create_task = counting
            try:
                return await run_concurrency(client, Workload(max_tokens=4), Target(model="calibration"),
                                             Recorder(), concurrency=10**9, duration_s=None, max_requests=3)
            finally:
                asyncio.create_task = original
    records, _ = asyncio.run(go())
    assert len(records) == 3 and len(started) <= 4  # three workers and the watcher


# ---------------------------------------------------------------------------------------------------------------
# 7. No in-flight request is lost at an interrupt
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def slow():
    with start_calibration_server(Script(ttft_ms=5, itl_ms=200, output_tokens=50)) as handle:
        yield handle


def wait_received(url: str, since_ns: int, n: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while received(url, since_ns) < n:
        assert time.monotonic() < deadline, "the server never got the request"
        time.sleep(0.02)


def test_a_send_whose_coroutine_is_closed_is_still_recorded_as_cancelled(slow) -> None:
    # A pending task that is garbage-collected has its coroutine closed (GeneratorExit), not cancelled: the
    # record was lost. Closing the coroutine by hand does what the collector does.
    since = time.perf_counter_ns()

    async def go():
        async with StreamClient(slow.url) as client:
            task = asyncio.create_task(client.send(RequestSpec(endpoint=CHAT, body={"model": "m", "messages": []})))
            await asyncio.to_thread(wait_received, slow.url, since, 1)
            await asyncio.sleep(0.3)
            task.get_coro().close()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return client, list(client.cancelled)
    client, cancelled = asyncio.run(go())
    (record,) = cancelled
    assert record.error_kind == "cancelled" and "interrupted" in record.error_detail
    assert record.t_end_ns is not None and not client.in_flight


def test_the_client_holds_its_in_flight_tasks_and_records_them_when_the_loop_ends(slow) -> None:
    since = time.perf_counter_ns()

    async def go():
        client = StreamClient(slow.url)
        await client.__aenter__()
        asyncio.create_task(client.send(RequestSpec(endpoint=CHAT, body={"model": "m", "messages": []})))
        await asyncio.to_thread(wait_received, slow.url, since, 1)
        gc.collect()  # nothing but the client refers to the task
        assert len(client.in_flight) == 1
        (task, _, _), = client.in_flight.values()
        assert task is not None and not task.done()
        return client
    try:
        client = asyncio.run(go())  # the runner cancels what is left, as after Ctrl-C
    finally:
        gc.unfreeze()  # the client froze the collector's generations and was never closed
    assert [r.error_kind for r in client.cancelled] == ["cancelled"] and not client.in_flight


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_ctrl_c_at_random_moments_loses_no_request(cal, loop: str, monkeypatch) -> None:
    # Lost one in-flight record in about 1 of 12 interrupts on uvloop. Interrupt a closed-loop level of short
    # streams at random moments; what the server received is what was recorded, every time.
    monkeypatch.setenv("SERVELAB_EVENT_LOOP", loop)
    rng = random.Random(11)
    for _ in range(5):
        since = time.perf_counter_ns()
        seen = []
        timer = threading.Timer(rng.uniform(0.3, 1.0), os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            result = bench(cal.url, options(mode="concurrency", concurrency=6, duration=30), on_record=seen.append)
        finally:
            timer.cancel()
        assert result.interrupted
        time.sleep(0.2)  # let the server finish counting what was sent in the last moment
        got = received(cal.url, since)
        assert got <= len(seen), (got, len(seen))  # nothing the server saw is missing from the records


# ---------------------------------------------------------------------------------------------------------------
# 10. The closed loop waits, stops, and knows its own limits
# ---------------------------------------------------------------------------------------------------------------

def test_retry_after_is_parsed_in_both_forms() -> None:
    assert parse_retry_after("5") == 5.0 and parse_retry_after("0") == 0.0
    assert parse_retry_after("100000") == 600.0  # bounded
    when = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 <= parse_retry_after(when) <= 31
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_a_429_with_retry_after_is_honoured() -> None:
    # 9,818 requests in 5 s against `429, Retry-After: 5`. A worker now waits the Retry-After, so a 3 s level sends
    # one per worker; the wait ends with the level. Retry-After is 30 s here, ten times the level, so a wait that
    # ran past the level's end (the regression) would take over 30 s; the level itself takes about 3.5 s.
    with start_calibration_server(Script(http_status=429, retry_after="30")) as limited:
        since = time.perf_counter_ns()
        t0 = time.monotonic()
        seen = []
        result = bench(limited.url, options(mode="concurrency", concurrency=2, duration=3), on_record=seen.append)
        took = time.monotonic() - t0
        sent = received(limited.url, since)
    (level,) = result.levels
    assert sent == len(seen) == 2, sent  # one per worker, then each waited past the level's end
    assert all(r.http_status == 429 and r.retry_after_s == 30.0 for r in seen)
    assert "Retry-After: 30 s" in level.top_errors[0].detail
    assert took < 15, took  # the wait ends with the level (~3.5 s), not 30 s after its first 429


def test_a_level_stops_when_the_server_is_gone() -> None:
    # 25,499 connect failures in 7 s after the engine died. Now 20 refusals in a row end the level, and the run.
    server = start_calibration_server(Script(ttft_ms=2, itl_ms=20, output_tokens=10))
    seen = []
    stopping: list[threading.Thread] = []

    def on_record(record) -> None:  # the server dies once a few requests succeeded
        seen.append(record)
        if sum(r.ok for r in seen) >= 3 and not stopping:
            stopping.append(threading.Thread(target=server.stop))
            stopping[0].start()
    t0 = time.monotonic()
    result = bench(server.url, options(mode="concurrency", concurrency=4, duration=30), on_record=on_record)
    stopping[0].join(10)
    assert time.monotonic() - t0 < 25
    (level,) = result.levels
    connect = [r for r in seen if r.error_kind == "connect"]
    assert 20 <= len(connect) < 60 and level.ok >= 1
    assert level.steady.ended_by == "gone" and not level.steady.measured
    assert "could not connect" in level.steady.reason
    assert result.stop_reason.startswith("stopped: c4:")
    (reason,) = error_gate(result.levels)
    assert "stopped accepting connections" in reason


def test_a_concurrency_above_the_descriptor_limit_is_refused_before_anything_is_sent(cal) -> None:
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    since = time.perf_counter_ns()
    proc = subprocess.run([*SERVELAB, "bench", cal.url, "--mode", "concurrency", "--concurrency", "3000",
                           "--duration", "2", "--model", "calibration"], capture_output=True, text=True,
                          timeout=60, preexec_fn=low_limit)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert "--concurrency 3,000 needs 3,000 sockets" in err and "ulimit -n" in err and "Traceback" not in err
    assert received(cal.url, since) == 0


def test_a_soft_descriptor_limit_is_raised_to_what_the_level_needs(cal) -> None:
    def low_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 512:
        pytest.skip("the hard descriptor limit here is too low to raise a soft one past it")
    proc = subprocess.run([*SERVELAB, "bench", cal.url, "--mode", "concurrency", "--concurrency", "200",
                           "--requests", "200", "--warmup", "0", "--model", "calibration", "--json"],
                          capture_output=True, text=True, timeout=120, preexec_fn=low_soft_limit)
    assert proc.returncode == 0, proc.stderr
    level = json.loads(proc.stdout)["levels"][0]
    assert level["ok"] == 200 and level["errors"] == {}


def test_running_out_of_descriptors_is_its_own_error_and_ends_the_level(slow, tmp_path: Path) -> None:
    # 68,378 "Too many open files" at c=3000 under `ulimit -n 1024`, classified as `connect`, rc 0. An open loop
    # is not bounded in advance: 100 req/s of 10 s streams under a limit of 64 descriptors runs out.
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    proc = subprocess.run([*SERVELAB, "bench", slow.url, "--mode", "rate", "--rate", "100", "--arrival",
                           "constant", "--duration", "3", "--warmup", "0", "--model", "calibration",
                           "--tokenizer", "none", "--out", str(tmp_path), "--timeout-total", "5"],
                          capture_output=True, text=True, timeout=120, preexec_fn=low_limit)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert "could not open a socket" in err and "ulimit -n" in err
    (run,) = run_dirs(tmp_path)
    records = read_records(run / "records.jsonl.gz")
    kinds = {r.error_kind for r in records}
    assert "fd_limit" in kinds and "connect" not in kinds
    fd = [r for r in records if r.error_kind == "fd_limit"]
    assert len(fd) < 10  # the level ended at the first ones instead of failing thousands
    level = json.loads((run / "summary.json").read_text())["levels"][0]
    assert level["steady"]["ended_by"] == "fd_limit"


def test_the_level_control_counts_connect_failures_in_a_row() -> None:
    from servelab.records import RequestRecord

    def rec(kind: str | None) -> RequestRecord:
        return RequestRecord(index=0, endpoint=CHAT, t_send_ns=0, t_end_ns=1, ok=kind is None, error_kind=kind)
    control = LevelControl(SteadyRule(give_up_after=3), duration_s=60)
    control.begin(time.perf_counter_ns())
    for kind in (None, "connect", "connect", "http", "connect", "connect"):
        control.finished(rec(kind))
    assert not control.ended  # an answer in between resets the count
    control.finished(rec("connect"))
    assert control.ended_by == "gone"


# ---------------------------------------------------------------------------------------------------------------
# 14. Deadlines: settable, and keep-alive comments do not hold a request open
# ---------------------------------------------------------------------------------------------------------------

def pinging_app() -> web.Application:
    """A llama.cpp-style stream that sends two tokens, then only `: ping` comments, every 100 ms, forever."""
    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("Hel", "lo"):
            chunk = {"choices": [{"finish_reason": None, "index": 0, "delta": {"content": word}}],
                     "object": "chat.completion.chunk"}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        for _ in range(600):
            await asyncio.sleep(0.1)
            await resp.write(b": ping\n\n")
        return resp

    async def models(request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": "pinger", "object": "model"}]})
    app = web.Application()
    app.router.add_post(CHAT, chat)
    app.router.add_get("/v1/models", models)
    return app


def test_ping_comments_do_not_reset_the_idle_deadline() -> None:
    with serving(pinging_app()) as url:
        t0 = time.monotonic()
        record = send(url, deadlines=Deadlines(idle_s=1.0, total_s=20))
    assert record.error_kind == "timeout_idle", record.error_detail  # before: only the total ended it
    assert time.monotonic() - t0 < 10 and record.output_tokens == 2


def test_deadlines_come_from_the_command_line() -> None:
    d = build_options(BenchArgs(timeout_connect=2, timeout_first_byte=3, timeout_idle=4, timeout_total=5)).deadlines
    assert (d.connect_s, d.first_byte_s, d.idle_s, d.total_s) == (2, 3, 4, 5)
    assert build_options(BenchArgs(timeout_idle=7)).deadlines == Deadlines(idle_s=7)
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e300):
        with pytest.raises(UserError, match="--timeout-idle"):
            build_options(BenchArgs(timeout_idle=bad))


def test_the_cli_idle_deadline_ends_a_pinging_stream(tmp_path: Path) -> None:
    with serving(pinging_app()) as url:
        proc = subprocess.run([*SERVELAB, "bench", url, "--requests", "1", "--warmup", "0", "--timeout-idle",
                               "1", "--timeout-total", "30", "--tokenizer", "none", "--out", str(tmp_path)],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # its one request failed
    (run,) = run_dirs(tmp_path)
    (record,) = read_records(run / "records.jsonl.gz")
    assert record.error_kind == "timeout_idle" and "idle deadline passed after" in record.error_detail


# ---------------------------------------------------------------------------------------------------------------
# 15. The API key goes with every request: models, engine detection, /tokenize, /metrics, the streams
# ---------------------------------------------------------------------------------------------------------------

KEY = "sk-servelab-test-0123456789"


def guarded_llamacpp() -> tuple[web.Application, list[tuple[str, bool]]]:
    """llama.cpp's server started with --api-key: every route answers 401 without `Authorization: Bearer KEY`.
    Returns the app and the (path, authorised) of every request it got."""
    seen: list[tuple[str, bool]] = []

    @web.middleware
    async def guard(request: web.Request, handler):
        ok = request.headers.get("Authorization") == f"Bearer {KEY}"
        seen.append((request.path, ok))
        if not ok:
            return web.json_response({"error": {"code": 401, "message": "Invalid API Key",
                                                "type": "authentication_error"}}, status=401)
        return await handler(request)

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "smollm2", "object": "model",
                                                              "owned_by": "llamacpp"}]})

    async def props(request):
        return web.json_response({"default_generation_settings": {"n_ctx": 2048}, "total_slots": 4,
                                  "build_info": "b0-unknown"})

    async def tokenize(request):
        body = await request.json()
        words = body.get("content", "").split(" ")
        tokens = [{"id": i, "piece": (" " if i else "") + w} for i, w in enumerate(words)]
        return web.json_response({"tokens": tokens})

    async def metrics(request):
        return web.Response(text="# TYPE llamacpp:tokens_predicted_total counter\n"
                                 "llamacpp:tokens_predicted_total 0\n", content_type="text/plain")

    async def chat(request):
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = int(body.get("max_tokens") or 4)
        for i in range(n):
            chunk = {"choices": [{"finish_reason": None, "index": 0, "delta": {"content": f" w{i}"}}],
                     "object": "chat.completion.chunk", "timings": {"predicted_n": i + 1}}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        end = {"choices": [{"finish_reason": "length", "index": 0, "delta": {}}], "object": "chat.completion.chunk"}
        usage = {"choices": [], "usage": {"completion_tokens": n, "prompt_tokens": 5, "total_tokens": n + 5},
                 "timings": {"predicted_n": n}}
        await resp.write(b"data: " + json.dumps(end).encode() + b"\n\ndata: " + json.dumps(usage).encode()
                         + b"\n\ndata: [DONE]\n\n")
        return resp

    app = web.Application(middlewares=[guard])
    app.router.add_get("/v1/models", models)
    app.router.add_get("/props", props)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/metrics", metrics)
    app.router.add_post(CHAT, chat)
    return app, seen


def test_the_api_key_reaches_every_endpoint_bench_asks() -> None:
    app, seen = guarded_llamacpp()
    with serving(app) as url:
        # No --model: the model comes from /v1/models, which answered 401 before.
        result = bench(url, build_options(BenchArgs(mode="single", requests=2, warmup=0, max_tokens=4,
                                                    api_key=KEY)))
    assert result.model == "smollm2" and result.levels[0].ok == 2
    assert result.workload["engine_detected"] == "llamacpp"  # /props, asked with the key
    assert result.workload["tokenizer"] == "server:llama.cpp /tokenize"
    paths = {p for p, _ in seen}
    assert {"/v1/models", "/props", "/tokenize", CHAT} <= paths
    assert [p for p, ok in seen if not ok] == []  # nothing went out without the key


def test_the_api_key_reaches_tokenize_after_the_run_and_metrics() -> None:
    from servelab.bench.server_metrics import MetricsWatcher
    from servelab.bench.tokenizer import tokenizer_from_option

    app, seen = guarded_llamacpp()
    with serving(app) as url:
        async def go():
            ends = await tokenizer_from_option("server", url, api_key=KEY).token_ends(["a b c"])
            async with MetricsWatcher(url, {"generated_tokens": "llamacpp:tokens_predicted_total"},
                                      headers={"Authorization": f"Bearer {KEY}"}) as watcher:
                await watcher.start_level()
                evidence = await watcher.end_level([])
            return ends, evidence
        ends, evidence = asyncio.run(go())
    assert ends == [[1, 3, 5]] and evidence is not None
    assert ("/metrics", True) in seen and [p for p, ok in seen if not ok] == []


def test_the_api_key_is_not_in_the_tokenizers_repr() -> None:
    from servelab.bench.tokenizer import LlamaCppServerTokenizer

    assert KEY not in repr(LlamaCppServerTokenizer("http://x", api_key=KEY))


# ---------------------------------------------------------------------------------------------------------------
# 19. Absurd numbers are usage errors
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,says", [
    ({"duration": float("inf")}, "--duration inf is out of range"),
    ({"duration": 1e300}, "--duration 1e+300 is out of range"),
    ({"max_tokens": 2**64}, "--max-tokens 18,446,744,073,709,551,616 is out of range"),
    ({"mode": "rate", "rate": "1", "burstiness": float("inf")}, "--burstiness inf is out of range"),
    ({"mode": "rate", "rate": "inf"}, "rates must be finite"),
    ({"max_level_duration": float("inf")}, "--max-level-duration inf"),
    ({"mode": "rate", "rate": "1e-9", "requests": 2}, "over about 31.7 years"),
    ({"mode": "rate", "rate": "100000", "duration": 100.0}, "schedules about 40,000,000 requests"),
    ({"requests": 10**12}, "--requests 1,000,000,000,000 is out of range"),
    ({"seed": 2**64}, "--seed"),
])
def test_absurd_numbers_are_one_line_usage_errors(kw: dict, says: str) -> None:
    with pytest.raises(UserError, match=None) as err:
        build_options(BenchArgs(**kw))
    assert says in str(err.value)


def test_absurd_numbers_exit_2_on_the_command_line(cal) -> None:
    for args in (["--duration", "inf"], ["--max-tokens", str(2**64)], ["--mode", "rate", "--rate", "1e-9",
                                                                      "--requests", "2"]):
        proc = subprocess.run([*SERVELAB, "bench", cal.url, *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) <= 3, proc.stderr  # one message (rich may wrap it)


# ---------------------------------------------------------------------------------------------------------------
# 23. An invalid-UTF-8 event does not take the events before it with it
# ---------------------------------------------------------------------------------------------------------------

def test_the_parser_hands_over_the_events_before_an_invalid_one() -> None:
    p = SSEParser()
    with pytest.raises(SSEDecodeError) as err:
        p.feed(b"data: one\n\ndata: two\n\ndata: \xff\n\n")  # the fast path
    assert [e.data for e in err.value.events] == ["one", "two"]
    p = SSEParser()
    with pytest.raises(SSEDecodeError) as err:
        p.feed(b": comment\ndata: one\n\nevent: x\ndata: \xff\n\n")  # the general path
    assert [e.data for e in err.value.events] == ["one"]


def test_an_invalid_utf8_event_keeps_the_tokens_that_arrived_with_it(cal) -> None:
    # Token event 2 and the bad event arrive in one write: tokens 0-2 are kept, not just 0-1.
    record = send(cal.url, {"invalid_utf8_after_events": 2})
    assert record.error_kind == "parse" and "not valid UTF-8" in record.error_detail
    assert record.output_tokens == 3 and record.text == " a0 a1 a2"


# ---------------------------------------------------------------------------------------------------------------
# 24. A redirect says where to; an `event: error` is a failure
# ---------------------------------------------------------------------------------------------------------------

def test_a_redirect_names_its_location(cal) -> None:
    record = send(cal.url, {"redirect_to": "https://gateway.example/v1/chat/completions"})
    assert record.error_kind == "http" and record.http_status == 302
    assert "redirect to 'https://gateway.example/v1/chat/completions'" in record.error_detail
    assert "no content type" not in record.error_detail


@pytest.mark.parametrize("data,says", [
    ('{"message": "model overloaded", "type": "server_error"}', "model overloaded"),
    ('{"error": {"message": "CUDA out of memory"}}', "CUDA out of memory"),
    ("upstream reset", "upstream reset"),
])
def test_an_sse_error_event_is_an_in_band_failure(cal, data: str, says: str) -> None:
    record = send(cal.url, {"raw_frame": f"event: error\ndata: {data}\n\n", "raw_frame_after_events": 2})
    assert not record.ok and record.error_kind == "in_band", record.error_detail
    assert "event: error" in record.error_detail and says in record.error_detail
    assert record.output_tokens == 2


# ---------------------------------------------------------------------------------------------------------------
# 25. A saturated client says so without a selftest; a set-up error leaves no run directory
# ---------------------------------------------------------------------------------------------------------------

def test_a_busy_client_is_flagged_without_a_selftest(cal, monkeypatch) -> None:
    # The client is made busy (a record handler that burns CPU on the event loop) and the threshold lowered so
    # that a machine shared with other work still crosses it; no selftest result exists (see no_selftest).
    monkeypatch.setattr(environment_module, "CLIENT_CORES_LIMIT", 0.3)

    def burn(record) -> None:
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass
    result = bench(cal.url, options(mode="concurrency", concurrency=2, duration=2), on_record=burn)
    (level,) = result.levels
    assert level.environment is not None and level.environment.client_cpu_cores_mean >= 0.3
    assert any("the client (this servelab process) used" in w for w in level.warnings), level.warnings


def test_a_set_up_error_leaves_no_empty_run_directory(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket is closed
    proc = subprocess.run([*SERVELAB, "bench", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "connection refused" in proc.stderr
    assert run_dirs(tmp_path / "runs") == []  # the run directory made for it is gone again


def test_the_streams_a_load_needs_are_bounded_by_its_budget() -> None:
    from servelab.bench.modes import streams_needed

    assert streams_needed(build_options(BenchArgs(mode="concurrency", concurrency=10**9, requests=4))) == \
        (4, "--concurrency 1,000,000,000")
    assert streams_needed(build_options(BenchArgs(mode="rate", rate="2", requests=8, max_concurrency=10**9))) == \
        (8, "--max-concurrency 1,000,000,000")
    assert streams_needed(build_options(BenchArgs(mode="rate", rate="2"))) is None  # caught as it runs
    assert streams_needed(build_options(BenchArgs(mode="sweep"))) is None  # checked level by level


def test_a_sweep_stops_before_a_level_the_descriptor_limit_cannot_hold(cal, monkeypatch) -> None:
    import servelab.bench.levels as levels_module
    from servelab.bench.limits import DescriptorShortage

    def limit_of_two(streams: int, what: str):
        if streams > 2:
            raise DescriptorShortage(f"{what} needs {streams:,} sockets at once", hint="raise `ulimit -n`")
    monkeypatch.setattr(levels_module, "check_descriptors", limit_of_two)
    opts = options(mode="sweep", duration=1, max_concurrency=8, min_requests=2)
    opts.sweep_levels = None
    result = bench(cal.url, opts)
    assert [lv.tag for lv in result.levels] == ["c1", "c2"]  # measured levels kept
    assert result.stop_reason == "stopped: concurrency 4 needs 4 sockets at once (raise `ulimit -n`)"
