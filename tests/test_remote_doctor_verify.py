"""`doctor --on` and `verify --on` through a real sshd: run there, drawn here, with the verdict, the checks and the
exit status a local run gives for the same server at the same moment.

The servers are real processes on this machine (the far side is this machine): the replayed SGLang start-up,
loading or hung in its weights, and the calibration server, ready.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from remote_support import PY, SERVELAB, Run, no_traceback
from test_doctor import replay, stop, wait_until_reading, wait_until_still


@pytest.fixture
def ready_url():
    proc = subprocess.Popen([PY, "-m", "servelab.calibration.server", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        _, host, port = proc.stdout.readline().split()  # "LISTENING host port"
        yield f"http://{host}:{port}"
    finally:
        stop(proc)


def here_and_there(host, tmp_path, args: list[str]) -> tuple[tuple[int, str], Run]:
    """`servelab ARGS…` run here and, at the same time, with --on there: (the local exit status and stdout,
    the remote run, ended)."""
    there = Run([*args, "--on", host.url, "--remote-dir", str(tmp_path / "far")], host.env, tmp_path)
    here = subprocess.run([*SERVELAB, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    there.finish(120)
    return (here.returncode, here.stdout), there


@pytest.mark.slow  # two replays watched through SSH: the ready doctor stays in the default suite
@pytest.mark.parametrize("subject", ["loading", "stalled"])
def test_doctor_there_gives_the_verdict_and_exit_status_doctor_gives_here(ssh_host, tmp_path, subject):
    proc = None
    try:
        # slow-steady at speed 20: half a minute in its weights, long enough for both doctors to watch it
        variant, speed = ("slow-steady", 20) if subject == "loading" else ("hang-in-load", 200)
        proc = replay(tmp_path, speed=speed, variant=variant, log=tmp_path / "engine.log")
        wait_until_reading(proc)
        if subject == "stalled":
            wait_until_still(proc)  # hung at 40 % of the weights, about 0.6 s in on a quiet machine
        # Without stacks: the two doctors watch at once, and each one's py-spy --native pauses the replay's threads,
        # which the other saw as CPU time moving (CI read loading once so); the stacks have tests of their own
        args = ["doctor", "--pid", str(proc.pid), "--seconds", "2", "--no-stacks"]
        want, want_code = subject, 0 if subject == "loading" else 1
        (here_code, here_out), there = here_and_there(ssh_host, tmp_path, [*args, "--json"])
    finally:
        if proc is not None:
            stop(proc)
    here_doc, there_doc = json.loads(here_out), json.loads(there.stdout)
    assert here_doc["verdict"]["state"] == want, here_doc["verdict"]["reason"]
    assert there_doc["verdict"]["state"] == want, there.stdout + there.stderr
    assert (here_code, there.proc.returncode) == (want_code, want_code), there.stderr
    assert there_doc["pid"] == here_doc["pid"] == proc.pid and there_doc["engine"] == here_doc["engine"]
    assert there_doc["verdict"]["evidence"]["phase"] == here_doc["verdict"]["evidence"]["phase"] \
        == "loading weights"
    no_traceback(there.stderr)


def test_doctor_there_of_a_ready_server_is_drawn_here_as_a_local_doctor_draws_it(ssh_host, tmp_path, ready_url):
    (here_code, here_out), there = here_and_there(ssh_host, tmp_path, ["doctor", "--url", ready_url,
                                                                        "--seconds", "1"])
    assert here_code == there.proc.returncode == 0, there.stderr
    assert there.out[0] == here_out.splitlines()[0]
    assert there.out[1].startswith("READY  ") and here_out.splitlines()[1].startswith("READY  ")
    assert "models listed" in there.stdout and "calibration" in there.stdout


def test_verify_there_renders_the_checks_and_exits_as_verify_here(ssh_host, tmp_path, ready_url):
    args = ["verify", ready_url, "--only", "models", "--only", "chat"]
    (here_code, here_out), there = here_and_there(ssh_host, tmp_path, args)
    assert here_code == there.proc.returncode == 0, there.stdout + there.stderr

    def results(text: str) -> dict[str, str]:
        cells = [[c.strip() for c in line.split("│")[1:3]] for line in text.splitlines() if line.startswith("│")]
        return {check: result for check, result in cells if check}

    assert results(there.stdout) == results(here_out) == {"models": "PASS", "chat": "WARN"}
    assert there.out[0] == f"verify {ready_url} (model calibration)"
    assert there.out[-1] == here_out.splitlines()[-1] == "1 pass, 1 warn (2 of 25 checks selected)"
    no_traceback(there.stderr)


@pytest.mark.slow  # a second verify through SSH, for an error line: kept out of the default suite's time
def test_verify_there_of_a_server_nobody_serves_fails_in_the_same_one_line_as_here(ssh_host, tmp_path):
    from servelab.lifecycle.ports import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nobody serves it, there as here
    args = ["verify", url, "--only", "models"]
    there = Run([*args, "--on", ssh_host.url, "--remote-dir", str(tmp_path / "far")], ssh_host.env, tmp_path)
    here = subprocess.run([*SERVELAB, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert there.finish(120) == here.returncode == 2, there.stdout + there.stderr
    errors = [line for line in there.err if line.startswith("error:")]
    assert errors == [line for line in here.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: cannot reach {url}: connection refused (is the server running, and on this port?)"]
    no_traceback(there.stderr)
