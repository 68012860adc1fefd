"""Ports: is one free, pick a free one, refuse one that is taken before anything starts."""

from __future__ import annotations

import errno
import socket
from typing import Any

from servelab.errors import UserError


def _address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise UserError(f"cannot resolve host '{host}': {exc.strerror}") from None
    return family, sockaddr


def port_in_use(host: str, port: int) -> bool:
    """True when an engine could not listen on host:port because something else holds it."""
    family, sockaddr = _address(host, port)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR, so a connection left in TIME_WAIT does not block them and should not block us.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}",
                            hint="use a local address with --host and a free port with --port") from None
    return False


def free_port(host: str = "127.0.0.1") -> int:
    family, sockaddr = _address(host, 0)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind(sockaddr)
        return int(sock.getsockname()[1])


def ensure_port_free(host: str, port: int) -> None:
    if port_in_use(host, port):
        raise UserError(f"port {port} on {host} is already in use",
                        hint=f"stop what listens there, or choose another port with --port (e.g. --port "
                             f"{free_port(host)})")
