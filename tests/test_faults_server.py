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
import tempfile
import time
from pathlib import Path

import pytest

from faulty_server import (FaultyServer, basic_auth_required, huge_header_line, many_headers, never_answers,
                           sse_answer)
from peak_rss import run_measured
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


def run_bench(url: str, out: Path, *more: str, timeout: float = 120, model: str = "m"
              ) -> tuple[subprocess.CompletedProcess, float, float]:
    """`servelab bench` in a subprocess: its result, wall time and peak RSS in MB. The peak is the bench's own
    (tests/peak_rss.py): neither the largest of every child the session reaped (getrusage(RUSAGE_CHILDREN)) nor
    the test process's own image, which a child's wait4 counts from before its exec."""
    argv = [*SERVELAB, "bench", url, "--model", model, "--tokenizer", "none", "--warmup", "0", "--out", str(out),
            *more]
    with tempfile.TemporaryFile("w+") as out_file, tempfile.TemporaryFile("w+") as err_file:
        try:
            code, wall, peak_mb = run_measured(argv, timeout, out_file, err_file)
        except AssertionError as exc:
            err_file.seek(0)
            raise AssertionError(f"{exc}: {err_file.read()[-2000:]}") from None
        out_file.seek(0)
        err_file.seek(0)
        out_text, err_text = out_file.read(), err_file.read()
    return subprocess.CompletedProcess(argv, code, out_text, err_text), wall, peak_mb


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


# ---------------------------------------------------------------------------------------------------------------
# 2. A server that stopped answering ends its level within about two deadlines
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [("--mode", "single", "--requests", "4"),
                                  ("--mode", "concurrency", "--concurrency", "2", "--requests", "8")],
                         ids=["single", "concurrency"])
def test_a_server_that_never_sends_headers_ends_the_level_in_two_deadlines(tmp_path: Path, mode) -> None:
    # Before: each of the requests waited out its deadline in turn (494 s for 4 at the default 120 s; here 4 x 2 s).
    with FaultyServer(never_answers) as srv:
        done, wall, _ = run_bench(srv.url, tmp_path, *mode, "--timeout-first-byte", "2", "--timeout-idle", "2")
        posts = srv.posts
    text = done.stdout + done.stderr
    assert done.returncode == 1, text[-3000:]
    assert "the server stopped answering: 2 requests in a row reached the first-byte deadline of 2 s" in text, \
        text[-3000:]
    assert wall < 2 * 2 + 12, wall  # two deadlines and the set-up, not four or eight deadlines
    kept = records(tmp_path)
    assert posts == len(kept) and all(r.error_kind == "timeout_first_byte" for r in kept)
    assert len(kept) == 2  # the rest were not sent
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    assert "stopped answering" in (summary.get("stop_reason") or ""), summary.get("stop_reason")


def test_one_slow_request_among_good_ones_does_not_end_a_level() -> None:
    from servelab.bench.loads.control import StallWatch
    from servelab.records import RequestRecord

    def rec(ok: bool, kind: str | None = None) -> RequestRecord:
        return RequestRecord(index=0, endpoint=CHAT, t_send_ns=0, ok=ok, error_kind=kind,
                             error_detail="first byte deadline passed after 2.0s (0 events received; the "
                                          "deadline is 2 s)" if kind else None)
    watch = StallWatch()
    watch.see(rec(False, "timeout_first_byte"))
    watch.see(rec(False, "http"))
    watch.see(rec(False, "timeout_first_byte"))
    assert not watch.stalled  # not in a row
    watch.see(rec(False, "timeout_first_byte"))
    assert watch.stalled and "first-byte deadline of 2 s" in watch.reason()
    served = StallWatch()
    served.see(rec(True))
    served.see(rec(False, "timeout_first_byte"))
    served.see(rec(False, "timeout_first_byte"))
    assert not served.stalled  # it answered before: a slow moment, not a server that stopped


