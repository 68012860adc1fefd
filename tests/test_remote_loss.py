"""The controller or the far side's servelab lost for real, with an engine up there: nothing is left holding the
(would-be) GPUs past the grace period unless --on-disconnect keep asks for it, and then `servelab attach` takes it
over; a SIGKILLed remote servelab is said in one line here while the engine's guard stops the engine there."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from remote_support import READY, Run, engine_processes, health, no_traceback, wait_gone

GRACE_S = 3


def up_ready(host, tmp_path, *extra: str) -> tuple[Run, str]:
    up = Run(["up", "replay-sglang", "--option", "speed=300", "--on", host.url, "--remote-dir",
              str(tmp_path / "far"), "--disconnect-grace", str(GRACE_S), *extra], host.env, tmp_path)
    url = up.wait_for(READY, timeout=60).group(1)
    up.wait_for("press Ctrl-C to stop")
    assert health(url) == 200
    return up, url


def test_a_killed_controller_with_on_disconnect_stop_stops_the_engine_within_the_grace(ssh_host, tmp_path):
    up, url = up_ready(ssh_host, tmp_path, "--on-disconnect", "stop")
    job_dir, _ = up.job()
    up.kill()
    lost_at = time.monotonic()
    # The far side hears the controller no more, waits out the grace, then stops the engine as Ctrl-C would.
    assert wait_gone(ssh_host, GRACE_S + 12) == []
    assert time.monotonic() - lost_at < GRACE_S + 12
    assert health(url) is None
    events = (job_dir / "events.jsonl").read_text()
    assert "the controller has been gone for" in events and "stopping, as --on-disconnect stop says" in events
    assert events.splitlines()[-1] == '{"k":"exit","code":0}'


@pytest.mark.slow  # beyond the killed controller's test, which the default suite runs: the same stop, another cause
def test_a_frozen_controller_on_a_link_gone_silent_counts_as_gone(ssh_host, tmp_path):
    """A laptop put to sleep, a link cut without a FIN: the far side's follower can still write into its
    connection's buffers, so only what the controller says, not the follower's own life, keeps the engine up."""
    up, url = up_ready(ssh_host, tmp_path, "--on-disconnect", "stop")
    frozen = up.tree()
    try:
        for proc in frozen:
            proc.send_signal(signal.SIGSTOP)
        assert wait_gone(ssh_host, GRACE_S + 12) == [], "the engine outlived its silent controller"
        assert health(url) is None
    finally:
        for proc in frozen:
            try:
                proc.send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                pass
        up.kill()


@pytest.mark.slow  # a grace waited out, then a second follower: the killed-controller test covers the default suite
def test_on_disconnect_keep_keeps_serving_and_attach_follows_it_and_ctrl_c_there_stops_it(ssh_host, tmp_path):
    up, url = up_ready(ssh_host, tmp_path, "--on-disconnect", "keep")
    job_dir, _ = up.job()
    up.kill()
    time.sleep(GRACE_S + 1)  # past the grace (the far side looks 4 times a second): with keep, nothing stops
    assert health(url) == 200 and engine_processes(ssh_host)
    attach = Run(["attach", ssh_host.url, str(job_dir)], ssh_host.env, tmp_path)
    try:
        attach.wait_for("press Ctrl-C to stop", timeout=30)  # its output from the start
        assert attach.wait_for(READY).group(1) == url
        attach.interrupt()
        code = attach.finish(30)
    finally:
        attach.kill()
    assert code == 0, attach.stdout + attach.stderr
    assert "stopping…" in attach.out
    assert wait_gone(ssh_host, 15) == []
    assert health(url) is None
    no_traceback(attach.stderr)


def test_a_sigkilled_remote_servelab_is_said_in_one_line_and_the_guard_stops_its_engine(ssh_host, tmp_path):
    up, url = up_ready(ssh_host, tmp_path)
    job_dir, worker = up.job()
    os.kill(worker, signal.SIGKILL)
    code = up.finish(30)
    assert code == 2, up.stdout + up.stderr
    errors = [line for line in up.err if line.startswith("error:")]
    assert errors == [f"error: on {ssh_host.url}: the remote servelab ended without its exit line (killed, or the "
                      f"host lost power) (what it wrote is in {job_dir} there)"], up.stderr
    no_traceback(up.stderr)
    # The engine's guard (lifecycle/guard.py) outlives the worker and stops the engine: TERM, then KILL after 5 s.
    assert wait_gone(ssh_host, 15) == []
    assert health(url) is None


@pytest.mark.slow  # a grace waited out on both sides
def test_a_host_unreachable_for_the_whole_grace_is_given_up_on_in_one_line_and_its_engine_stops(ssh_host, tmp_path):
    up, url = up_ready(ssh_host, tmp_path, "--on-disconnect", "stop")
    listener = psutil.Process(ssh_host.process.pid)
    listener.suspend()  # new connections get no banner, as from a host that went away
    try:
        ssh_host.kill_sessions()
        lost_at = time.monotonic()
        code = up.finish(GRACE_S + 15)
        gave_up_after = time.monotonic() - lost_at
        assert code == 2, up.stdout + up.stderr
        errors = [line for line in up.err if line.startswith("error:")]
        assert errors == [f"error: lost {ssh_host.url} for {GRACE_S} s: it has stopped the engine there, as "
                          f"--on-disconnect stop says"], up.stderr
        assert gave_up_after < GRACE_S + 5  # each try within what is left of the grace, not ssh's own timeout
        assert wait_gone(ssh_host, 15) == []  # and so it has
        assert health(url) is None
        no_traceback(up.stderr)
    finally:
        listener.resume()
        up.kill()
