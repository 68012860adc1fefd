"""The pure parts of remote hosts, without sshd: the ssh:// URL, the forwarded command line, OpenSSH's failures in
one line, the compatibility rule, and the safety config every call is given."""

from __future__ import annotations

import pytest

from servelab.errors import UserError
from servelab.remote.commands import FORWARD_DROPS, forwarded_argv
from servelab.remote.connection import ssh_failure
from servelab.remote.protocol import PROTOCOL, compatibility
from servelab.remote.target import SAFETY_OPTIONS, SshTarget, safety_config, ssh_base


@pytest.mark.parametrize("url, host, user, port", [
    ("ssh://gpu-box", "gpu-box", None, None),
    ("ssh://root@gpu-box:2222", "gpu-box", "root", 2222),
    ("ssh://me@[::1]:22", "::1", "me", 22),
    ("ssh://10.0.0.5", "10.0.0.5", None, None),
])
def test_an_ssh_url_names_host_user_and_port(url, host, user, port):
    target = SshTarget.parse(url)
    assert (target.host, target.user, target.port) == (host, user, port)
    assert SshTarget.parse(target.url) == target


@pytest.mark.parametrize("url, words", [
    ("http://gpu-box", "not an ssh:// URL"),
    ("ssh://me:secret@gpu-box", "password"),
    ("ssh://gpu-box/path", "path"),
    ("ssh://gpu-box:99999", "port"),
    ("ssh://-oProxyCommand=x", "no host"),
])
def test_a_bad_ssh_url_is_one_line(url, words):
    with pytest.raises(UserError, match=words):
        SshTarget.parse(url)


def test_the_host_comes_after_a_double_dash_so_it_cannot_be_an_option():
    argv = ssh_base(SshTarget.parse("ssh://u@h:7"), "/tmp/cm", "/tmp/cfg")
    assert argv[-2:] == ["--", "h"] and ["-p", "7"] == argv[argv.index("-p"):argv.index("-p") + 2]
    assert ["-F", "/tmp/cfg"] == argv[1:3]


def test_the_safety_options_come_first_for_every_host_then_the_users_config():
    text = safety_config("/home/me/cfg")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert lines[0] == "Host *"
    assert lines[1:1 + len(SAFETY_OPTIONS)] == [f"{k} {v}" for k, v in SAFETY_OPTIONS.items()]
    assert lines.index("Include /home/me/cfg") > len(SAFETY_OPTIONS)
    assert SAFETY_OPTIONS["StrictHostKeyChecking"] == "yes" and SAFETY_OPTIONS["BatchMode"] == "yes"


VALUED = frozenset({"--on", "--out", "--max-tokens", "--model", "-m", "--remote-python", "--prompt"})


@pytest.mark.parametrize("argv, expected", [
    (["bench", "http://x", "--on", "ssh://h", "--out", "runs", "--csv"], ["bench", "http://x", "--csv"]),
    (["bench", "http://x", "--on=ssh://h", "--max-tokens=5"], ["bench", "http://x", "--max-tokens=5"]),
    # a value that looks like a dropped option is still a value
    (["bench", "http://x", "--prompt", "--on", "--on", "ssh://h"], ["bench", "http://x", "--prompt", "--on"]),
    (["--debug", "up", "llamacpp", "-m", "smollm2", "--on", "ssh://h"], ["--debug", "up", "llamacpp", "-m",
                                                                         "smollm2"]),
    # after `--`: the engine's own options, untouched, --on included
    (["up", "sglang", "--on", "ssh://h", "--", "--on", "x"], ["up", "sglang", "--", "--on", "x"]),
])
def test_the_forwarded_command_line_drops_only_this_sides_options(argv, expected):
    assert forwarded_argv(argv, argv[1] if argv[0] == "--debug" else argv[0], FORWARD_DROPS, VALUED) == expected


@pytest.mark.parametrize("stderr, words", [
    ("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nHost key verification failed.", "CHANGED"),
    ("No ED25519 host key is known for [127.0.0.1]:2 and you have requested strict checking.\n"
     "Host key verification failed.", "not in known_hosts"),
    ("root@127.0.0.1: Permission denied (publickey).", "refused the login"),
    ("ssh: connect to host 127.0.0.1 port 9: Connection refused", "cannot reach"),
    ("/tmp/cfg line 2: Bad configuration option: bogus\n/tmp/cfg: terminating, 1 bad configuration options",
     "line 2: Bad configuration option"),
])
def test_each_openssh_failure_is_one_line_that_says_what_to_do(stderr, words):
    error = ssh_failure(SshTarget.parse("ssh://h:2"), stderr)
    assert words in str(error) and "\n" not in error.message


def test_the_compatibility_rule_refuses_another_protocol_and_warns_of_another_version():
    assert compatibility("1.0", {"protocol": PROTOCOL, "version": "1.0"}) == (True, None)
    usable, warning = compatibility("1.0", {"protocol": PROTOCOL, "version": "0.9"})
    assert usable and "0.9" in warning
    usable, refusal = compatibility("1.0", {"protocol": PROTOCOL + 1, "version": "2.0"})
    assert not usable and "upgrade this machine's servelab" in refusal