def test_a_run_cell_whose_server_stopped_answering_fails_with_the_evidence(tmp_path: Path, monkeypatch) -> None:
    import dataclasses

    from rich.console import Console

    from servelab import pipeline
    from servelab.experiment.load import parse_experiment
    from servelab.experiment.runner import ExperimentOptions, run_experiment

    real_bench = pipeline.bench

    def short_deadlines(url, opts, **kw):  # the experiment's deadlines are bench's (120 s); 1 s here
        return real_bench(url, dataclasses.replace(opts, deadlines=Deadlines(first_byte_s=1, idle_s=1)), **kw)

    monkeypatch.setattr(pipeline, "bench", short_deadlines)
    with FaultyServer(never_answers) as srv:
        text = ("name: stalled\nbench: {single_requests: 4, max_tokens: 6, level_duration_s: 0.3, "
                "max_concurrency: 2, warmup: 0}\nverify: {enabled: false}\ncontention: {reruns: 0}\ncells:\n"
                f"  - {{name: stalled, url: {srv.url}, model: m}}\n")
        t0 = time.monotonic()
        result = run_experiment(parse_experiment(text, "exp.yaml"), ExperimentOptions(out_root=tmp_path),
                                Console(file=open(os.devnull, "w")))
        wall = time.monotonic() - t0
        posts = srv.posts
    (cell,) = result.cells
    assert cell.status == "failed" and "stopped answering" in cell.reason, cell.reason
    assert "first-byte deadline of 1 s" in cell.reason
    assert posts == 2 and wall < 20, (posts, wall)  # the cell ended; its sweep never ran


# ---------------------------------------------------------------------------------------------------------------
# 3. URL credentials go with every request, and are never written
# ---------------------------------------------------------------------------------------------------------------

def test_url_credentials_go_with_the_measured_requests_and_are_never_written(tmp_path: Path) -> None:
    # Before: Basic auth on the set-up probes only; the 4 measured POSTs got 4 x HTTP 401, exit 1.
    secret = "PW-servelab-27-s3cret"
    with FaultyServer(basic_auth_required("alice", secret)) as srv:
        url = srv.url.replace("http://", f"http://alice:{secret}@")
        done, _, _ = run_bench(url, tmp_path, "--mode", "single", "--requests", "4")
        posts = srv.posts
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    kept = records(tmp_path)
    assert posts == 4 and len(kept) == 4 and all(r.ok for r in kept), [r.error_detail for r in kept]
    assert secret not in done.stdout + done.stderr
    leaked = [str(p) for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in _plain_bytes(p)]
    assert leaked == []


def _plain_bytes(path: Path) -> bytes:
    import gzip
    import sqlite3

    raw = path.read_bytes()
    if path.suffix == ".gz":
        return gzip.decompress(raw)
    if path.suffix == ".db":
        with sqlite3.connect(path) as db:  # the store: every text it holds, whatever page it sits on
            rows = [str(row) for (name,) in db.execute("select name from sqlite_master where type='table'")
                    for row in db.execute(f'select * from "{name}"')]
        return raw + "\n".join(rows).encode()
    return raw


def test_the_basic_header_is_built_from_the_url() -> None:
    from servelab.bench.client import basic_auth

    assert basic_auth("http://127.0.0.1:8000") is None
    assert basic_auth("http://a%40b:p%3Aw@h:1/v1") == "Basic " + __import__("base64").b64encode(b"a@b:p:w").decode()


# ---------------------------------------------------------------------------------------------------------------
# 4. Control bytes from the server reach no file written for people raw
# ---------------------------------------------------------------------------------------------------------------

RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def raw_controls(text: str) -> list[str]:
    return [repr(c) for c in RAW if c in text]


