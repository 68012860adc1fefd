"""`bench --on` through a real sshd: the client runs there, on through a dropped connection, and its run comes
back into the local --out and store, marked with the host it ran on, checked whole by SHA-256 before it is used;
the API key reaches the server and no file, command line or log.

One bench (module-scoped: it is the slow part), its connection dropped mid-bench, against a server that answers
401 without the key, so a run that completes is one whose every request carried it."""

from __future__ import annotations

import json
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

import ssh_host as harness
from openai_fake import serving
from remote_support import PY, SERVELAB, Run, no_traceback
from test_faults_client import KEY, guarded_llamacpp

from servelab.errors import UserError
from servelab.remote.connection import SshConnection
from servelab.remote.controller import RemoteJob, RemoteOptions
from servelab.remote.target import SshTarget

DURATION_S = 3


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    try:
        started = harness.start_ssh_host(tmp_path_factory.mktemp("sshd"))
    except harness.SshHostUnavailable as e:
        pytest.skip(str(e))
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def bench_there(host, tmp_path_factory):
    """One `bench --on` with --api-key whose connection is dropped mid-bench (it reconnects and goes on): (the
    run, its local out, the far side's root, the ssh argv log, the requests the server saw as (path,
    authorised))."""
    d = tmp_path_factory.mktemp("bench")
    ssh_log = d / "ssh-argv.log"
    ssh = d / "ssh-logging-argv"  # every ssh servelab runs, its command line written down first
    ssh.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {ssh_log}\nexec ssh "$@"\n')
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    env = {**host.env, "SERVELAB_SSH": str(ssh)}
    app, seen = guarded_llamacpp()
    with serving(app) as url:
        started = Run(["bench", url, "--mode", "concurrency", "--concurrency", "1", "--duration", str(DURATION_S),
                       "--warmup", "0", "--max-tokens", "8", "--api-key", KEY, "--out", str(d / "local"), "--on", host.url,
                       "--remote-dir", str(d / "far")], env, d)
        try:
            deadline = time.monotonic() + 60
            while sum(path.endswith("/chat/completions") for path, _ in seen) < 3:  # measuring there, 3 s to go
                assert time.monotonic() < deadline and started.proc.poll() is None, started.stderr
                time.sleep(0.05)
            assert host.kill_sessions()
            code = started.finish(120)
        finally:
            started.kill()
    assert code == 0, started.stdout + started.stderr
    return started, d / "local", d / "far", ssh_log, seen


