"""The suite's loopback guard (servelab/netguard.py, tests/loopback_guard.py): a test, or a servelab process a test
started, that would reach outside 127.0.0.0/8 and ::1 fails, naming the address, and sends nothing doing so.

Where a guard that failed would send a packet (the inner test runs and subprocesses here that try 192.0.2.1), they
run in an empty network namespace of their own (`unshare --net`, as root or in a user namespace), so a broken
guard shows as a failed test, never as traffic. That nothing leaves even where there is a route is measured on a
veth pair the test makes itself (its packet counter, with and without the guard).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loopback_guard import expected_refusals

from servelab import netguard

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent
PY = sys.executable


def _sandbox() -> list[str]:
    """A command prefix that runs its command in a new, empty network namespace (only a downed lo), or a skip."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs util-linux's `unshare` to try non-loopback addresses where no packet can leave")
    prefix = [unshare, "--net"] if os.geteuid() == 0 else [unshare, "--net", "--map-root-user"]
    tried = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=20)
    if tried.returncode != 0:
        pytest.skip(f"cannot make an empty network namespace here ({' '.join(prefix)}: {tried.stderr.strip()}); "
                    f"without one a broken guard would send packets")
    return prefix


# --------------------------------------------------------------------------------------------------------------
# What stays on this machine
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "::ffff:127.0.0.1", "localhost",
                                  "LOCALHOST", "localhost.", "", None, "0.0.0.0", "::", b"127.0.0.1"])
def test_loopback_and_unspecified_addresses_are_local(host):
    assert netguard.is_local_address(host)


@pytest.mark.parametrize("host", ["192.0.2.1", "10.0.0.1", "::ffff:192.0.2.1", "2001:db8::1", "fe80::1%eth0",
                                  "example.com", "no-such-host.invalid", "localhost.example.com", "127.1"])
def test_other_addresses_and_names_are_not(host):
    assert not netguard.is_local_address(host)


def test_a_lookup_of_a_numeric_address_sends_no_query_and_a_name_does():
    assert netguard.is_local_lookup("192.0.2.1") and netguard.is_local_lookup("localhost")
    assert netguard.is_local_lookup(None) and netguard.is_local_lookup("2001:db8::1")
    assert not netguard.is_local_lookup("example.com")
    assert netguard.check("socket.getaddrinfo", ("example.com", 80, 0, 0, 0)).startswith("socket.getaddrinfo")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
        assert netguard.check("socket.connect", (unix, "/tmp/x.sock")) is None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        assert netguard.check("socket.sendto", (udp, ("192.0.2.1", 53))) == "socket.sendto 192.0.2.1:53"
        assert netguard.check("socket.sendmsg", (udp, None)) is None  # a connected socket: checked at connect


def _listener(family: int, host: str) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen()
    return sock


def test_loopback_passes_the_guard():
    """127.0.0.1, ::1 and localhost, over plain sockets, asyncio and uvloop, TCP and UDP, and AF_UNIX: nothing is
    refused (this test would fail, naming the address, if anything were)."""
    before = len(netguard.violations)
    v4 = _listener(socket.AF_INET, "127.0.0.1")
    port = v4.getsockname()[1]
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    socket.create_connection(("localhost", port), timeout=5).close()
    assert socket.getaddrinfo("localhost", port) and socket.getaddrinfo(None, port)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.sendto(b"x", ("127.0.0.1", port))
    try:
        v6 = _listener(socket.AF_INET6, "::1")
    except OSError:
        v6 = None  # no IPv6 loopback here
    if v6 is not None:
        socket.create_connection(("::1", v6.getsockname()[1]), timeout=5).close()
        v6.close()
    a, b = socket.socketpair()
    a.sendall(b"x")
    assert b.recv(1) == b"x"
    a.close(), b.close()

    async def both() -> None:
        _, writer = await asyncio.open_connection("localhost", port)
        writer.close()
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        await asyncio.get_running_loop().getaddrinfo("localhost", port)

    asyncio.run(both())
    import uvloop

    uvloop.run(both())
    v4.close()
    assert netguard.violations[before:] == []


# --------------------------------------------------------------------------------------------------------------
# What does not: a test fails, a servelab process refuses
# --------------------------------------------------------------------------------------------------------------

INNER = '''
import socket

import pytest


def test_connects_out():
    with socket.socket() as sock:
        sock.settimeout(2)
        try:
            sock.connect(("192.0.2.1", 9))
        except OSError as exc:  # in an empty namespace a connect that was made fails with ENETUNREACH
            raise AssertionError(f"the connect was made: {exc!r}")


def test_swallows_the_refusal():
    try:
        socket.create_connection(("192.0.2.1", 10), timeout=2)
    except Exception:
        pass  # code that hides the failure does not hide the refused address


def test_resolves_a_name():
    try:
        socket.getaddrinfo("servelab-netguard-check.invalid", 80)
    except Exception:
        pass


def test_sends_a_datagram_out():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(b"x", ("192.0.2.1", 11))
        except Exception:
            pass


def test_stays_on_this_machine():
    a, b = socket.socketpair()
    a.sendall(b"x")
    assert b.recv(1) == b"x"
'''


