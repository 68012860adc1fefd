"""Keep a process's traffic on this machine: refuse, before any packet leaves, a connection, a datagram or a name
lookup that would reach outside loopback.

The test suite sets `SERVELAB_LOOPBACK_ONLY=1` for itself and every process it starts; `servelab/__init__.py`
then installs the guard in each servelab process (the variable is read first, so an ordinary run pays nothing).
The guard is an audit hook (`sys.addaudithook`) on `socket.connect`, `socket.sendto`, `socket.sendmsg`,
`socket.getaddrinfo`, `socket.gethostbyname` (and `_ex`), `socket.gethostbyaddr` and `socket.getnameinfo`:
CPython raises these events before the system call, so raising in the hook means the call never happens. uvloop
connects and resolves in C, past those events, so its loop's `create_connection`, `create_datagram_endpoint`,
`getaddrinfo` and `getnameinfo` are checked too.

Allowed: 127.0.0.0/8, ::1 (and ::ffff:127.x), the unspecified address (Linux connects it to this host), the
name `localhost`, a lookup of a numeric address (no query is sent) or of no host at all, and any socket that is
not IPv4 or IPv6 (AF_UNIX, netlink). `SERVELAB_LOOPBACK_ALLOW` adds networks (comma-separated, e.g. the
addresses of a network namespace a test made itself). Anything else is refused: one line on stderr naming the
event and the address, the address kept in `violations`, and `LeftLoopback` raised from the socket call. It is
not an OSError, so code that handles a refused connection cannot mistake it for one.

An audit hook cannot be removed: `install` adds it once per process; `allow` changes what it lets through.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import Iterable
from typing import Any

ENV = "SERVELAB_LOOPBACK_ONLY"
ALLOW_ENV = "SERVELAB_LOOPBACK_ALLOW"
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})

violations: list[str] = []  # "socket.connect 192.0.2.1:80", in the order they were refused
_extra: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
_installed = False


class LeftLoopback(RuntimeError):
    """A socket call that would have sent a packet (or a DNS query) outside loopback, refused before it did."""


def wanted(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    return environ.get(ENV, "") not in ("", "0")


def allow(networks: Iterable[str]) -> None:
    """Let these networks through as well (replacing any allowed before); `allow(())` is loopback only again."""
    global _extra
    _extra = tuple(ipaddress.ip_network(n.strip(), strict=False) for n in networks if n.strip())


def allowed_networks() -> list[str]:
    return [str(n) for n in _extra]


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(text.strip("[]").split("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _host_text(host: Any) -> str | None:
    """`host` as text ("" for none); None when it is neither text nor bytes."""
    if host is None:
        return ""
    if isinstance(host, bytes):
        return host.decode("ascii", "replace")
    return host if isinstance(host, str) else None


def _local_name(host: str) -> bool:
    return host == "" or host.lower().rstrip(".") in LOCAL_NAMES


def is_local_address(host: Any) -> bool:
    """Whether a connection to `host` (an address, or a name) stays on this machine without a lookup."""
    host = _host_text(host)
    if host is None:
        return False
    if _local_name(host):
        return True
    ip = _ip(host)
    if ip is None:
        return False
    return ip.is_loopback or ip.is_unspecified or any(ip in net for net in _extra)


def is_local_lookup(host: Any) -> bool:
    """Whether looking `host` up sends no query off this machine: no host, `localhost`, or a numeric address
    (getaddrinfo answers those itself; a connection to a numeric address is checked when it is made)."""
    host = _host_text(host)
    return host is not None and (_local_name(host) or _ip(host) is not None)


def _where(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        if isinstance(host, bytes):
            host = host.decode("ascii", "replace")
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return repr(address)


def check(event: str, args: tuple) -> str | None:
    """The refused destination of one audit event, as 'EVENT ADDRESS', or None when it stays on this machine."""
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        sock, address = args[0], args[1] if len(args) > 1 else None
        if address is None or getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
            return None
        if not isinstance(address, tuple) or not address or is_local_address(address[0]):
            return None
        return f"{event} {_where(address)}"
    if event == "socket.getaddrinfo":
        host = args[0] if args else None
        if is_local_lookup(host):
            return None
        return f"{event} {host!r} (a DNS query)"
    if event == "socket.gethostbyname":
        host = args[0] if args else None
        return None if is_local_lookup(host) else f"{event} {host!r} (a DNS query)"
    if event == "socket.gethostbyaddr":
        host = args[0] if args else None
        return None if is_local_address(host) else f"{event} {host!r} (a reverse DNS query)"
    if event == "socket.getnameinfo":
        address = args[0] if args else None
        host = address[0] if isinstance(address, tuple) and address else address
        return None if is_local_address(host) else f"{event} {_where(address)} (a reverse DNS query)"
    return None


_EVENTS = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                     "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo"})


def refuse(what: str) -> None:
    """Record and report `what` (see `check`), then raise LeftLoopback."""
    violations.append(what)
    message = (f"servelab netguard ({ENV}=1): refused {what}: only 127.0.0.0/8 and ::1"
               + (f" (and {', '.join(allowed_networks())})" if _extra else "") + " may be reached")
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must not hide the refusal itself
        pass
    raise LeftLoopback(message)


def _hook(event: str, args: tuple) -> None:
    if event in _EVENTS:
        what = check(event, args)
        if what is not None:
            refuse(what)


def _guard_uvloop() -> None:
    """uvloop's loop resolves and connects in C (libuv): no audit event. Check its methods' arguments."""
    try:
        import uvloop
    except ImportError:
        return
    loop_class = uvloop.Loop
    if getattr(loop_class, "_servelab_netguard", False):
        return
    create_connection, datagram = loop_class.create_connection, loop_class.create_datagram_endpoint
    getaddrinfo, getnameinfo = loop_class.getaddrinfo, loop_class.getnameinfo

    async def guarded_create_connection(self, protocol_factory, host=None, port=None, *args, **kwargs):
        if kwargs.get("sock") is None:
            if not is_local_address(host):
                refuse(f"socket.connect {_where((host, port))} (uvloop create_connection)")
        return await create_connection(self, protocol_factory, host, port, *args, **kwargs)

    async def guarded_datagram(self, protocol_factory, local_addr=None, remote_addr=None, **kwargs):
        if isinstance(remote_addr, tuple) and remote_addr and not is_local_address(remote_addr[0]):
            refuse(f"socket.connect {_where(remote_addr)} (uvloop create_datagram_endpoint)")
        return await datagram(self, protocol_factory, local_addr, remote_addr, **kwargs)

    async def guarded_getaddrinfo(self, host, port, *args, **kwargs):
        if not is_local_lookup(host):
            refuse(f"socket.getaddrinfo {host!r} (a DNS query; uvloop)")
        return await getaddrinfo(self, host, port, *args, **kwargs)

    async def guarded_getnameinfo(self, sockaddr, flags=0):
        if isinstance(sockaddr, tuple) and sockaddr and not is_local_address(sockaddr[0]):
            refuse(f"socket.getnameinfo {_where(sockaddr)} (a reverse DNS query; uvloop)")
        return await getnameinfo(self, sockaddr, flags)

    loop_class.create_connection = guarded_create_connection
    loop_class.create_datagram_endpoint = guarded_datagram
    loop_class.getaddrinfo = guarded_getaddrinfo
    loop_class.getnameinfo = guarded_getnameinfo
    loop_class._servelab_netguard = True


def install() -> None:
    """Add the guard to this process (once; later calls change nothing). Networks in SERVELAB_LOOPBACK_ALLOW are
    allowed as well."""
    global _installed
    if _installed:
        return
    _installed = True
    allow(os.environ.get(ALLOW_ENV, "").split(","))
    sys.addaudithook(_hook)
    _guard_uvloop()
