"""Who can reach an engine servelab launches (issue 11 item 16).

`up` binds loopback unless told otherwise. `--host 0.0.0.0` (or `::`, or a non-loopback address) makes the engine
reachable from the network, and most engines serve anyone who can connect unless they were given an API key. So
such a launch says so before the engine starts, and names the addresses it can be reached at (the host's own
interface addresses, not 127.0.0.1, which is only where servelab itself probes it).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import psutil

from servelab.redaction import is_secret_flag

_ANY = {"0.0.0.0": socket.AF_INET, "": socket.AF_INET, "::": socket.AF_INET6, "[::]": socket.AF_INET6}
_API_KEY_FLAGS = ("key", "keys", "apikey", "token", "auth", "password")


@dataclass(frozen=True)
class Exposure:
    host: str
    urls: list[str]  # where the engine can be reached from other machines
    authenticated: bool  # an API key (or token) is on its command line or in its environment

    def warning(self) -> str:
        where = ", ".join(self.urls) if self.urls else "every address of this host"
        if self.authenticated:
            return f"--host {self.host}: the engine is reachable from the network at {where} (it was given an API key)"
        return (f"--host {self.host}: the engine is reachable from the network at {where}, and it asks for no API "
                f"key: anyone who can reach this host can use it (bind 127.0.0.1, the default, or give the engine "
                f"an API key)")


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback
                       for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP))
        except (OSError, ValueError):
            return False


def _url(address: str, port: int) -> str:
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def interface_addresses(family: int) -> list[str]:
    """This host's non-loopback addresses of `family` (AF_INET6 includes AF_INET: a `::` socket usually accepts
    both), link-local IPv6 ones left out (they need a zone to be used)."""
    families = {socket.AF_INET} if family == socket.AF_INET else {socket.AF_INET, socket.AF_INET6}
    found: list[str] = []
    try:
        interfaces = psutil.net_if_addrs()
    except (OSError, psutil.Error):
        return []
    for addrs in interfaces.values():
        for addr in addrs:
            if addr.family not in families:
                continue
            text = addr.address.split("%")[0]
            try:
                ip = ipaddress.ip_address(text)
            except ValueError:
                continue
            if ip.is_loopback or (ip.version == 6 and ip.is_link_local):
                continue
            if text not in found:
                found.append(text)
    return found


def engine_exposure(engine) -> Exposure | None:
    """`exposure` of a RunningEngine (lifecycle/running.py), from its spec, URL and command line."""
    from yarl import URL

    port = URL(engine.url).port or 80
    return exposure(engine.spec.host, port, engine.launch.command, engine.launch.env)


def exposure(host: str, port: int, command: Sequence[str] = (), env: Mapping[str, str] | None = None
             ) -> Exposure | None:
    """None when the engine listens on loopback only; else who can reach it and whether it asks for a key."""
    if _is_loopback(host):
        return None
    if host in _ANY:
        urls = [_url(a, port) for a in interface_addresses(_ANY[host])]
    else:
        urls = [_url(host.strip("[]"), port)]
    authenticated = any(arg.startswith("--") and is_secret_flag(arg.split("=", 1)[0])
                        and any(w in arg.lower() for w in _API_KEY_FLAGS) for arg in command)
    authenticated = authenticated or any("API_KEY" in name.upper() for name in (env or {}))
    return Exposure(host=host, urls=urls, authenticated=authenticated)