def test_a_test_that_reaches_outside_loopback_fails_naming_the_address(pytester: pytest.Pytester, monkeypatch):
    sandbox = _sandbox()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    inner = pytester.makepyfile(test_inner=INNER)
    result = pytester.run(*sandbox, PY, "-m", "pytest", "-p", "loopback_guard", "-p", "no:cacheprovider", "-q",
                          "-rf", str(inner), timeout=120)
    out = result.stdout.str()
    assert result.parseoutcomes() == {"failed": 4, "passed": 1}, out
    for name, where in [("connects_out", "socket.connect 192.0.2.1:9"),
                        ("swallows_the_refusal", "socket.connect 192.0.2.1:10"),
                        ("resolves_a_name", "socket.getaddrinfo 'servelab-netguard-check.invalid'"),
                        ("sends_a_datagram_out", "socket.sendto 192.0.2.1:11")]:
        assert f"test_inner.py::test_{name} (call) reached outside loopback: {where}" in out, out
    # Refused by the guard before the system call: a connect that was made would have failed (ENETUNREACH).
    assert "the connect was made" not in out and "Network is unreachable" not in out


def test_a_servelab_process_refuses_a_non_loopback_connect(tmp_path: Path):
    sandbox = _sandbox()
    env = {**os.environ, netguard.ENV: "1"}
    for argv, where in [
        ([PY, "-c", "import servelab, socket; socket.create_connection(('192.0.2.1', 9), timeout=2)"],
         "socket.connect 192.0.2.1:9"),
        ([PY, "-c", "import asyncio, servelab, uvloop; uvloop.run(asyncio.open_connection('192.0.2.1', 9))"],
         "socket.connect 192.0.2.1:9 (uvloop create_connection)"),
        ([PY, "-m", "servelab.cli", "verify", "http://192.0.2.1:8000", "--model", "m"],
         "socket.connect 192.0.2.1:8000"),
        ([PY, "-m", "servelab.cli", "verify", "http://servelab-netguard-check.invalid:8000", "--model", "m"],
         "socket.getaddrinfo 'servelab-netguard-check.invalid'"),
    ]:
        ran = subprocess.run([*sandbox, *argv], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
        refusals = [line for line in ran.stderr.splitlines() if line.startswith("servelab netguard")]
        assert ran.returncode != 0 and refusals, (argv, ran.returncode, ran.stdout, ran.stderr)
        assert where in refusals[0] and "only 127.0.0.0/8 and ::1" in refusals[0], ran.stderr
        assert "Network is unreachable" not in ran.stderr + ran.stdout, ran.stderr


def test_the_guard_costs_nothing_without_the_variable():
    probe = "import servelab, sys; print('servelab.netguard' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != netguard.ENV}
    assert subprocess.run([PY, "-c", probe], capture_output=True, text=True, env=env,
                          timeout=60).stdout.strip() == "False"
    assert subprocess.run([PY, "-c", probe], capture_output=True, text=True, env={**env, netguard.ENV: "1"},
                          timeout=60).stdout.strip() == "True"
    assert os.environ[netguard.ENV] == "1"  # set by the suite: every servelab process a test starts inherits it


# --------------------------------------------------------------------------------------------------------------
# Refused means not sent: a veth pair's packet counter
# --------------------------------------------------------------------------------------------------------------

def _steady_tx(netns) -> int:
    """The pair's tx counter once it has stopped moving (a link just brought up may still send its first
    packets)."""
    last = netns.tx_packets()
    for _ in range(20):
        time.sleep(0.25)
        now = netns.tx_packets()
        if now == last:
            return now
        last = now
    pytest.fail(f"the veth pair {netns.host_if} keeps sending without the test: its counter cannot be read")


def test_a_refused_connection_sends_no_packet_and_an_allowed_one_does(netns):
    """Unmarked, the test may not reach its own namespace: a TCP connect, a UDP datagram and uvloop's connect to
    the namespace's address are refused and the pair's counter does not move. Then, allowed, the same connect
    gets through and the counter moves: the counter would have seen a packet the guard let out."""
    server = subprocess.Popen(netns.exec(PY, "-c", (
        "import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(); "
        "print(s.getsockname()[1], flush=True); c, _ = s.accept(); print('accepted', flush=True)"), netns.ns_addr),
        stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        before = _steady_tx(netns)
        with expected_refusals() as refused:
            with pytest.raises(netguard.LeftLoopback):
                socket.create_connection((netns.ns_addr, port), timeout=2)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, pytest.raises(netguard.LeftLoopback):
                udp.sendto(b"x", (netns.ns_addr, port))
            import uvloop

            with pytest.raises(netguard.LeftLoopback):
                uvloop.run(asyncio.open_connection(netns.ns_addr, port))
        time.sleep(0.5)
        assert netns.tx_packets() == before, "a refused call sent a packet"
        assert [r.split(" (")[0] for r in refused] == [f"socket.connect {netns.ns_addr}:{port}",
                                                       f"socket.sendto {netns.ns_addr}:{port}",
                                                       f"socket.connect {netns.ns_addr}:{port}"], refused
        netguard.allow([netns.network])
        try:
            socket.create_connection((netns.ns_addr, port), timeout=5).close()
        finally:
            netguard.allow(())
        assert server.stdout.readline().strip() == "accepted"
        assert netns.tx_packets() > before
    finally:
        server.kill()
        server.wait()
