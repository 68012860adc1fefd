"""What `--on` refuses, each in one line with exit 2, before anything runs there: a remote servelab speaking
another remote protocol, no servelab there, a changed or unknown host key; and a remote disk that is full from the
start or fills during the run."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from remote_support import PY, READY, Run, health, no_traceback, run, wait_gone

from servelab import __version__


def up_args(host, far: Path, *extra: str) -> list[str]:
    return ["up", "replay-sglang", "--option", "speed=300", "--on", host.url, "--remote-dir", str(far), *extra]


def one_error(started: Run) -> str:
    """The run's only error line, with no traceback around it."""
    errors = [line for line in started.err if line.startswith("error:")]
    assert len(errors) == 1, started.stderr
    no_traceback(started.stderr)
    return errors[0]


def _speaking(path: Path, protocol: int, version: str) -> Path:
    """A servelab that is the real one in all but what `remote hello` says."""
    path.write_text("#!/bin/sh\n"
                    'if [ "$*" = "-m servelab.cli remote hello" ]; then\n'
                    f'  echo \'{{"protocol": {protocol}, "version": "{version}", "python": "x", "host": "h", '
                    '"pid": 1}\'\n'
                    "  exit 0\n"
                    "fi\n"
                    f'exec {PY} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_remote_servelab_of_another_protocol_is_refused_and_nothing_starts(ssh_host, tmp_path):
    wrapper = _speaking(tmp_path / "python-speaking-999", 999, "9.9.9")
    far = tmp_path / "far"
    code, started = run(up_args(ssh_host, far, "--remote-python", str(wrapper)), ssh_host.env, tmp_path)
    assert code == 2, started.stdout + started.stderr
    assert one_error(started) == (f"error: the remote servelab 9.9.9 speaks remote protocol 999, this servelab "
                                  f"{__version__} speaks 1: upgrade this machine's servelab")
    assert not far.exists() and started.out == []
    assert wait_gone(ssh_host, 5) == []


def test_another_version_speaking_the_same_protocol_is_driven_with_a_warning(ssh_host, tmp_path):
    wrapper = _speaking(tmp_path / "python-of-another-version", 1, "9.9.9")
    url = "http://127.0.0.1:9"  # nobody serves it: doctor there says so, exit 1, as here
    code, started = run(["doctor", "--url", url, "--seconds", "1", "--on", ssh_host.url, "--remote-python",
                         str(wrapper), "--remote-dir", str(tmp_path / "far")], ssh_host.env, tmp_path)
    assert code == 1, started.stdout + started.stderr
    assert f"remote: the remote servelab is 9.9.9, this one {__version__} (same remote protocol 1: going on)" \
        in started.err
    assert "NOT RUNNING" in started.stdout
    no_traceback(started.stderr)


def test_no_servelab_there_says_how_to_install_it(ssh_host, tmp_path):
    code, started = run(up_args(ssh_host, tmp_path / "far", "--remote-python", "/nonexistent/python"),
                        ssh_host.env, tmp_path)
    assert code == 2, started.stdout + started.stderr
    assert one_error(started) == (
        f"error: servelab is not installed on {ssh_host.url} (no `/nonexistent/python -m servelab`) (install it "
        "there (pip install servelab, in the environment the engines run in), or pass --remote-python PATH naming "
        "an interpreter that has it)")
    assert not (tmp_path / "far").exists()


def test_a_changed_host_key_is_refused_in_one_line(ssh_host_changed_key, tmp_path):
    host = ssh_host_changed_key
    code, started = run(up_args(host, tmp_path / "far"), host.env, tmp_path)
    assert code == 2, started.stdout + started.stderr
    line = one_error(started)
    assert line.startswith(f"error: the host key of {host.url} has CHANGED since it was accepted: refused"), line
    assert f"ssh-keygen -R '[127.0.0.1]:{host.port}'" in line
    assert started.out == [] and not (tmp_path / "far").exists()
    assert "Starting session" not in host.log_path.read_text()


def test_an_unknown_host_key_is_refused_in_one_line(ssh_host_unknown_key, tmp_path):
    host = ssh_host_unknown_key
    code, started = run(["doctor", "--url", "http://127.0.0.1:9", "--on", host.url], host.env, tmp_path)
    assert code == 2, started.stdout + started.stderr
    line = one_error(started)
    assert line.startswith(f"error: the host key of {host.url} is not in known_hosts: refused"), line
    assert f"ssh-keyscan -p {host.port} 127.0.0.1" in line
    assert started.out == []


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs, filled but for `leave` bytes by each `fill(leave)`; skipped where mounting is not permitted."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True,
                          text=True, timeout=20)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip() or done.returncode}")

    fillers = iter(range(1000))

    def fill(leave: int) -> Path:
        free = os.statvfs(mount)
        with open(mount / f"filler-{next(fillers)}", "wb") as f:  # a new one: truncating the last would free it
            f.write(b"\0" * max(0, free.f_bavail * free.f_frsize - leave))
        return mount

    try:
        yield fill
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=20)


