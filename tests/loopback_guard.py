"""The test suite's traffic stays on this machine: a pytest plugin (loaded by conftest.py; `-p loopback_guard` with
tests/ on the path loads it elsewhere).

- On load it sets SERVELAB_LOOPBACK_ONLY=1 in os.environ, so every servelab process a test starts guards itself
  (servelab/__init__.py), and installs the same guard here (servelab/netguard.py: an audit hook, plus uvloop's
  loop). A connect, datagram or name lookup that would reach outside 127.0.0.0/8 and ::1 is refused before the
  system call, so nothing is sent.
- Each test's setup, call and teardown are watched: one that was refused anything fails, naming the addresses,
  even when the code under test caught the exception (netguard keeps every refusal in `violations`).
- `@pytest.mark.netns` with the `netns` fixture: a network namespace of the test's own, joined to this one by a
  veth pair; a marked test may reach the namespace's two addresses (and its subprocesses may, through
  `netns.env`). An unmarked test that uses the fixture is still refused them.
- `expected_refusals()`: a block whose refusals the test expects (it checks them itself).
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from servelab import netguard

os.environ[netguard.ENV] = "1"
netguard.install()

NETNS_NETWORK = ipaddress.ip_network("10.254.0.0/16")  # the suite's own namespaces take /30s from this
_counter = itertools.count(1)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "netns: may reach the network namespace its `netns` fixture made")


@contextlib.contextmanager
def expected_refusals() -> Iterator[list[str]]:
    """The refusals made inside the block, which the test expects: they are handed to it, not counted against
    it."""
    start = len(netguard.violations)
    got: list[str] = []
    try:
        yield got
    finally:
        got.extend(netguard.violations[start:])
        del netguard.violations[start:]


def _watched(item: pytest.Item, phase: str):
    start = len(netguard.violations)
    try:
        return (yield)
    finally:
        new = netguard.violations[start:]
        if new:
            shown = "; ".join(dict.fromkeys(new))
            pytest.fail(f"{item.nodeid} ({phase}) reached outside loopback: {shown}. Tests may send packets only "
                        f"to 127.0.0.0/8 and ::1 (tests/loopback_guard.py)", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    return (yield from _watched(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from _watched(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    return (yield from _watched(item, "teardown"))


# --------------------------------------------------------------------------------------------------------------
# A network namespace of the test's own
# --------------------------------------------------------------------------------------------------------------

@dataclass
class Netns:
    name: str
    host_if: str  # this namespace's end of the veth pair
    ns_if: str  # the namespace's end
    host_addr: str  # host_if's address: this machine, as seen from the namespace
    ns_addr: str  # ns_if's address: the test's own host
    network: str  # the /30 both are in
    env: dict[str, str] = field(default_factory=dict)  # for subprocesses: may reach `network` when marked

    def exec(self, *argv: str) -> list[str]:
        """`argv` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def tx_packets(self) -> int:
        """Packets sent out of this machine's end of the pair (toward the namespace)."""
        return int(Path(f"/sys/class/net/{self.host_if}/statistics/tx_packets").read_text())


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)


def _free_block() -> ipaddress.IPv4Network:
    import socket

    import psutil

    taken = {ipaddress.ip_address(a.address) for addrs in psutil.net_if_addrs().values() for a in addrs
             if a.family == socket.AF_INET}
    blocks = list(NETNS_NETWORK.subnets(new_prefix=30))
    first = (os.getpid() * 31 + next(_counter)) % len(blocks)
    for block in blocks[first:] + blocks[:first]:
        if not any(a in block for a in taken):
            return block
    raise RuntimeError("no free /30 in 10.254.0.0/16")


def _disable_ipv6(path_prefix: list[str], interface: str) -> None:
    """No IPv6 on the pair: no router solicitations or duplicate-address probes counted as traffic."""
    subprocess.run([*path_prefix, "sh", "-c", f"echo 1 > /proc/sys/net/ipv6/conf/{interface}/disable_ipv6"],
                   capture_output=True, timeout=20)


def _remove_stale() -> None:
    """Namespaces of test processes that died without removing theirs (deleting one deletes its veth pair)."""
    listed = _ip("netns", "list")
    for line in listed.stdout.splitlines():
        parts = line.split()[0].split("-") if line.strip() else []
        if len(parts) == 4 and parts[:2] == ["servelab", "test"] and parts[2].isdigit():
            try:
                os.kill(int(parts[2]), 0)
            except ProcessLookupError:
                _ip("netns", "del", line.split()[0])
            except PermissionError:
                pass


@pytest.fixture
def netns(request: pytest.FixtureRequest) -> Iterator[Netns]:
    """A network namespace joined to this one by a veth pair (needs Linux, root and iproute2's `ip`; skipped,
    saying why, otherwise). Marked `netns`, the test may reach its addresses."""
    if not sys.platform.startswith("linux"):
        pytest.skip("network namespaces are Linux only")
    if os.geteuid() != 0:
        pytest.skip("a network namespace needs root (`ip netns add`); not root here")
    if shutil.which("ip") is None:
        pytest.skip("a network namespace needs iproute2's `ip`; it is not installed")
    _remove_stale()
    n = next(_counter)
    tag = f"{os.getpid()}{n}"[-9:]
    name, host_if, ns_if = f"servelab-test-{os.getpid()}-{n}", f"slh{tag}", f"sln{tag}"
    made = _ip("netns", "add", name)
    if made.returncode != 0:
        pytest.skip(f"`ip netns add` failed here: {made.stderr.strip()}")
    try:
        block = _free_block()
        host_addr, ns_addr = str(block[1]), str(block[2])
        inside = ["ip", "netns", "exec", name]
        steps = [["link", "add", host_if, "type", "veth", "peer", "name", ns_if],
                 ["link", "set", ns_if, "netns", name]]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                pytest.skip(f"`ip {' '.join(step)}` failed here: {done.stderr.strip()}")
        _disable_ipv6([], host_if)
        _disable_ipv6(inside, ns_if)
        for cmd in (["ip", "addr", "add", f"{host_addr}/30", "dev", host_if], ["ip", "link", "set", host_if, "up"],
                    [*inside, "ip", "addr", "add", f"{ns_addr}/30", "dev", ns_if],
                    [*inside, "ip", "link", "set", ns_if, "up"], [*inside, "ip", "link", "set", "lo", "up"]):
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
            if done.returncode != 0:
                pytest.skip(f"`{' '.join(cmd)}` failed here: {done.stderr.strip()}")
        marked = request.node.get_closest_marker("netns") is not None
        env = dict(os.environ)
        if marked:
            env[netguard.ALLOW_ENV] = str(block)
            netguard.allow([str(block)])
        try:
            yield Netns(name, host_if, ns_if, host_addr, ns_addr, str(block), env)
        finally:
            netguard.allow(os.environ.get(netguard.ALLOW_ENV, "").split(","))
    finally:
        _ip("link", "del", host_if)
        _ip("netns", "del", name)
