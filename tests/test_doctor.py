"""`servelab doctor` with less than a log: a ready server by its URL alone or its pid alone, a URL nobody serves,
a pid that does not exist, and the replayed SGLang start-up loading and hung, judged without being given its log.

The servers are real processes: the calibration server (a ready OpenAI-compatible server) and the replay engine
(servelab/engines/replay.py), started here as a user would start them, outside servelab's supervisor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from servelab.lifecycle.doctor import diagnose, listening_urls, output_file
from servelab.lifecycle.ports import free_port
from servelab.models import resolve_model

PY = sys.executable
SERVELAB = [PY, "-m", "servelab.cli"]


def stop(proc: subprocess.Popen) -> None:
    for child in psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []:
        child.kill()
    proc.kill()
    proc.wait(timeout=30)


@pytest.fixture
def ready_server():
    """The calibration server on a free port: (process, url)."""
    proc = subprocess.Popen([PY, "-m", "servelab.calibration.server", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()  # "LISTENING host port"
        _, host, port = line.split()
        yield proc, f"http://{host}:{port}"
    finally:
        stop(proc)


def replay(tmp_path: Path, *, speed: float, variant: str = "normal", log: Path | None = None) -> subprocess.Popen:
    """The replayed SGLang tp=8 start-up, its output to `log` (or nowhere: no log to find)."""
    port = free_port()
    out = open(log, "wb") if log else subprocess.DEVNULL
    try:
        return subprocess.Popen([PY, "-m", "servelab.engines.replay", "--script", "sglang-tp8", "--speed", str(speed),
                                 "--variant", variant, "--port", str(port), "--model-file",
                                 str(resolve_model("smollm2").path)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    finally:
        if log:
            out.close()


def wait_until_reading(proc: subprocess.Popen, timeout_s: float = 60) -> None:
    """Until the replay reads its model file: it is loading weights."""
    deadline = time.monotonic() + timeout_s
    first = psutil.Process(proc.pid).io_counters().read_chars
    while time.monotonic() < deadline:
        if psutil.Process(proc.pid).io_counters().read_chars > first + 4 * 2**20:
            return
        time.sleep(0.1)
    raise AssertionError("the replay never started loading weights")


def wait_until_still(proc: subprocess.Popen, still_s: float = 0.5, timeout_s: float = 60) -> None:
    """Until the replay's tree has read nothing and spent no CPU time for `still_s`: it reached its hang (a fixed
    sleep is not enough on a busy machine, where a replay still short of it reads or computes on into doctor's
    window and is rightly called loading)."""
    def counters() -> tuple[int, float]:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        reads, cpu = 0, 0.0
        for p in tree:
            try:
                reads += p.io_counters().read_chars
                times = p.cpu_times()
                cpu += times.user + times.system
            except psutil.NoSuchProcess:
                pass
        return reads, round(cpu, 2)

    deadline = time.monotonic() + timeout_s
    last, since = counters(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = counters()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= still_s:
            return
    raise AssertionError("the replay never stopped reading its weights and computing")


def doctor_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SERVELAB, "doctor", *args], capture_output=True, text=True, timeout=120)


def test_a_ready_server_by_its_url_alone_is_ready_whatever_its_log_says(ready_server, tmp_path):
    proc, url = ready_server
    d = diagnose(url=url, seconds=1)
    assert d.verdict.state == "ready", d.verdict.reason
    assert d.verdict.evidence["models"] == ["calibration"]
    assert d.pid == proc.pid  # the listener of the URL's port
    # A log that says the server is still loading weights changes nothing: it answers, it is ready.
    log = tmp_path / "stale.log"
    log.write_text("[2026-11-29 14:00:10 TP0] Load weight begin. avail mem=138.72 GB\n")
    d = diagnose(url=url, log=log, seconds=1)
    assert d.verdict.state == "ready" and "GET /health answered 200" in d.verdict.reason


def test_a_ready_server_by_its_pid_alone_is_found_on_its_listening_port(ready_server):
    proc, url = ready_server
    assert listening_urls(proc.pid) == [url]
    d = diagnose(pid=proc.pid, seconds=1)
    assert d.verdict.state == "ready", d.verdict.reason
    assert d.url == url
    assert any("found from the process's listening sockets" in n for n in d.notes)
    done = doctor_cli("--pid", str(proc.pid), "--seconds", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[1].startswith("READY")
    assert "models listed" in done.stdout and "calibration" in done.stdout


def test_a_url_nobody_serves_is_not_running_and_exits_1():
    url = f"http://127.0.0.1:{free_port()}"
    done = doctor_cli("--url", url, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    d = json.loads(done.stdout)
    assert d["verdict"]["state"] == "not running" and "connection refused" in d["verdict"]["reason"]
    human = doctor_cli("--url", url)
    assert human.returncode == 1 and "NOT RUNNING" in human.stdout


def test_a_pid_that_does_not_exist_is_no_such_process_and_exits_1():
    pid = 4_000_000  # above the kernel's pid_max ceiling (2^22): never a process
    done = doctor_cli("--pid", str(pid))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "NO SUCH PROCESS" in done.stdout and f"pid {pid}" in done.stdout
    assert "CRASHED" not in done.stdout and "STARTING" not in done.stdout


def test_the_replay_loading_by_pid_alone_its_log_found_from_its_output(tmp_path):
    log = tmp_path / "sglang.log"
    proc = replay(tmp_path, speed=20, log=log)
    try:
        wait_until_reading(proc)
        assert output_file(proc.pid) == log
        d = diagnose(pid=proc.pid, seconds=2)
    finally:
        stop(proc)
    assert d.engine == "replay-sglang" and d.log_path == str(log)
    assert d.verdict.state == "loading", d.verdict.reason
    assert d.verdict.evidence["phase"] == "loading weights" and d.verdict.evidence["progress"] is not None
    assert any("listens on no TCP port" in n for n in d.notes)  # SGLang's port stays closed while it loads


def test_the_replay_loading_without_any_log_is_loading_from_its_counters(tmp_path):
    proc = replay(tmp_path, speed=20)
    try:
        wait_until_reading(proc)
        assert output_file(proc.pid) is None  # its output goes nowhere
        d = diagnose(pid=proc.pid, seconds=2)
    finally:
        stop(proc)
    assert d.log_path is None
    assert d.verdict.state == "loading", d.verdict.reason
    assert d.verdict.evidence["phase"] == "unknown (no log)"
    assert "read bytes" in d.verdict.evidence["moving"]
    assert "log lines" not in d.verdict.evidence["still_for_s"]  # there are none to count
    assert d.verdict.evidence["threads_in_futex"] >= 100  # idle loader threads do not make it hung


@pytest.mark.parametrize("with_log", [False, True], ids=["no-log", "log-found"])
def test_the_replay_hung_in_load_is_stalled_without_being_given_its_log(tmp_path, with_log):
    proc = replay(tmp_path, speed=200, variant="hang-in-load", log=tmp_path / "hang.log" if with_log else None)
    try:
        wait_until_reading(proc)
        wait_until_still(proc)  # hung at 40 % of the weights, about 0.6 s in on a quiet machine
        done = doctor_cli("--pid", str(proc.pid), "--seconds", "3", "--json")
    finally:
        stop(proc)
    assert done.returncode == 1, done.stdout + done.stderr
    d = json.loads(done.stdout)
    assert d["verdict"]["state"] == "stalled", d["verdict"]["reason"]
    assert d["verdict"]["evidence"]["quiet_s"] >= d["verdict"]["evidence"]["budget_s"]
    assert d["verdict"]["evidence"]["eta_s"] is None  # nothing moves: no ETA
    if with_log:
        assert d["verdict"]["evidence"]["phase"] == "loading weights"
    else:
        assert d["verdict"]["evidence"]["phase"] == "unknown (no log)"


# --------------------------------------------------------------------------------------------------------------
# The stacks: doctor reads and names them whenever there is a process (tests/stack_programs/tree.py)
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("mode", "verdict", "summary"), [
    ("loading", "loading", "4 of 4 ranks loading weights (safetensors), stacks moving: loading, not hung"),
    ("idle", "idle", "4 of 4 ranks idle in the request loop (recv_requests): idle"),
    ("busy", "busy", "4 of 4 ranks running a batch (run_batch), stacks moving: busy"),
    ("deadlock", "deadlock", "ranks 0-2 in broadcast (torch.distributed), rank 3 in all_reduce (torch.distributed): "
                             "ranks disagree on the collective"),
])
def test_doctor_names_what_a_tree_of_ranks_is_doing_from_its_stacks(mode, verdict, summary):
    from tests.test_stacks import engine_tree

    with engine_tree(mode) as (proc, _):
        t0 = time.monotonic()
        d = diagnose(pid=proc.pid, engine="sglang", seconds=1.5)
        took = time.monotonic() - t0
    assert d.stack_report is not None and d.stack_report.verdict == verdict, d.stack_report
    assert d.stack_report.summary.startswith(summary)
    assert {p.role for p in d.stack_report.processes} >= {"TP0 scheduler", "TP3 scheduler", "detokenizer"}
    assert d.stacks is None  # the raw dump only with --stacks
    assert took < 1.5 + 2.5  # read alongside the window, not after it


def test_a_stall_names_what_the_stacks_showed(tmp_path):
    """A log silent for longer than the weights' budget, processes that do not move: stalled, and the reason ends
    with the stacks' summary (the ranks disagree on the collective)."""
    from tests.test_stacks import engine_tree

    log = tmp_path / "sglang.log"
    log.write_text("[2026-11-29 14:00:10 TP0] Load weight begin. avail mem=138.72 GB\n")
    long_ago = time.time() - 3 * 3600
    os.utime(log, (long_ago, long_ago))
    with engine_tree("deadlock") as (proc, _):
        done = doctor_cli("--pid", str(proc.pid), "--log", str(log), "--engine", "sglang", "--seconds", "2", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    d = json.loads(done.stdout)
    assert d["verdict"]["state"] == "stalled", d["verdict"]["reason"]
    assert d["verdict"]["reason"].endswith("; the stacks: " + d["stack_report"]["summary"])
    assert "ranks disagree on the collective" in d["stack_report"]["summary"]
    assert d["verdict"]["evidence"]["stacks"] == d["stack_report"]["summary"]
    assert d["stack_report"]["verdict"] == "deadlock"


def test_doctor_shows_the_activities_by_default_the_dump_with_stacks_and_nothing_with_no_stacks():
    from tests.test_stacks import engine_tree

    with engine_tree("idle", ranks=2) as (proc, _):
        shown = doctor_cli("--pid", str(proc.pid), "--engine", "sglang", "--seconds", "1")
        raw = doctor_cli("--pid", str(proc.pid), "--engine", "sglang", "--seconds", "1", "--stacks")
        skipped = doctor_cli("--pid", str(proc.pid), "--engine", "sglang", "--seconds", "1", "--no-stacks", "--json")
    assert "stacks" in shown.stdout and "2 of 2 ranks idle in the request loop (recv_requests)" in shown.stdout
    assert "TP1 scheduler (pid " in shown.stdout and "Thread " not in shown.stdout
    assert "Thread " in raw.stdout and "Scheduler.recv_requests (sglang/srt/managers/scheduler.py:" in raw.stdout
    d = json.loads(skipped.stdout)
    assert d["stack_report"] is None and d["stacks"] is None


def test_a_ready_server_whose_ranks_look_deadlocked_says_so_and_exits_1(tmp_path):
    """The replayed SGLang hung in decode answers /health 200 while its ranks disagree on a collective: ready by
    its probe, but the reason says the ranks look deadlocked, the evidence holds the stacks, doctor exits 1."""
    import http.client
    import threading
    import urllib.request

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([PY, "-m", "servelab.engines.replay", "--script", "sglang-tp8", "--speed", "200",
                             "--variant", "hang-in-decode", "--port", str(port), "--model-file",
                             str(resolve_model("smollm2").path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        ready = diagnose(pid=proc.pid, url=url)
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                           "max_tokens": 8}).encode()

        def stream() -> None:
            request = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10) as r:
                    r.read()
            except (OSError, http.client.HTTPException):
                pass  # it hangs, and the test's end cuts it: that is the point

        threading.Thread(target=stream, daemon=True).start()
        time.sleep(1.5)
        t0 = time.monotonic()
        d = diagnose(pid=proc.pid, url=url)
        took = time.monotonic() - t0
        done = doctor_cli("--pid", str(proc.pid), "--url", url)
    finally:
        stop(proc)
    # before the request: ready and idle, and the idle sentence only then
    assert ready.verdict.state == "ready" and ready.stack_report.verdict == "idle", ready.stack_report.summary
    assert ready.verdict.reason.endswith("idle threads are normal for a server waiting for requests")
    assert d.verdict.state == "ready", d.verdict.reason
    assert d.stack_report.verdict == "deadlock", d.stack_report.summary
    assert "it answers /health but its ranks look deadlocked: " + d.stack_report.summary in d.verdict.reason
    assert "idle threads are normal" not in d.verdict.reason
    assert d.verdict.evidence["stacks"] == d.stack_report.summary
    assert d.stack_report.samples == 2 and took < 3.0  # ready at once: two samples 0.5 s apart (1.6 s here), not 3.9 s
    assert done.returncode == 1, done.stdout + done.stderr
    assert "look deadlocked" in done.stdout
