"""Faults around any engine: one that exits at once (its stderr shown), the generic command engine end to end,
and `servelab doctor` on the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servelab.engines import EngineSpec
from servelab.errors import EngineFailed
from servelab.lifecycle.launch import start_engine

PY = sys.executable
SERVELAB = [PY, "-m", "servelab.cli"]


def test_an_engine_that_exits_at_once_shows_its_stderr(tmp_path):
    code = "import sys; sys.stderr.write('error: unrecognized arguments: --tensor-paralel-size 8\\n'); sys.exit(2)"
    with pytest.raises(EngineFailed) as info:
        start_engine(EngineSpec(engine="command", model="-", extra_args=[PY, "-c", code]), tmp_path,
                     ready_timeout_s=60)
    failure = info.value
    assert failure.engine_exit_code == 2
    assert "exit code 2" in failure.message
    assert "unrecognized arguments: --tensor-paralel-size 8" in failure.message
    assert failure.log_tail == ["error: unrecognized arguments: --tensor-paralel-size 8"]
    assert failure.launch_result.verdict.state == "crashed"


def test_the_command_engine_runs_any_server(tmp_path):
    (tmp_path / "www").mkdir()
    spec = EngineSpec(engine="command", model="-",
                      extra_args=[PY, "-u", "-m", "http.server", "{port}", "--bind", "{host}", "--directory",
                                  str(tmp_path / "www")],
                      options={"probe_path": "/", "ready_regex": "Serving HTTP on", "phase.serving": "Serving HTTP"})
    with start_engine(spec, tmp_path, ready_timeout_s=60) as running:
        assert running.result().verdict.state == "ready"
        assert running.adapter.title.startswith("command (")
        assert [p.name for p in running.phases][-1] == "ready"


def test_doctor_needs_something_to_look_at():
    done = subprocess.run([*SERVELAB, "doctor"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "at least one of --pid, --log, --url" in done.stderr


def test_doctor_on_a_process_that_is_gone(tmp_path):
    proc = subprocess.Popen([PY, "-c", "pass"])
    proc.wait()
    log = tmp_path / "engine.log"
    log.write_text("[2026-11-29 14:00:10 TP0] Load weight begin. avail mem=138.72 GB\n"
                   "Rank 3 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a "
                   "common cause is the OS OOM killer.\n")
    done = subprocess.run([*SERVELAB, "doctor", "--pid", str(proc.pid), "--log", str(log), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    import json

    diagnosis = json.loads(done.stdout)
    assert diagnosis["verdict"]["state"] == "crashed"
    assert diagnosis["engine"] == "sglang"  # recognised from its log
    assert "Rank 3 scheduler died" in diagnosis["verdict"]["reason"]


def test_doctor_on_a_silent_log_of_a_live_process_with_stacks(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("[2026-11-29 14:00:10 TP0] Load weight begin. avail mem=138.72 GB\n")
    proc = subprocess.Popen(["sleep", "60"])
    try:
        done = subprocess.run([*SERVELAB, "doctor", "--pid", str(proc.pid), "--log", str(log), "--seconds", "1",
                               "--stacks"], capture_output=True, text=True, timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert done.returncode == 0, done.stdout + done.stderr  # written just now: within any budget
    assert "LOADING" in done.stdout and "loading weights" in done.stdout
    assert "py-spy" in done.stdout  # its dump, or how to install it
    assert Path(log).exists()
