"""A server that floods, stalls or misbehaves (issue 27), against bench: headers bounded, a stalled server ending
its level within about two deadlines, URL credentials on every request, out-of-bound counts failing their request,
control bytes shown inert in every file written for people. Every server here is a loopback one the test starts
(tests/faulty_server.py)."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faulty_server import FaultyServer, huge_header_line, many_headers, never_answers, sse_answer
from servelab.bench.client import ClientOptions, Deadlines, RequestSpec, StreamClient
from servelab.store.rundir import read_records

SERVELAB = [sys.executable, "-m", "servelab.cli"]
CHAT = "/v1/chat/completions"


@pytest.fixture(autouse=True)
def no_selftest(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path.parent / f"{tmp_path.name}-cache"))


def send(url: str, deadlines: Deadlines | None = None):
    async def go():
        async with StreamClient(url, ClientOptions(deadlines=deadlines or Deadlines(first_byte_s=20))) as client:
            return await client.send(RequestSpec(endpoint=CHAT, body={"model": "m", "messages": []}))
    return asyncio.run(go())


def run_bench(url: str, out: Path, *more: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float,
                                                                                float]:
    """`servelab bench` in a subprocess: its result, wall time and peak RSS in MB (its own, from wait4)."""
    argv = [*SERVELAB, "bench", url, "--model", "m", "--tokenizer", "none", "--warmup", "0", "--out", str(out),
            *more]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out_text, err_text = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out_text, err_text = proc.communicate()
        raise AssertionError(f"bench ran past {timeout} s: {err_text[-2000:]}") from None
    wall = time.monotonic() - t0
    # communicate() reaped it: its peak RSS is in the children's usage, the largest any child reached so far
    import resource
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return subprocess.CompletedProcess(argv, proc.returncode, out_text, err_text), wall, peak_mb


def records(out: Path) -> list:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return read_records(run)


# ---------------------------------------------------------------------------------------------------------------
# 1. Response headers are bounded
# ---------------------------------------------------------------------------------------------------------------

def test_a_huge_header_line_fails_its_request_naming_the_bound() -> None:
    with FaultyServer(functools.partial(huge_header_line, size=64 << 20)) as srv:
        t0 = time.monotonic()
        record = send(srv.url)
    assert not record.ok and record.error_kind == "parse", (record.error_kind, record.error_detail)
    assert "response headers grew past 64 KiB" in record.error_detail
    assert time.monotonic() - t0 < 10


def test_two_million_headers_fail_their_request_naming_the_bound() -> None:
    with FaultyServer(many_headers) as srv:
        record = send(srv.url)
    assert not record.ok and record.error_kind == "parse"
    assert "more than 128 headers" in record.error_detail or "grew past 64 KiB" in record.error_detail


def test_one_long_header_under_the_head_bound_is_refused_by_its_own_bound() -> None:
    async def long_header(reader, writer, head) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Long: " + b"a" * (20 << 10)
                     + b"\r\n\r\n")
        await writer.drain()
    with FaultyServer(long_header) as srv:
        record = send(srv.url)
    assert record.error_kind == "parse" and "header is longer than 16 KiB" in record.error_detail


def test_a_normal_answer_still_passes_the_header_bounds() -> None:
    async def good(reader, writer, head) -> None:
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + sse_answer())
        await writer.drain()
    with FaultyServer(good) as srv:
        record = send(srv.url)
    assert record.ok, record.error_detail


@pytest.mark.parametrize("fault", ["huge_line", "many"])
def test_bench_under_a_header_flood_stays_under_300_mb(tmp_path: Path, fault: str) -> None:
    # Before: one 256 MB header line took `bench --concurrency 8` to 1,020 MB RSS; two million headers 1,474 MB.
    handler = huge_header_line if fault == "huge_line" else many_headers
    with FaultyServer(handler) as srv:
        done, wall, peak_mb = run_bench(srv.url, tmp_path, "--mode", "concurrency", "--concurrency", "8",
                                        "--requests", "8")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    kept = records(tmp_path)
    assert len(kept) == 8 and all(r.error_kind == "parse" for r in kept)
    assert peak_mb < 300, f"peak RSS {peak_mb:.0f} MB"
    assert wall < 60
