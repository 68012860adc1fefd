"""Faults of processes, signals, storage and locks (issue 11): SIGTERM and SIGHUP behave as Ctrl-C, an engine's
double-forked server never outlives servelab, a full or read-only disk is one clear line, a broken store is found
before measuring and never costs a run directory its results, two runs of one experiment cannot share it, a
read-only store can be read, and `up --host 0.0.0.0` says who can reach the engine. Each test names its item.

Real processes, real signals and real files throughout; servers are the calibration server (a scripted
OpenAI-compatible server), launched directly or through a launcher script that double-forks it.
"""

from __future__ import annotations

import ipaddress
import json
import zlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from servelab.calibration import Script, start_calibration_server
from servelab.lifecycle.ports import free_port
from servelab.store.rundir import read_records

PY = sys.executable
SERVELAB = [PY, "-m", "servelab.cli"]
SLOW = Script(ttft_ms=5, itl_ms=200, output_tokens=50)  # 10 s streams: requests are in flight when signalled

LAUNCHER = [sys.executable, "-m", "servelab.calibration.launcher"]  # a double-forking launcher


def is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if is_gone(pid):
            return True
        time.sleep(0.05)
    return is_gone(pid)


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for(path: Path, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def server_progress(url: str, since_ns: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/calibration/summary?since_ns={since_ns}", timeout=5) as r:
        return json.loads(r.read())


def wait_streaming(url: str, since_ns: int, proc: subprocess.Popen, in_flight: int, timeout_s: float = 60) -> None:
    """Until the server has `in_flight` requests streaming tokens (nothing comes back to the client before a
    10 s stream ends, so the server is the judge)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            seen = server_progress(url, since_ns)
        except OSError:
            seen = {"requests": 0, "tokens": 0}
        if seen["requests"] >= in_flight and seen["tokens"] >= 3 * in_flight:
            return
        time.sleep(0.05)
    raise AssertionError(f"never {in_flight} requests streaming (exit {proc.poll()})")


def finish(proc: subprocess.Popen, timeout_s: float = 60) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


# --------------------------------------------------------------------------------------------------------------
# Item 5: SIGTERM and SIGHUP behave like Ctrl-C; a double-forked server never outlives servelab
# --------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def slow():
    with start_calibration_server(SLOW) as handle:
        yield handle


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["SIGTERM", "SIGHUP"])
def test_bench_stopped_by_sigterm_or_sighup_keeps_what_was_in_flight(tmp_path: Path, slow, sig, code):
    """Item 5: `bench` sent SIGTERM or SIGHUP mid-level behaves as after Ctrl-C: every request in flight is
    recorded (cancelled, with the tokens it had), the summary is written, and the exit code is 128 + signal."""
    since = time.perf_counter_ns()
    proc = subprocess.Popen([*SERVELAB, "bench", slow.url, "--mode", "concurrency", "--concurrency", "3",
                             "--duration", "60", "--warmup", "0", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_streaming(slow.url, since, proc, in_flight=3)
    proc.send_signal(sig)
    stdout, stderr = finish(proc)
    assert proc.returncode == code, stderr
    (run,) = tmp_path.glob("*/summary.json")
    summary = json.loads(run.read_text())
    assert summary["interrupted"] is True
    records = read_records(run.parent / "records.jsonl.gz")
    assert len(records) >= 3
    assert all(r.error_kind == "cancelled" and r.output_tokens >= 1 for r in records), records
    assert summary["levels"][0]["cancelled"] == len(records)
    assert "interrupted" in stdout
    assert not list(tmp_path.rglob("*.tmp"))


def start_up(tmp_path: Path, mode: str, extra: list[str] = ()) -> tuple[subprocess.Popen, int, int]:
    """`servelab up command -- python -m servelab.calibration.launcher …`: servelab, the port, and the double-forked server's pid."""
    pidfile = tmp_path / "server.pid"
    port = free_port()
    proc = subprocess.Popen([*SERVELAB, "up", "command", "--port", str(port), "--log-dir", str(tmp_path / "logs"),
                             *extra, "--", *LAUNCHER, "{port}", mode, str(pidfile), SLOW.model_dump_json()],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    server = int(wait_for(pidfile))
    seen = ""
    while "press Ctrl-C" not in seen:  # ready and serving (a pipe: one plain line per step)
        line = proc.stdout.readline()
        assert line, f"up ended before serving: {seen}{finish(proc)}"
        seen += line
    assert listening(port)
    return proc, port, server


@pytest.mark.parametrize("mode", ["group", "setsid"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_double_forked_server_does_not_outlive_up(tmp_path: Path, mode: str, sig: signal.Signals):
    """Item 5: a launcher that double-forks its server (staying in its group, or setsid into a session of its
    own): after SIGTERM to `up` (a clean stop, exit 0) or SIGKILL (no cleanup runs: the guard stops the tree),
    nothing listens on the port and neither the server nor the launcher is left."""
    proc, port, server = start_up(tmp_path, mode)
    try:
        launcher = [p.pid for p in psutil.Process(proc.pid).children() if "servelab.calibration.launcher" in " ".join(p.cmdline())]
        assert launcher, "the launcher is servelab's child"
        assert os.getsid(server) != os.getsid(launcher[0]) if mode == "setsid" else \
            os.getpgid(server) == os.getpgid(launcher[0])
        proc.send_signal(sig)
        stdout, stderr = finish(proc, timeout_s=30)
        if sig == signal.SIGTERM:
            # 0 once up has said the engine is serving; 143 when the signal beat its readiness probe (the server
            # wrote its pid a moment before it answered): either way a clean stop
            assert proc.returncode in (0, 143), stderr
            assert "stopping" in stdout or proc.returncode == 143
        assert wait_gone(server), f"the server outlived {sig.name} of up"
        assert wait_gone(launcher[0]), f"the launcher outlived {sig.name} of up"
        assert not listening(port)
    finally:
        if proc.poll() is None:  # a failed assertion before the signal: stop `up` (and so its engine) too
            proc.terminate()
            finish(proc, timeout_s=30)
        for pid in (server,):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def test_run_stopped_by_sigterm_records_in_flight_and_stops_the_engine_tree(tmp_path: Path):
    """Item 5: `run` of an experiment whose engine is a launcher that double-forks (setsid) its server, sent
    SIGTERM mid-bench: exit 143, the cell's summary says interrupted, the requests in flight are recorded as
    cancelled, and the server and the launcher are gone."""
    pidfile = tmp_path / "server.pid"
    port = free_port()
    experiment = {"name": "sigterm", "verify": {"enabled": False}, "contention": {"reruns": 0},
                  "bench": {"single_requests": 4, "warmup": 0, "sweep": False, "max_tokens": 50},
                  "cells": [{"name": "forking", "engine": "command", "model": "calibration", "port": port,
                             "extra_args": [*LAUNCHER, "{port}", "setsid", str(pidfile),
                                            SLOW.model_dump_json()]}]}
    (tmp_path / "exp.yaml").write_text(json.dumps(experiment))
    since = time.perf_counter_ns()
    proc = subprocess.Popen([*SERVELAB, "run", str(tmp_path / "exp.yaml"), "--out", str(tmp_path / "runs")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        server = int(wait_for(pidfile))
    except AssertionError:
        raise AssertionError(f"the engine never started: {finish(proc)}") from None
    try:
        wait_streaming(f"http://127.0.0.1:{port}", since, proc, in_flight=1)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = finish(proc)
        assert proc.returncode == 143, stderr
        (summary_path,) = (tmp_path / "runs").glob("*/forking/summary.json")
        summary = json.loads(summary_path.read_text())
        assert summary["status"] == "interrupted"
        records = read_records(summary_path.parent / "records.jsonl.gz")
        assert records and records[-1].error_kind == "cancelled" and records[-1].output_tokens >= 1
        assert wait_gone(server) and not listening(port)
    finally:
        try:
            os.kill(server, signal.SIGKILL)
        except OSError:
            pass


def test_the_guard_exits_after_a_clean_stop_and_marks_only_the_engine_tree(tmp_path: Path):
    """Item 5: every process of the engine carries its mark (the guard's way to find a server that left the
    group); servelab itself and the guard do not; after stop() the guard has exited."""
    from servelab.lifecycle.guard import marked_pids
    from servelab.lifecycle.supervisor import start_process

    proc = start_process(["sh", "-c", "sleep 60 & setsid sleep 61 & echo started; wait"], tmp_path / "e.log")
    deadline = time.monotonic() + 10
    while "started" not in (tmp_path / "e.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    marked = marked_pids(proc.tree_id)
    assert proc.pid in marked and len(marked) == 3, marked  # the shell, the sleep, the setsid sleep
    guard = proc._guard
    assert guard is not None and guard.pid not in marked and os.getpid() not in marked
    proc.stop(grace_s=5)
    assert marked_pids(proc.tree_id) == []
    assert wait_gone(guard.pid, 5)


# --------------------------------------------------------------------------------------------------------------
# Storage: a read-only or full disk (item 11), a broken store (item 12), a read-only store (item 20), the lock
# (item 13). Read-only and full filesystems are real: a private mount namespace (unshare -m) with a read-only
# bind mount or a tiny tmpfs, torn down with the namespace. Root ignores chmod, so chmod would prove nothing.
# --------------------------------------------------------------------------------------------------------------

def _can_mount() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


needs_mounts = pytest.mark.skipif(not _can_mount(), reason="needs unshare -m and mount (root in a container)")


def in_namespace(setup: str, command: list[str], keep: Path | None = None, mounted: Path | None = None,
                 timeout_s: float = 120) -> subprocess.CompletedProcess:
    """Run `command` in a private mount namespace after the shell `setup`; with `keep`, copy what `mounted` holds
    to `keep` afterwards (the mount and what was written on it vanish with the namespace)."""
    save = f'; mkdir -p "{keep}"; cp -a "{mounted}/." "{keep}/"' if keep is not None else ""
    script = f'set -e; {setup}; set +e; "$@"; rc=$?{save}; exit $rc'
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *command],
                          capture_output=True, text=True, timeout=timeout_s)


def read_only(path: Path) -> str:
    """Shell: make `path` a read-only bind of itself (in the namespace)."""
    return f'mkdir -p "{path}"; mount --bind "{path}" "{path}"; mount -o remount,bind,ro "{path}"'


@pytest.fixture(scope="module")
def fast():
    with start_calibration_server(Script(output_tokens=40, ttft_ms=2, itl_ms=1)) as handle:
        yield handle


def experiment_file(tmp_path: Path, url: str, name: str = "disk", requests: int = 3, **bench: Any) -> Path:
    doc = {"name": name, "verify": {"enabled": False}, "contention": {"reruns": 0},  # not what these test
           "bench": {"single_requests": requests, "warmup": 0, "sweep": False, "max_tokens": 40, **bench},
           "cells": [{"name": "a", "url": url}, {"name": "b", "url": url}]}
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(doc))
    return path


@needs_mounts
def test_a_read_only_out_or_log_dir_is_one_line_and_exit_2_before_measuring(tmp_path: Path, fast):
    """Item 11: `bench --out`, `run --out` and `up --log-dir` on a read-only filesystem: one line naming the path
    and the errno (EROFS), exit 2, and not one request sent."""
    ro = tmp_path / "ro"
    since = time.perf_counter_ns()
    commands = {
        "bench": [*SERVELAB, "bench", fast.url, "--requests", "2", "--warmup", "0", "--out", str(ro / "bench")],
        "run": [*SERVELAB, "run", str(experiment_file(tmp_path, fast.url)), "--out", str(ro / "runs")],
        "up": [*SERVELAB, "up", "command", "--log-dir", str(ro / "logs"), "--", PY, "-c", "pass"],
    }
    for name, command in commands.items():
        done = in_namespace(read_only(ro), command)
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        line = done.stderr.strip()
        assert "\n" not in line and str(ro) in line and "(EROFS)" in line, (name, line)
        assert "internal error" not in line
    assert server_progress(fast.url, since)["requests"] == 0


@needs_mounts
def test_a_disk_that_fills_during_bench_keeps_every_measurement(tmp_path: Path, fast):
    """Item 11: `bench --out` on a filesystem that fills up mid-run (a 20 kB tmpfs; about half of the 200
    compressed records fill it): the run goes on, the terminal
    shows every request measured, stderr says which file could not be written and why (ENOSPC), exit 2; the
    directory holds only whole records (no torn line) and no `.tmp`."""
    full, kept = tmp_path / "full", tmp_path / "kept"
    setup = f'mkdir -p "{full}"; mount -t tmpfs -o size=20k tmpfs "{full}"'
    done = in_namespace(setup, [*SERVELAB, "bench", fast.url, "--requests", "200", "--warmup", "0",
                                "--max-tokens", "40", "--out", str(full)], keep=kept, mounted=full)
    assert done.returncode == 2, done.stderr
    assert "internal error" not in done.stderr
    assert "200/200" in done.stdout  # every request measured and reported
    assert "No space left on device (ENOSPC)" in done.stderr and "records.jsonl" in done.stderr, done.stderr
    assert not list(kept.rglob("*.tmp"))
    (records,) = kept.glob("*/records.jsonl.gz")
    lines = zlib.decompressobj(wbits=31).decompress(records.read_bytes()).decode().splitlines()
    assert 0 < len(lines) < 200, len(lines)  # readable as a gzip stream although the disk filled before its trailer
    assert all(json.loads(line)["index"] >= 0 for line in lines)  # whole lines only


@needs_mounts
def test_a_disk_that_fills_during_run_keeps_every_measurement(tmp_path: Path, fast):
    """Item 11: `run` with --out on a filesystem that fills up mid-run (the store elsewhere): every cell still
    completes and is stored with all its records, the comparison is made, stderr names what could not be
    written (ENOSPC), exit 2, no `.tmp` left."""
    full, kept = tmp_path / "full", tmp_path / "kept"
    setup = f'mkdir -p "{full}"; mount -t tmpfs -o size=96k tmpfs "{full}"'
    exp = experiment_file(tmp_path, fast.url, requests=30)
    store = tmp_path / "store.db"
    done = in_namespace(setup, [*SERVELAB, "run", str(exp), "--out", str(full), "--store", str(store)],
                        keep=kept, mounted=full, timeout_s=300)
    assert done.returncode == 2, (done.stdout[-2000:], done.stderr)
    assert "internal error" not in done.stderr
    assert "No space left on device (ENOSPC)" in done.stderr
    assert "comparison (baseline: a)" in done.stdout
    assert not list(kept.rglob("*.tmp"))
    from servelab.store.db import Store
    from servelab.store.runs import list_runs, load_run

    with Store.open(store, readonly=True) as db:
        rows = list_runs(db)
        assert sorted(r.cell_name for r in rows) == ["a", "b"] and all(r.status == "complete" for r in rows)
        for row in rows:
            assert len(load_run(db, row.run_id)[1]) == 30  # every record, those the disk refused included


def test_a_failed_write_leaves_no_tmp_and_no_torn_record(tmp_path: Path, monkeypatch):
    """Item 11: a write refused with ENOSPC (monkeypatched, as root cannot be refused by permissions): the
    summary's `.tmp` is removed and the previous summary kept; a record whose line was half written is cut back
    off and kept in memory; write_errors names the files and the errno."""
    import builtins
    import errno

    from servelab.records import BenchResult, RequestRecord
    from servelab.store.rundir import RunDir

    run = RunDir(tmp_path / "run")
    record = RequestRecord(index=0, endpoint="/v1/chat/completions", t_send_ns=1)
    run.append_record(record)
    doc = BenchResult(url="http://h:1", model="m", mode="single", workload={}, levels=[])
    assert run.write_json("summary.json", doc) is not None
    real_open = builtins.open

    class HalfWriter:
        """A file that takes half of what it is given, then says the disk is full."""

        def __init__(self, fh):
            self.fh = fh

        def write(self, text):
            self.fh.write(text[: len(text) // 2])
            self.fh.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.fh, name)

    def full_open(path, mode="r", *args, **kwargs):
        fh = real_open(path, mode, *args, **kwargs)
        return HalfWriter(fh) if ("a" in mode or "w" in mode) else fh

    run.close()
    monkeypatch.setattr(builtins, "open", full_open)
    monkeypatch.setattr(Path, "write_text", lambda self, text, **kw: HalfWriter(real_open(self, "w")).write(text))
    run.append_record(record.model_copy(update={"index": 1}))
    run.append_record(record.model_copy(update={"index": 2}))
    assert run.write_json("summary.json", doc) is None
    monkeypatch.undo()
    assert [r.index for r in read_records(run.records_path)] == [0]
    kept_bytes = zlib.decompressobj(wbits=31).decompress(run.records_path.read_bytes())
    assert kept_bytes.count(b"\n") == 1 and kept_bytes.endswith(b"\n")  # the torn half line was cut off
    assert [r.index for r in run.all_records()] == [0, 1, 2]
    assert not list(run.path.glob("*.tmp"))
    assert json.loads((run.path / "summary.json").read_text())["url"] == "http://h:1"  # the previous one stays
    assert any("records.jsonl" in e and "(ENOSPC)" in e and "2 record(s)" in e for e in run.write_errors)
    assert any("summary.json" in e and "(ENOSPC)" in e for e in run.write_errors)


def make_store(tmp_path: Path, url: str) -> tuple[Path, list[str]]:
    """An experiment of two cells run in-process: its out root (with servelab.db) and the run ids."""
    from rich.console import Console

    from servelab.experiment.load import load_experiment
    from servelab.experiment.runner import ExperimentOptions, run_experiment

    out = tmp_path / "runs"
    result = run_experiment(load_experiment(experiment_file(tmp_path, url, name="stored", requests=2)),
                            ExperimentOptions(out_root=out), Console(file=open(os.devnull, "w")))
    assert result.status == "complete", result.cells
    return out, [c.run_id for c in result.cells]


def corrupt_table_page(db_path: Path, table: str) -> None:
    """Overwrite the root page of `table` with garbage, as a bad sector or a torn copy would."""
    import sqlite3

    with sqlite3.connect(db_path) as db:
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    with open(db_path, "r+b") as fh:
        fh.seek((root - 1) * page_size)
        fh.write(bytes([0x0D, 0xFF, 0xFF, 0xFF]) + b"\xa5" * (page_size - 4))


@pytest.mark.parametrize("damage", ["corrupt page", "dropped table"])
def test_a_damaged_store_stops_run_before_measuring(tmp_path: Path, fast, damage: str):
    """Item 12: a store with a corrupt page (found by quick_check) or a dropped table: `run` and `bench --out`
    say it is damaged and exit 2 before sending one request (it used to measure a whole cell first)."""
    import sqlite3

    out, _ = make_store(tmp_path, fast.url)
    db_path = out / "servelab.db"
    if damage == "corrupt page":
        corrupt_table_page(db_path, "records")
    else:
        with sqlite3.connect(db_path) as db:
            db.execute("DROP TABLE levels")
    since = time.perf_counter_ns()
    before = sorted(p.name for p in out.iterdir() if p.is_dir())
    for command in ([*SERVELAB, "run", str(experiment_file(tmp_path, fast.url, name="other")), "--out", str(out)],
                    [*SERVELAB, "bench", fast.url, "--requests", "2", "--warmup", "0", "--out", str(out)]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, (command[3], done.stderr)
        assert "damaged" in done.stderr and str(db_path) in done.stderr, done.stderr
        assert "levels missing" in done.stderr if damage == "dropped table" else True
    assert server_progress(fast.url, since)["requests"] == 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == before  # no run directory was made


def test_a_store_that_fails_mid_run_costs_no_run_directory_its_results(tmp_path: Path, fast, monkeypatch):
    """Item 12: the store loses a table while an experiment runs (dropped by another connection after the first
    cell): the run goes on, the error is reported once, both cells' run directories are complete (summary and
    every record), and the comparison is made from them."""
    import io
    import sqlite3

    from rich.console import Console

    import servelab.pipeline as pipeline
    from servelab.experiment.load import load_experiment
    from servelab.experiment.runner import ExperimentOptions, run_experiment

    out = tmp_path / "runs"
    real_bench = pipeline.bench
    calls: list[str] = []

    def bench_then_break_the_store(url, opts, **kw):
        calls.append(opts.mode)
        if len(calls) == 2:  # the second cell: the store breaks under the run
            with sqlite3.connect(out / "servelab.db") as db:
                db.execute("DROP TABLE records")
        return real_bench(url, opts, **kw)

    monkeypatch.setattr(pipeline, "bench", bench_then_break_the_store)
    printed = io.StringIO()
    result = run_experiment(load_experiment(experiment_file(tmp_path, fast.url, requests=3)),
                            ExperimentOptions(out_root=out), Console(file=printed, width=200))
    assert result.status == "complete"
    assert [c.status for c in result.cells] == ["complete", "complete"]
    assert result.write_errors and all("could not be written" in e for e in result.write_errors)
    assert printed.getvalue().count("store error:") == 1
    for cell in result.cells:
        summary = json.loads((Path(cell.run_dir) / "summary.json").read_text())
        assert summary["status"] == "complete"
        assert len(read_records(Path(cell.run_dir) / "records.jsonl.gz")) == 3
    assert result.comparison is not None and [r.name for r in result.comparison.runs] == ["a", "b"]


@needs_mounts
def test_a_read_only_store_can_be_read(tmp_path: Path, fast):
    """Item 20: a store (and its run directories) on a read-only mount: runs, show, compare, report and export
    all work, writing only where they are told to; the store file is not changed."""
    import hashlib

    out, (first, second) = make_store(tmp_path, fast.url)
    digest = hashlib.sha256((out / "servelab.db").read_bytes()).hexdigest()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    commands = {
        "runs": [*SERVELAB, "runs", "--out", str(out)],
        "show": [*SERVELAB, "show", first, "--out", str(out)],
        "compare": [*SERVELAB, "compare", first, second, "--out", str(out)],
        "report": [*SERVELAB, "report", first, second, "--out", str(out), "-o", str(elsewhere / "r.html")],
        "export": [*SERVELAB, "export", first, "--format", "json", "--to", str(elsewhere / "x"), "--out", str(out)],
    }
    for name, command in commands.items():
        done = in_namespace(read_only(out), command)
        assert done.returncode == 0, (name, done.stdout[-1500:], done.stderr)
        assert "internal error" not in done.stderr
    assert (elsewhere / "r.html").is_file() and (elsewhere / "x" / "records.json").is_file()
    assert hashlib.sha256((out / "servelab.db").read_bytes()).hexdigest() == digest


def test_an_older_store_opened_read_only_is_migrated_in_memory_only(tmp_path: Path):
    """Item 20: a store of an older schema, opened for reading, reads as the latest schema while the file keeps
    its version."""
    import sqlite3

    from servelab.store.db import Store
    from servelab.store.migrations import LATEST, MIGRATIONS
    from servelab.store.runs import list_runs

    path = tmp_path / "old.db"
    with sqlite3.connect(path, isolation_level=None) as db:
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for migration in MIGRATIONS[:LATEST - 1]:
            migration(db)
        db.execute("INSERT INTO schema_version VALUES (?)", (LATEST - 1,))
    with Store.open(path, readonly=True) as store:
        assert store.version() == LATEST and list_runs(store) == []
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version FROM schema_version").fetchone()[0] == LATEST - 1


def test_two_runs_of_one_experiment_cannot_run_at_once(tmp_path: Path, slow):
    """Item 13: while one `run` of an experiment measures, a second `run` of the same experiment (same store)
    says which process holds it and exits 2 at once, measuring nothing; once the first ends, it can run."""
    from servelab.experiment.runner import lock_path

    exp = experiment_file(tmp_path, slow.url, name="locked", requests=2)
    out = tmp_path / "runs"
    first = subprocess.Popen([*SERVELAB, "run", str(exp), "--out", str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        holder = wait_for(lock_path(out / "servelab.db", "locked"))
        assert f"pid {first.pid}" in holder
        started = time.monotonic()
        second = subprocess.run([*SERVELAB, "run", str(exp), "--out", str(out)], capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 2, second.stderr
        assert f"pid {first.pid}" in second.stderr and "already running" in second.stderr
        assert time.monotonic() - started < 30
        assert len(list(out.glob("*-locked"))) == 1  # one experiment directory: the second made none
    finally:
        first.send_signal(signal.SIGINT)
        finish(first)
    assert first.returncode == 130
    # the lock went with its holder: running it again resumes the interrupted experiment
    # (the same experiment, by name and store, against a quick server: the slow one's streams take 10 s each)
    with start_calibration_server(Script(output_tokens=4, ttft_ms=2, itl_ms=1)) as quick:
        (tmp_path / "same").mkdir()
        same = experiment_file(tmp_path / "same", quick.url, name="locked", requests=1)
        again = subprocess.run([*SERVELAB, "run", str(same), "--out", str(out), "--new"], capture_output=True,
                               text=True, timeout=120)
    assert again.returncode == 0 and "already running" not in again.stderr, again.stderr


# --------------------------------------------------------------------------------------------------------------
# Item 16: `up --host 0.0.0.0` says who can reach the engine, at its real addresses
# --------------------------------------------------------------------------------------------------------------

def serve_until_ready(command: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen = ""
    while "press Ctrl-C" not in seen:
        line = proc.stdout.readline()
        assert line, f"up ended before serving: {seen}{finish(proc)}"
        seen += line
    return proc, seen


def printed_addresses(seen: str, port: int) -> set[str]:
    """The IPv4 addresses of the URLs `up` printed for `port`, 127.0.0.1 (where servelab probes) left out."""
    return set(re.findall(rf"http://([0-9.]+):{port}\b", seen)) - {"127.0.0.1"}


def ipv4_addresses() -> set[str]:
    """This host's non-loopback IPv4 addresses, read from psutil here (not through servelab's own code)."""
    found = set()
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family == socket.AF_INET and not ipaddress.ip_address(addr.address).is_loopback:
                found.add(addr.address)
    return found


@pytest.mark.parametrize("host", ["0.0.0.0", "127.0.0.1"])
def test_up_on_every_interface_warns_and_prints_the_real_addresses(tmp_path: Path, host: str):
    """Item 16: `up --host 0.0.0.0` of a server that asks for no API key warns that it is reachable from the
    network and prints this host's own addresses, not only 127.0.0.1; loopback does not warn.

    The printed addresses are compared with psutil's list of this host's interfaces, without connecting to them:
    a request to an interface address is traffic outside loopback, which the suite does not send
    (tests/loopback_guard.py). That each printed address answers is shown where the test owns the network: in a
    namespace of its own (the next test). Addresses that come or go while `up` starts (another test's namespace)
    are neither required nor refused."""
    port = free_port()
    before = ipv4_addresses()
    proc, seen = serve_until_ready([*SERVELAB, "up", "command", "--host", host, "--port", str(port), "--log-dir",
                                    str(tmp_path), "--", PY, "-m", "servelab.calibration.server", "--host",
                                    "{host}", "--port", "{port}"])
    try:
        after = ipv4_addresses()
        if host == "127.0.0.1":
            assert "warning" not in seen and "from the network" not in seen, seen
            return
        assert "warning: --host 0.0.0.0: the engine is reachable from the network at" in seen, seen
        assert "asks for no API key" in seen
        printed = printed_addresses(seen, port)
        if not before | after:
            assert "every address of this host" in seen, seen
            return
        assert before & after <= printed <= before | after, (printed, before, after, seen)
    finally:
        proc.send_signal(signal.SIGINT)
        finish(proc)


@pytest.mark.netns
def test_up_on_every_interface_is_reachable_at_each_printed_address(tmp_path: Path, netns):
    """Item 16: an engine `up --host 0.0.0.0` brought up answers at each address it printed, from another host.

    `up` runs inside a network namespace the test made (tests/loopback_guard.py: a veth pair, no other
    interface), so the host's addresses are known exactly, the namespace's one veth address, and this process,
    on the other end of the pair, is the other host. Nothing goes further than the pair."""
    port = free_port()
    proc, seen = serve_until_ready(netns.exec(*SERVELAB, "up", "command", "--host", "0.0.0.0", "--port",
                                              str(port), "--log-dir", str(tmp_path), "--", PY, "-m",
                                              "servelab.calibration.server", "--host", "{host}", "--port",
                                              "{port}"), env=netns.env)
    try:
        assert "warning: --host 0.0.0.0: the engine is reachable from the network at" in seen, seen
        assert printed_addresses(seen, port) == {netns.ns_addr}, seen
        with urllib.request.urlopen(f"http://{netns.ns_addr}:{port}/health", timeout=5) as answer:
            assert answer.status == 200  # a real address of the engine, reached from outside its host
    finally:
        proc.send_signal(signal.SIGINT)
        finish(proc)


def test_exposure_knows_an_engine_given_an_api_key():
    """Item 16: an engine started with --api-key is reachable but authenticated: the line says so instead of the
    warning about anyone using it; loopback addresses are not exposure."""
    from servelab.lifecycle.exposure import exposure

    keyed = exposure("0.0.0.0", 8000, ["vllm", "serve", "m", "--api-key", "k"])
    assert keyed is not None and keyed.authenticated and "given an API key" in keyed.warning()
    assert not exposure("0.0.0.0", 8000, ["llama-server", "--port", "8000"]).authenticated
    assert exposure("10.1.2.3", 8000).urls == ["http://10.1.2.3:8000"]
    assert all(exposure(h, 1) is None for h in ("127.0.0.1", "localhost", "::1", "127.0.0.2"))
