"""The sshd harness of tests/ssh_host.py itself: a real OpenSSH server on 127.0.0.1, reached through the client
config it writes, refusing a changed or unknown host key, and dropping live connections on demand."""

from __future__ import annotations

import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import psutil
import pytest

import ssh_host as harness


def _wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout}s")


def test_a_command_runs_through_the_alias_and_its_exit_status_comes_back(ssh_host):
    assert ssh_host.run("true").returncode == 0
    failed = ssh_host.run("echo out; echo err >&2; exit 7")
    assert (failed.returncode, failed.stdout, failed.stderr) == (7, "out\n", "err\n")
    # The env names the config for servelab's remote code; ssh given only that path reaches the same host.
    by_env = subprocess.run(["ssh", "-F", ssh_host.env["SERVELAB_SSH_CONFIG"], "servelab-test", "id -un"],
                            env=ssh_host.env, capture_output=True, text=True, timeout=20)
    assert by_env.stdout.strip() == ssh_host.user


def test_servelab_is_found_on_the_far_side(ssh_host):
    found = ssh_host.run("command -v servelab; servelab --version; echo $HOME")
    path, shown, home = found.stdout.splitlines()
    assert Path(path) == Path(sys.prefix) / "bin" / "servelab"
    assert shown == f"servelab {version('servelab')}"
    assert Path(home) == ssh_host.remote_home


def test_it_listens_on_loopback_only(ssh_host):
    listening = [c.laddr for c in psutil.Process(ssh_host.process.pid).net_connections("inet")
                 if c.status == psutil.CONN_LISTEN]
    assert [(a.ip, a.port) for a in listening] == [("127.0.0.1", ssh_host.port)]


def test_a_changed_host_key_is_refused(ssh_host_changed_key):
    refused = ssh_host_changed_key.run("echo reached")
    assert refused.returncode == 255 and refused.stdout == ""
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED!" in refused.stderr
    assert f"Host key for [127.0.0.1]:{ssh_host_changed_key.port} has changed and you have requested strict " \
           "checking." in refused.stderr
    assert refused.stderr.rstrip().endswith("Host key verification failed.")
    assert "Starting session" not in ssh_host_changed_key.log_path.read_text()


def test_an_unknown_host_key_is_refused(ssh_host_unknown_key):
    refused = ssh_host_unknown_key.run("echo reached")
    assert refused.returncode == 255 and refused.stdout == ""
    assert refused.stderr == (f"No ED25519 host key is known for [127.0.0.1]:{ssh_host_unknown_key.port} and you "
                              "have requested strict checking.\nHost key verification failed.\n")


def test_a_key_the_server_does_not_know_is_refused(ssh_host, tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "stranger")], check=True,
                   timeout=20)
    # A config of the stranger's own: `-i` would only add a key to the one the host's config names.
    stranger_config = tmp_path / "stranger_config"
    stranger_config.write_text(ssh_host.config_path.read_text().replace(str(ssh_host.identity_path),
                                                                      str(tmp_path / "stranger")))
    refused = subprocess.run(["ssh", "-F", str(stranger_config), "servelab-test", "echo reached"], env=ssh_host.env,
                             capture_output=True, text=True, timeout=20)
    assert refused.returncode == 255 and refused.stdout == ""
    assert refused.stderr.strip().endswith("Permission denied (publickey).")


def test_kill_sessions_drops_a_live_connection_and_the_listener_keeps_accepting(ssh_host):
    client = subprocess.Popen(ssh_host.ssh_command("sleep 30"), env=ssh_host.env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sleeper = _wait_for(lambda: [p for p in ssh_host.session_processes() if p.name() == "sleep"])
        started = time.monotonic()
        assert ssh_host.kill_sessions()
        assert client.wait(timeout=5) == 255
        assert time.monotonic() - started < 5
        assert "closed by remote host" in client.stderr.read()
    finally:
        client.kill()
        client.wait()
    assert ssh_host.listener_alive() and ssh_host.accepts()
    assert ssh_host.run("echo again").stdout == "again\n"
    # What the dropped session ran is still there, found by the host's tag, until stop() clears it.
    assert sleeper[0].is_running()
    ssh_host.stop()
    assert not ssh_host.listener_alive()
    _wait_for(lambda: not ssh_host.session_processes(), timeout=5)


def test_paused_sessions_are_noticed_only_by_the_clients_keep_alives(ssh_host):
    alive = ("-o", "ServerAliveInterval=1", "-o", "ServerAliveCountMax=1")
    client = subprocess.Popen(ssh_host.ssh_command("sleep 30", options=alive), env=ssh_host.env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: [p for p in ssh_host.session_processes() if p.name() == "sleep"])
        started = time.monotonic()
        assert ssh_host.pause_sessions()
        assert client.wait(timeout=10) == 255
        # A probe after one silent interval, and after the next the client gives up: about two seconds.
        assert 0.9 < time.monotonic() - started < 5
        assert client.stderr.read().strip() == "Timeout, server 127.0.0.1 not responding."
    finally:
        client.kill()
        client.wait()
        ssh_host.resume_sessions()
    assert ssh_host.run("echo again").stdout == "again\n"


def test_a_control_master_through_the_config_is_dropped_with_the_sessions(ssh_host):
    control = ("-o", "ControlMaster=auto", "-o", f"ControlPath={ssh_host.control_dir}/%C", "-o", "ControlPersist=30")
    assert ssh_host.run("true", options=control).returncode == 0
    check = ssh_host.run("", options=(*control, "-O", "check"))
    assert check.returncode == 0 and check.stderr.startswith("Master running (pid=")
    assert ssh_host.kill_sessions()
    gone = _wait_for(lambda: (r := ssh_host.run("", options=(*control, "-O", "check"))).returncode != 0 and r)
    assert gone.returncode == 255
    # The next command with ControlMaster=auto opens a fresh master on the same listener.
    assert ssh_host.run("echo back", options=control).stdout == "back\n"
    assert ssh_host.run("", options=(*control, "-O", "exit")).returncode == 0


def test_without_sshd_the_reason_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "SSHD", str(tmp_path / "no-sshd"))
    with pytest.raises(harness.SshHostUnavailable, match="^openssh-server is not installed: apt-get install "
                                                          "openssh-server$"):
        harness.start_ssh_host(tmp_path / "sshd")
