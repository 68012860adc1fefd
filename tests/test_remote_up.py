"""`servelab up replay-sglang --on ssh://…` through a real sshd on this machine: the live phases arrive as plain
lines, the ready line with the engine's URL (reachable from here: the far side is this machine), and Ctrl-C here
stops the engine there, leaving no process behind; a connection dropped mid-start-up is picked up again where it
left off."""

from __future__ import annotations

import json
import re

import pytest

from remote_support import READY, Run, engine_processes, health, no_traceback, wait_gone

from servelab.remote.controller import SILENT_LIMIT_S

PHASE = re.compile(r"^\[\s*[0-9.]+s\] (.+?)(?: \(| ·|$)")


def up_args(host, far, *extra: str, speed: int = 300) -> list[str]:
    return ["up", "replay-sglang", "--option", f"speed={speed}", "--on", host.url, "--remote-dir", str(far), *extra]


def phases(lines: list[str]) -> list[str]:
    return [m.group(1) for line in lines if (m := PHASE.match(line))]


def test_up_on_a_remote_host_shows_its_phases_live_and_ctrl_c_stops_the_engine_there(ssh_host, tmp_path):
    up = Run(up_args(ssh_host, tmp_path / "far", speed=100), ssh_host.env, tmp_path)  # loading long enough to see
    try:
        url = up.wait_for(READY, timeout=60).group(1)
        up.wait_for("press Ctrl-C to stop")
        job_dir, _worker = up.job()
        assert health(url) == 200  # served there, reachable here
        assert engine_processes(ssh_host)
        up.interrupt()
        code = up.finish(30)
    finally:
        up.kill()
    assert code == 0, up.stdout + up.stderr
    # The same view a local up draws into a pipe: a title, then one plain line per phase, in order; no redraws.
    assert up.out[0] == "SGLang (replay) on 127.0.0.1: starting"
    seen = phases(up.out)
    assert seen[-1] == "ready" and "loading weights" in seen, up.stdout
    assert seen.index("loading weights") < seen.index("ready")
    assert not any("\x1b[" in line or "\r" in line for line in up.out)
    assert "stopping…" in up.out
    assert job_dir.parent == tmp_path / "far"
    assert wait_gone(ssh_host, 15) == []  # no process of the engine tree, its guard or the worker left there
    assert health(url) is None
    last = json.loads((job_dir / "events.jsonl").read_text().splitlines()[-1])
    assert last == {"k": "exit", "code": 0}
    no_traceback(up.stderr)


@pytest.mark.slow  # a full start-up with a reconnect in it; bench --on drops a link in the default suite
def test_a_connection_dropped_mid_start_up_is_picked_up_again_and_the_start_up_completes(ssh_host, tmp_path):
    up = Run(up_args(ssh_host, tmp_path / "far", speed=100), ssh_host.env, tmp_path)
    try:
        up.wait_for(r"loading weights", timeout=60)
        assert ssh_host.kill_sessions()  # the control master's connection and the follower's, both gone
        up.wait_for("reconnected to", stream="err", timeout=30)
        url = up.wait_for(READY, timeout=60).group(1)
        up.wait_for("press Ctrl-C to stop")
        assert health(url) == 200
        up.interrupt()
        code = up.finish(30)
    finally:
        up.kill()
    assert code == 0, up.stdout + up.stderr
    assert any("dropped; reconnecting" in line for line in up.err), up.stderr
    # Resumed at the byte it had reached: nothing shown twice, nothing lost.
    assert up.out.count("SGLang (replay) on 127.0.0.1: starting") == 1
    assert sum(bool(READY.search(line)) for line in up.out) == 1
    assert up.out.count("press Ctrl-C to stop") == 1
    assert phases(up.out)[-1] == "ready"
    assert wait_gone(ssh_host, 15) == []
    no_traceback(up.stderr)


@pytest.mark.slow  # waits out the controller's silence limit (4 beats)
def test_a_link_gone_silent_is_noticed_by_its_missing_beats_and_followed_again_on_a_new_connection(ssh_host, tmp_path):
    up = Run(up_args(ssh_host, tmp_path / "far", speed=300), ssh_host.env, tmp_path)
    try:
        url = up.wait_for(READY, timeout=60).group(1)
        up.wait_for("press Ctrl-C to stop")
        paused = ssh_host.pause_sessions()  # open but mute, as a link that died without a word
        assert paused
        up.wait_for("dropped; reconnecting", stream="err", timeout=SILENT_LIMIT_S + 10)
        up.wait_for("reconnected to", stream="err", timeout=30)
        assert health(url) == 200  # the engine there did not notice: it kept serving
        up.interrupt()  # and Ctrl-C still reaches it, over the new connection
        code = up.finish(30)
    finally:
        ssh_host.resume_sessions()
        up.kill()
    assert code == 0, up.stdout + up.stderr
    assert "stopping…" in up.out
    assert wait_gone(ssh_host, 15) == []