def test_the_run_comes_back_into_the_local_out_and_store_after_a_drop_mid_bench(bench_there, host):
    started, local, far, _, _ = bench_there
    copied = [line for line in started.err if line.startswith("remote: copied ")]
    assert len(copied) == 1, started.stderr
    run_id = copied[0].split()[2]
    assert copied[0] == f"remote: copied {run_id} back to {local / run_id} and stored it in {local / 'servelab.db'}"
    listed = subprocess.run([*SERVELAB, "runs", "--out", str(local), "--json"], capture_output=True, text=True,
                            timeout=60)
    runs = json.loads(listed.stdout)
    assert [(r["run_id"], r["status"], r["run_dir"]) for r in runs] == [(run_id, "complete", str(local / run_id))]
    shown = subprocess.run([*SERVELAB, "show", run_id, "--out", str(local), "--json"], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["provenance"]["ran_on"] == host.url
    human = subprocess.run([*SERVELAB, "show", run_id, "--out", str(local)], capture_output=True, text=True,
                           timeout=60)
    assert f"ran on: {host.url} ({doc['provenance']['host']['hostname']})" in human.stdout, human.stdout
    ((sent, ok),) = [(level["requests"], level["ok"]) for level in doc["sweep"]["levels"]]
    assert sent == ok > 3
    from servelab.store.rundir import iter_records, records_file

    assert len(list(iter_records(records_file(local / run_id)))) == sent
    # The bench went on there while the link was down; this side picked it up again.
    assert any("dropped; reconnecting" in line for line in started.err), started.stderr
    assert any(line.startswith("remote: reconnected to") for line in started.err), started.stderr
    # What the far side wrote is what came back, byte for byte.
    (there,) = far.glob(f"*/results/{run_id}")
    for name in ("summary.json", "records.jsonl.gz"):
        assert (local / run_id / name).read_bytes() == (there / name).read_bytes()
    no_traceback(started.stderr)


def test_the_run_json_names_the_host_it_ran_on(bench_there, host):
    started, local, _, _, _ = bench_there
    (run_json,) = local.glob("*/run.json")
    assert json.loads(run_json.read_text())["provenance"]["ran_on"] == host.url


def test_the_api_key_reached_the_server_and_nothing_else(bench_there, host):
    started, local, far, ssh_log, seen = bench_there
    assert seen and all(ok for _path, ok in seen)  # every request carried it
    assert any(path.endswith("/chat/completions") for path, _ in seen)
    secret = KEY.encode()
    leaks = [str(path) for root in (far, local) for path in root.rglob("*")
             if path.is_file() and secret in path.read_bytes()]
    assert leaks == []
    (job,) = far.iterdir()
    assert (job / "job.json").is_file() and (job / "events.jsonl").is_file()  # looked into, and clean
    assert "--api-key" not in json.loads((job / "job.json").read_text())["argv"]
    commands = ssh_log.read_text()
    assert "remote start" in commands and "remote pack" in commands and KEY not in commands
    assert KEY not in host.log_path.read_text()
    assert KEY not in started.stdout + started.stderr


def _tampering_python(path: Path, filter_cmd: str) -> Path:
    """An interpreter for --remote-python whose `remote pack` output goes through `filter_cmd` on its way."""
    path.write_text("#!/bin/sh\n"
                    'case "$*" in\n'
                    f'  *"remote pack"*) {PY} "$@" | {filter_cmd}; exit 0;;\n'
                    "esac\n"
                    f'exec {PY} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def far_job(tmp_path):
    job = tmp_path / "job"
    (job / "results" / "run-1").mkdir(parents=True)
    (job / "results" / "run-1" / "summary.json").write_text('{"figure": "hello world"}\n' * 100)
    (job / "results" / "run-1" / "notes.txt").write_text("measured\n")
    return job


@pytest.mark.parametrize(("filter_cmd", "refusal"), [
    (None, None),
    ("sed 's/hello world/HELLO WORLD/'", "run-1/summary.json copied from {url} does not match its SHA-256: not used"),
    ("head -c 3000", "the copy from the far side broke off"),
], ids=["whole", "altered", "cut-short"])
def test_a_copy_altered_or_cut_short_on_its_way_is_refused_before_use(host, tmp_path, far_job, monkeypatch,
                                                                     filter_cmd, refusal):
    monkeypatch.setenv("SERVELAB_SSH_CONFIG", host.env["SERVELAB_SSH_CONFIG"])
    options = RemoteOptions(remote_python=str(_tampering_python(tmp_path / "py", filter_cmd)) if filter_cmd
                            else PY)
    into = tmp_path / "here"
    with SshConnection.open(SshTarget.parse(host.url)) as conn:
        job = RemoteJob(conn=conn, options=options, dir=str(far_job), pid=0)
        if refusal is None:
            assert job.fetch("results", into) == ["run-1/notes.txt", "run-1/summary.json"]
            assert (into / "run-1" / "summary.json").read_bytes() == \
                (far_job / "results" / "run-1" / "summary.json").read_bytes()
            return
        with pytest.raises(UserError) as refused:
            job.fetch("results", into)
    assert refused.value.message.startswith(refusal.format(url=host.url)), refused.value.message
    assert not into.exists()  # nothing of it kept
    assert not any(p.name.endswith(".incoming") for p in tmp_path.iterdir())


def test_ctrl_c_mid_bench_there_keeps_what_was_measured_here(host, tmp_path):
    app, seen = guarded_llamacpp()
    local = tmp_path / "local"
    with serving(app) as url:
        started = Run(["bench", url, "--mode", "concurrency", "--concurrency", "1", "--duration", "30", "--warmup",
                       "0", "--max-tokens", "8", "--api-key", KEY, "--out", str(local), "--on", host.url, "--remote-dir",
                       str(tmp_path / "far")], host.env, tmp_path)
        try:
            deadline = time.monotonic() + 60
            while sum(path.endswith("/chat/completions") for path, _ in seen) < 5:
                assert time.monotonic() < deadline and started.proc.poll() is None, started.stderr
                time.sleep(0.05)
            started.interrupt()
            code = started.finish(60)
        finally:
            started.kill()
    assert code == 130, started.stdout + started.stderr
    (run_json,) = local.glob("*/run.json")
    summary = json.loads(run_json.read_text())
    assert summary["status"] == "interrupted" and summary["provenance"]["ran_on"] == host.url
    from servelab.store.rundir import iter_records, records_file

    kept = list(iter_records(records_file(run_json.parent)))  # the request Ctrl-C cancelled in flight among them
    assert len(kept) >= 5
    levels = json.loads((run_json.parent / "summary.json").read_text())["levels"]
    assert [level["requests"] for level in levels] == [len(kept)]
    listed = subprocess.run([*SERVELAB, "runs", "--out", str(local), "--json"], capture_output=True, text=True,
                            timeout=60)
    assert [r["status"] for r in json.loads(listed.stdout)] == ["interrupted"]
    no_traceback(started.stderr)


def test_a_connection_dropped_during_the_copy_back_is_reconnected_and_the_copy_made_again(host, tmp_path, far_job,
                                                                                         monkeypatch):
    monkeypatch.setenv("SERVELAB_SSH_CONFIG", host.env["SERVELAB_SSH_CONFIG"])
    slow_pack = _tampering_python(tmp_path / "py", "cat")
    slow_pack.write_text(slow_pack.read_text().replace('*"remote pack"*) ', '*"remote pack"*) sleep 2; '))
    notes: list[str] = []
    into = tmp_path / "here"
    with SshConnection.open(SshTarget.parse(host.url)) as conn:
        job = RemoteJob(conn=conn, options=RemoteOptions(remote_python=str(slow_pack), grace_s=20), dir=str(far_job),
                        pid=0)
        dropper = threading.Timer(1.0, host.kill_sessions)  # while the first copy is under way
        dropper.start()
        try:
            copied = job.fetch("results", into, on_note=notes.append)
        finally:
            dropper.join()
    assert copied == ["run-1/notes.txt", "run-1/summary.json"]
    assert (into / "run-1" / "summary.json").read_bytes() == \
        (far_job / "results" / "run-1" / "summary.json").read_bytes()
    assert any("dropped; reconnecting" in n for n in notes) and any(n.startswith("reconnected") for n in notes)


def test_a_ctrl_c_right_after_the_job_started_there_stops_it_there(host, tmp_path, monkeypatch):
    """Ctrl-C in the moment between `remote start` answering and the follow beginning (here: as the "running on"
    line prints) is a stop the follow sends at once, not a KeyboardInterrupt that leaves the job running there."""
    import io
    import os
    import signal

    from rich.console import Console

    from servelab.calibration import Script, start_calibration_server
    from servelab.remote.commands import run_remote

    monkeypatch.setenv("SERVELAB_SSH_CONFIG", host.env["SERVELAB_SSH_CONFIG"])

    class CtrlCOnRunning(io.StringIO):
        def write(self, text: str) -> int:
            if "remote: running on" in text:
                os.kill(os.getpid(), signal.SIGINT)  # the handler runs before this write returns
            return super().write(text)

    err = CtrlCOnRunning()
    with start_calibration_server(Script(ttft_ms=5, itl_ms=5, output_tokens=8)) as cal:
        started = time.monotonic()
        code, job, _, _ = run_remote(host.url, ["bench", cal.url, "--mode", "concurrency", "--concurrency", "1",
                                                "--duration", "60", "--warmup", "0", "--max-tokens", "8"],
                                     RemoteOptions(remote_dir=str(tmp_path / "far"), grace_s=20),
                                     Console(file=io.StringIO()), Console(file=err, width=200))
        took = time.monotonic() - started
    assert code == 130, err.getvalue()
    assert took < 40, took  # stopped there at once, not after its 60 s level
    assert "remote: running on" in err.getvalue()