def test_a_full_remote_disk_refuses_the_start_in_one_line(ssh_host, tmp_path, small_disk):
    far = small_disk(0) / "jobs"
    code, started = run(up_args(ssh_host, far), ssh_host.env, tmp_path)
    assert code == 2, started.stdout + started.stderr
    line = one_error(started)
    assert line.startswith(f"error: could not start servelab on {ssh_host.url}: cannot create the job directory "
                           f"{far}/"), line
    assert line.endswith(": No space left on device"), line
    assert wait_gone(ssh_host, 5) == []


def test_a_remote_disk_filling_mid_start_up_ends_it_in_one_line_with_the_engine_stopped(ssh_host, tmp_path,
                                                                                       small_disk):
    far = small_disk(512 * 1024) / "jobs"  # room to start; filled once the weights load
    started = Run(["up", "replay-sglang", "--option", "speed=50", "--on", ssh_host.url, "--remote-dir", str(far)],
                  ssh_host.env, tmp_path)
    try:
        started.wait_for("loading weights", timeout=60)
        small_disk(0)
        code = started.finish(60)
    finally:
        started.kill()
    assert code == 2, started.stdout + started.stderr
    line = one_error(started)
    assert line.startswith(f"error: on {ssh_host.url}: the remote servelab ended without its exit line, and the "
                           f"disk of {far}/"), line
    assert "is full" in line
    assert not any(READY.search(x) for x in started.out)
    assert wait_gone(ssh_host, 15) == []  # the engine there stopped, not left serving unseen


def test_ctrl_c_reaches_the_engine_there_when_its_disk_is_full(ssh_host, tmp_path, small_disk):
    far = small_disk(512 * 1024) / "jobs"
    started = Run(up_args(ssh_host, far), ssh_host.env, tmp_path)
    try:
        url = started.wait_for(READY, timeout=60).group(1)
        started.wait_for("press Ctrl-C to stop")
        small_disk(0)  # no room for the stop request's line: the follower signals the job itself
        job_dir, _ = started.job()
        with open(job_dir / "events.jsonl", "ab", buffering=0) as events:  # nor in its last page: blank lines,
            with contextlib.suppress(OSError):                            # which the follower skips
                while True:
                    events.write(b"\n" * 64)
        started.interrupt()
        code = started.finish(60)
    finally:
        started.kill()
    assert code == 2, started.stdout + started.stderr
    assert "is full" in one_error(started)
    assert wait_gone(ssh_host, 15) == []
    assert health(url) is None


def test_attach_to_a_job_that_is_not_there_says_so_in_one_line(ssh_host, tmp_path):
    gone = tmp_path / "far" / "20261201-000000-00000000"
    code, started = run(["attach", ssh_host.url, str(gone)], ssh_host.env, tmp_path)
    assert code == 2, started.stdout + started.stderr
    line = one_error(started)
    assert line.startswith(f"error: on {ssh_host.url}: no job at {gone} on "), line
    assert line.endswith("(gone after a reboot, or cleaned up?)"), line  # and no "what it wrote is in …" there
