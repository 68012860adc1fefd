"""Faults of processes, signals, storage and locks (issue 11): SIGTERM and SIGHUP behave as Ctrl-C, an engine's
double-forked server never outlives servelab, a full or read-only disk is one clear line, a broken store is found
before measuring and never costs a run directory its results, two runs of one experiment cannot share it, a
read-only store can be read, and `up --host 0.0.0.0` says who can reach the engine. Each test names its item.

Real processes, real signals and real files throughout; servers are the calibration server (a scripted
OpenAI-compatible server), launched directly or through a launcher script that double-forks it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
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

# A launcher that double-forks its server, as daemonizing launchers do: the server (the calibration server)
# leaves the launcher's process group and session when MODE is "setsid", and stays in it when it is "group".
# The launcher itself stays, as a launcher that waits on its workers does.
LAUNCHER = textwrap.dedent("""
    import os, sys, time
    port, mode, pidfile, script = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    child = os.fork()
    if child == 0:
        if mode == "setsid":
            os.setsid()
        if os.fork() != 0:
            os._exit(0)
        with open(pidfile, "w") as fh:
            fh.write(str(os.getpid()))
        os.execv(sys.executable, [sys.executable, "-m", "servelab.calibration.server", "--port", port,
                                  "--default-script", script])
    os.waitpid(child, 0)
    print("launcher: server started", flush=True)
    while True:
        time.sleep(1)
""")


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
    records = read_records(run.parent / "records.jsonl")
    assert len(records) >= 3
    assert all(r.error_kind == "cancelled" and r.output_tokens >= 1 for r in records), records
    assert summary["levels"][0]["cancelled"] == len(records)
    assert "interrupted" in stdout
    assert not list(tmp_path.rglob("*.tmp"))


def start_up(tmp_path: Path, mode: str, extra: list[str] = ()) -> tuple[subprocess.Popen, int, int]:
    """`servelab up command -- python launcher.py …`: servelab, the port, and the double-forked server's pid."""
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER)
    pidfile = tmp_path / "server.pid"
    port = free_port()
    proc = subprocess.Popen([*SERVELAB, "up", "command", "--port", str(port), "--log-dir", str(tmp_path / "logs"),
                             *extra, "--", PY, str(launcher), "{port}", mode, str(pidfile), SLOW.model_dump_json()],
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
        launcher = [p.pid for p in psutil.Process(proc.pid).children() if "launcher.py" in " ".join(p.cmdline())]
        assert launcher, "the launcher is servelab's child"
        assert os.getsid(server) != os.getsid(launcher[0]) if mode == "setsid" else \
            os.getpgid(server) == os.getpgid(launcher[0])
        proc.send_signal(sig)
        stdout, stderr = finish(proc, timeout_s=30)
        if sig == signal.SIGTERM:
            assert proc.returncode == 0, stderr
            assert "stopping" in stdout
        assert wait_gone(server), f"the server outlived {sig.name} of up"
        assert wait_gone(launcher[0]), f"the launcher outlived {sig.name} of up"
        assert not listening(port)
    finally:
        for pid in (server,):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def test_run_stopped_by_sigterm_records_in_flight_and_stops_the_engine_tree(tmp_path: Path):
    """Item 5: `run` of an experiment whose engine is a launcher that double-forks (setsid) its server, sent
    SIGTERM mid-bench: exit 143, the cell's summary says interrupted, the requests in flight are recorded as
    cancelled, and the server and the launcher are gone."""
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER)
    pidfile = tmp_path / "server.pid"
    port = free_port()
    experiment = {"name": "sigterm", "verify": {"enabled": False},
                  "bench": {"single_requests": 4, "warmup": 0, "sweep": False, "max_tokens": 50},
                  "cells": [{"name": "forking", "engine": "command", "model": "calibration", "port": port,
                             "extra_args": [PY, str(launcher), "{port}", "setsid", str(pidfile),
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
        records = read_records(summary_path.parent / "records.jsonl")
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
