"""The supervisor: process groups, log capture, a clean stop, parent-death signal, log tails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from servelab.lifecycle.supervisor import signal_name, start_process

PY = sys.executable


def wait_for_log(log: Path, needle: str, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if needle in text:
            return text
        time.sleep(0.02)
    raise AssertionError(f"{needle!r} never appeared in {log}")


def is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if is_gone(pid):
            return True
        time.sleep(0.02)
    return is_gone(pid)


def test_output_env_and_own_process_group(tmp_path):
    log = tmp_path / "engine.log"
    code = "import os, sys, time; print(os.environ['SERVELAB_T']); print('to stderr', file=sys.stderr, flush=True); " \
           "time.sleep(30)"
    proc = start_process([PY, "-c", code], log, env={"SERVELAB_T": "from-additions"})
    try:
        text = wait_for_log(log, "to stderr")
        assert "from-additions" in text  # stdout and stderr both land in the log; env additions reach the child
        assert proc.pgid == proc.pid == os.getpgid(proc.pid)
        assert os.getpgid(proc.pid) != os.getpgid(0)  # not in servelab's group: a terminal Ctrl-C does not reach it
        assert proc.group_pids() == [proc.pid]
        assert proc.returncode is None and proc.describe_exit() == "still running"
    finally:
        proc.stop(grace_s=5)
    assert proc.exit_signal == "SIGTERM"
    assert not proc.group_alive()


def test_stop_ends_every_process_of_the_group(tmp_path):
    log = tmp_path / "engine.log"
    proc = start_process(["sh", "-c", "sleep 60 & sleep 60 & echo started; wait"], log)
    wait_for_log(log, "started")
    members = proc.group_pids()
    assert len(members) == 3  # the shell and its two sleeps
    proc.stop(grace_s=5)
    assert not proc.group_alive()
    assert all(is_gone(pid) for pid in members)  # gone, or a zombie waiting for init to reap it


def test_stop_escalates_to_sigkill_after_the_grace(tmp_path):
    log = tmp_path / "engine.log"
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ignoring', flush=True); " \
           "time.sleep(60)"
    proc = start_process([PY, "-c", code], log)
    wait_for_log(log, "ignoring")
    began = time.monotonic()
    proc.stop(grace_s=0.5)
    took = time.monotonic() - began
    assert proc.exit_signal == "SIGKILL"
    assert proc.describe_exit() == "killed by SIGKILL"
    assert 0.5 <= took < 5
    assert not proc.group_alive()


def test_stop_reaches_a_descendant_that_left_the_group(tmp_path):
    log = tmp_path / "engine.log"
    code = textwrap.dedent("""
        import subprocess, time
        child = subprocess.Popen(["sleep", "60"], start_new_session=True)
        print("escaped", child.pid, flush=True)
        time.sleep(60)
    """)
    proc = start_process([PY, "-c", code], log)
    text = wait_for_log(log, "escaped")
    escaped = int(text.split("escaped")[1].split()[0])
    assert os.getpgid(escaped) != proc.pgid
    proc.stop(grace_s=5)
    assert wait_gone(escaped)


def test_engine_gets_sigterm_when_servelab_is_sigkilled(tmp_path):
    log = tmp_path / "engine.log"
    # A stand-in for servelab: it starts the engine through the supervisor, then is SIGKILLed (no cleanup runs).
    servelab_stand_in = textwrap.dedent(f"""
        import time
        from servelab.lifecycle.supervisor import start_process
        p = start_process(["sleep", "60"], {str(log)!r})
        print(p.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([PY, "-c", servelab_stand_in], stdout=subprocess.PIPE, text=True)
    try:
        engine_pid = int(parent.stdout.readline())
        assert not is_gone(engine_pid)
        parent.kill()
        parent.wait(5)
        assert wait_gone(engine_pid), "the engine outlived its SIGKILLed parent"
    finally:
        parent.kill()
        parent.stdout.close()


def test_normal_exit_code(tmp_path):
    proc = start_process([PY, "-c", "import sys; sys.exit(3)"], tmp_path / "e.log")
    assert proc.wait(10) == 3
    proc.stop(grace_s=5)  # stopping a process that already exited is fine
    assert proc.returncode == 3
    assert proc.exit_signal is None
    assert proc.describe_exit() == "exit code 3"


def test_log_tail_splits_on_cr_and_lf_and_survives_bad_utf8(tmp_path):
    log = tmp_path / "engine.log"
    log.write_bytes(b"a line from an earlier run\n")  # the log is appended to: the tail must not show this
    payload = b"one\ntwo\r 10%|#    | 1/10\r 20%|##   | 2/10\r\n\xff\xfe broken utf-8\nlast line without newline"
    code = f"import sys; sys.stdout.buffer.write({payload!r}); sys.stdout.flush()"
    proc = start_process([PY, "-c", code], log)
    assert proc.wait(10) == 0
    assert proc.log_tail(3) == [" 20%|##   | 2/10", "\ufffd\ufffd broken utf-8", "last line without newline"]
    assert proc.log_tail(100)[0] == "one"  # only this process's output, blank pieces of \r\n dropped
    assert len(proc.log_tail(100)) == 6
    assert proc.log_tail(0) == []


def test_log_tail_of_a_long_log_reads_only_the_end(tmp_path):
    log = tmp_path / "engine.log"
    code = "import sys\nfor i in range(200000): sys.stdout.write(f'line {i}\\n')"
    proc = start_process([PY, "-c", code], log)
    assert proc.wait(20) == 0
    assert proc.log_tail(5) == [f"line {i}" for i in range(199995, 200000)]


def test_signal_name():
    assert signal_name(-9) == "SIGKILL"
    assert signal_name(-15) == "SIGTERM"
    assert signal_name(0) is None
    assert signal_name(None) is None
    assert signal_name(-signal.SIGSEGV) == "SIGSEGV"
