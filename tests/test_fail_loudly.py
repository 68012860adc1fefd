"""Failing loudly (docs/metrics.md#errors): a bench whose levels all failed exits 1 and names the error in the
terminal, with counts; closed-loop workers back off after failures instead of hammering the server, and a level
whose first requests all fail ends early; the live status counts the current level."""

from __future__ import annotations

import io
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from servelab.bench.failures import error_gate, error_line, top_errors
from servelab.bench.options import BenchArgs, build_options
from servelab.bench.runner import bench
from servelab.calibration import Script, start_calibration_server
from servelab.report.progress import LevelProgress
from servelab.records import ErrorCount, RequestRecord, Summary, TokenEvent
from servelab.store.rundir import read_records

SERVELAB = [sys.executable, "-m", "servelab.cli"]


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    """`python3 -m http.server`: a real server that answers every POST with 501 Unsupported method."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            cwd=tmp_path_factory.mktemp("www"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def refusing():
    """A calibration server whose every answer is HTTP 500, at once."""
    with start_calibration_server(Script(http_status=500)) as handle:
        yield handle


def test_a_sweep_against_a_server_that_answers_501_exits_1_and_names_the_error(http_server, tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = subprocess.run([*SERVELAB, "bench", http_server, "--mode", "sweep", "--duration", "3", "--model", "x",
                           "--warmup", "0", "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    out = " ".join((proc.stdout + proc.stderr).split())
    assert "HTTP 501" in out and "Unsupported method" in out
    assert "× HTTP 501" in out  # the count next to the error
    assert "error gate: c1: every request failed" in " ".join(proc.stderr.split())
    (records,) = tmp_path.glob("*/records.jsonl.gz")
    sent = read_records(records)
    # Without back-off it sent 2,279 requests in 3 s; with it, a handful.
    assert 1 <= len(sent) < 100, len(sent)
    assert all(r.http_status == 501 and not r.ok for r in sent)
    assert took < 60


def test_a_level_whose_first_requests_all_fail_ends_early(refusing) -> None:
    # A budget of 1,000 at 4 streams: the first 20 failures end the level, back-off keeps the rest few.
    opts = build_options(BenchArgs(mode="concurrency", concurrency=4, requests=1000, warmup=0))
    seen = []
    result = bench(refusing.url, opts, on_record=seen.append)
    (lv,) = result.levels
    assert lv.ok == 0 and 20 <= lv.failed <= 20 + 4  # the ones in flight when it stopped finish too
    assert lv.steady.ended_by == "failures" and not lv.steady.measured
    assert "the first 20 requests all failed, so the level stopped early" in lv.steady.reason
    assert lv.top_errors[0].count == lv.failed and lv.top_errors[0].status == 500
    assert error_gate(result.levels) == [f"c4: every request failed ({lv.failed} of {lv.failed})"]


def test_workers_back_off_after_failures(refusing) -> None:
    # One stream for 2 s: waits of 50, 100, 200, 400, 800 ms between failures allow ~6 requests, not thousands.
    t0 = time.monotonic()
    result = bench(refusing.url, build_options(BenchArgs(mode="concurrency", concurrency=1, duration=2,
                                                         warmup=0)))
    (lv,) = result.levels
    assert 3 <= lv.failed <= 10, lv.failed
    assert lv.steady.ended_by == "failing"  # not extended past its duration when most requests failed
    assert time.monotonic() - t0 < 15


def test_the_error_gate() -> None:
    def level(tag: str, ok: int, failed: int, cancelled: int = 0) -> Summary:
        return Summary(tag=tag, mode="concurrency", concurrency=1, requests=ok + failed + cancelled, ok=ok,
                       failed=failed, cancelled=cancelled, window_s=1.0)
    fine, some, every, cut = level("c1", 10, 0), level("c2", 7, 3), level("c4", 0, 5), level("c8", 0, 0, 4)
    assert error_gate([fine, some, cut]) == []  # by default only a level where every request failed breaks it
    assert error_gate([fine, some, every]) == ["c4: every request failed (5 of 5)"]
    assert error_gate([fine, some], max_error_rate=0.5) == []
    (reason,) = error_gate([fine, some], max_error_rate=0.2)
    assert reason.startswith("c2: 3 of 10 requests failed (30%)")
    assert error_gate([fine, some], max_error_rate=0) != [] and error_gate([fine], max_error_rate=0) == []


def test_top_errors_group_by_kind_status_and_detail_with_numbers_masked() -> None:
    def failed(i: int, kind: str, detail: str, status: int | None = None) -> RequestRecord:
        return RequestRecord(index=i, endpoint="/v1/chat/completions", t_send_ns=0, ok=False, error_kind=kind,
                             error_detail=detail, http_status=status)
    records = [failed(i, "http", "HTTP 501: Unsupported method ('POST')", 501) for i in range(3)]
    records += [failed(10 + i, "timeout_idle", f"idle deadline passed after {60 + i}.0s ({i} events received)")
                for i in range(2)]
    records.append(RequestRecord(index=20, endpoint="/v1/chat/completions", t_send_ns=0, ok=False,
                                 error_kind="cancelled", error_detail="cancelled after 3 events"))
    first, second = top_errors(records)
    assert (first.kind, first.status, first.count) == ("http", 501, 3)
    assert (second.kind, second.count) == ("timeout_idle", 2) and "60.0s" in second.detail  # the first's detail
    assert error_line(ErrorCount(kind="http", status=501, detail="HTTP 501: Unsupported method ('POST')",
                                 count=2279)) == "2,279 × HTTP 501: Unsupported method ('POST')"
    assert error_line(second) == "2 × timeout_idle: idle deadline passed after 60.0s (0 events received)"


def test_the_live_status_counts_the_current_level_and_prints_lines_to_a_pipe() -> None:
    def rec(tag: str, ok: bool = True) -> RequestRecord:
        return RequestRecord(index=0, tag=tag, endpoint="/v1/chat/completions", t_send_ns=0, ok=ok,
                             error_kind=None if ok else "http")
    progress = LevelProgress()
    progress.add(rec("c1"))
    assert progress.add(rec("c1", ok=False)) == "c1 · 0 s · 2 requests (1 failed) · 0 tokens"
    assert progress.add(rec("c2")) == "c2 · 0 s · 1 request · 0 tokens"  # counted afresh for the new level
    out = io.StringIO()
    with progress.printing(Console(file=out, width=200), every_s=1.0):
        time.sleep(2.3)
    assert "c2 · 1 s · 1 request · 0 tokens" in out.getvalue() or "c2 · 2 s · 1 request" in out.getvalue()


def test_the_live_status_says_how_long_the_level_has_left_and_when_it_runs_on(monkeypatch) -> None:
    """Issue 14: elapsed against the planned duration, then 'running on until steady' past it, tokens/s, and the
    client's CPU once sampled."""
    clock = [1000.0]
    monkeypatch.setattr("servelab.report.progress.time.monotonic", lambda: clock[0])
    progress = LevelProgress()
    progress.begin("c8", planned_s=120.0, cap_s=480.0)
    clock[0] += 30.0
    r = RequestRecord(index=0, tag="c8", endpoint="/v1/chat/completions", t_send_ns=0, ok=True,
                      events=[TokenEvent(t_ns=1, kind="answer", tokens=300)])
    assert progress.add(r) == "c8 · 30 s of 2 min 00 s (1 min 30 s left) · 1 request · 300 tokens (10/s)"
    clock[0] += 100.0
    progress.cpu = 0.42
    assert progress.line() == ("c8 · 2 min 10 s, past its 2 min 00 s: running on until steady, cap 8 min 00 s · "
                               "1 request · 300 tokens (2/s) · client CPU 42% of a core")
    progress.begin("single", planned_requests=8)
    assert progress.line() == "single · 0 s · 0/8 requests · 0 tokens · client CPU 42% of a core"