def test_escape_bytes_from_the_server_are_shown_not_written_raw(tmp_path: Path) -> None:
    # Before: report.html held the server's ESC bytes raw (12 in one report), as did the CSV export.
    from faulty_server import hostile_answers

    from faulty_server import HOSTILE

    with FaultyServer(hostile_answers(), model=f"model{HOSTILE}") as srv:
        done, _, _ = run_bench(srv.url, tmp_path, "--mode", "single", "--requests", "4", model=f"model{HOSTILE}")
    terminal = done.stdout + done.stderr
    assert "boom" in terminal and raw_controls(terminal) == [], terminal[-2000:]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    # the raw records keep what the server sent
    assert any("\x1b[31m" in (r.error_detail or "") for r in read_records(run))
    report = tmp_path / "report.html"
    made = subprocess.run([*SERVELAB, "report", str(run), "-o", str(report), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    page = report.read_text(encoding="utf-8")
    assert "answer \\x1b[31mred" in page  # the sample answers the report shows
    assert raw_controls(page) == []
    exported = subprocess.run([*SERVELAB, "export", str(run), "--format", "csv", "--to", str(tmp_path / "csv"),
                               "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert exported.returncode == 0, exported.stderr
    csv_text = (tmp_path / "csv" / "records.csv").read_text(encoding="utf-8") + \
        (tmp_path / "csv" / "levels.csv").read_text(encoding="utf-8")
    assert "boom" in csv_text and "\\x1b[31mred" in csv_text
    assert raw_controls(csv_text) == []


def test_junit_shows_control_characters_as_escapes() -> None:
    from faulty_server import HOSTILE
    from servelab.records import CheckResult, VerifyResult
    from servelab.verify.junit import junit_document

    result = VerifyResult(url="http://127.0.0.1:1", model=f"m{HOSTILE}", checks=[
        CheckResult(id="chat", title="chat", outcome="fail", reason=f"answered {HOSTILE}",
                    response_excerpt=f"x{HOSTILE}")])
    doc = junit_document([("s", result)]).decode("utf-8")
    assert "answered \\x1b[31mred" in doc and "\\x9b2J" in doc and "\\u202etxt" in doc
    assert raw_controls(doc) == []


def test_visible_is_the_one_helper_and_keeps_lines() -> None:
    from servelab.textsafe import visible

    assert visible("a\x1b[2Jb\n\tc\r\x9b\u2066") == "a\\x1b[2Jb\n\tc\\x0d\\x9b\\u2066"


# ---------------------------------------------------------------------------------------------------------------
# 5. A token count past any bound fails its request, whatever JSON number it is written as
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("count", ["1000000000000000000000000000000", "1e308", "1e30"])
def test_an_out_of_bound_usage_count_is_a_parse_failure(count: str) -> None:
    # Before: 10^30 and 1e308 parse as floats and were dropped silently: every request ok, exit 0.
    events = ('data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
              f'data: {{"choices":[],"usage":{{"prompt_tokens":1,"completion_tokens":{count}}}}}\n\n'
              'data: [DONE]\n\n').encode()

    async def fault(reader, writer, head) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
                     % len(events) + events)
        await writer.drain()
    with FaultyServer(fault) as srv:
        record = send(srv.url)
    assert not record.ok and record.error_kind == "parse", (record.error_kind, record.error_detail)
    assert "usage.completion_tokens" in record.error_detail and "not a plausible token count" in record.error_detail
    assert len(record.error_detail) < 400


def test_a_float_running_count_past_the_bound_fails_too() -> None:
    from servelab.protocol.chunks import read_chunk

    view = read_chunk({"choices": [{"delta": {"content": "x"}}], "timings": {"predicted_n": 1e30}})
    assert view.running_count == 10**30 or view.running_count == int(1e30)
    assert read_chunk({"choices": [], "usage": {"completion_tokens": 7.0}}).usage.completion_tokens == 7


# ---------------------------------------------------------------------------------------------------------------
# 6. A full disk is called a full disk, not a damaged store
# ---------------------------------------------------------------------------------------------------------------

def test_a_full_disk_is_not_called_a_damaged_store(tmp_path: Path, monkeypatch) -> None:
    import sqlite3

    from servelab.errors import UserError
    from servelab.store.db import Store, store_write_failure

    def full(self) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(Store, "migrate", full)
    with pytest.raises(UserError) as info:
        Store.open(tmp_path / "servelab.db")
    said = str(info.value)
    assert "disk is full" in said and "damaged" not in said, said
    line = store_write_failure(tmp_path / "servelab.db", info.value)
    assert "the disk is full" in line and "damaged" not in line
    raw = store_write_failure(tmp_path / "servelab.db", sqlite3.OperationalError("database or disk is full"))
    assert "the disk is full" in raw and "damaged" not in raw
    assert "disk is full" not in store_write_failure(tmp_path / "x.db", sqlite3.DatabaseError("malformed"))


# ---------------------------------------------------------------------------------------------------------------
# 7. A second Ctrl-C right after the first still prints the --json result
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gap_s", [0.05, 0.2])
def test_a_second_ctrl_c_still_prints_the_json_result(tmp_path: Path, gap_s: float) -> None:
    # Before: exit 130, everything on disk, nothing on stdout (the second SIGINT landed while the run was stored).
    import signal

    from servelab.calibration import Script, start_calibration_server

    with start_calibration_server(Script(ttft_ms=5, itl_ms=200, output_tokens=50)) as cal:
        proc = subprocess.Popen([*SERVELAB, "bench", cal.url, "--mode", "concurrency", "--concurrency", "4",
                                 "--requests", "40", "--warmup", "0", "--tokenizer", "none", "--json", "--out",
                                 str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(tmp_path.glob("*/records.jsonl*")):
            time.sleep(0.1)
        time.sleep(3)  # requests in flight
        proc.send_signal(signal.SIGINT)
        time.sleep(gap_s)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    result = json.loads(out)
    assert result["interrupted"] is True and result["levels"]
    assert list(tmp_path.glob("*/summary.json"))
