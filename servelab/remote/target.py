"""The remote host as a URL, `ssh://[user@]host[:port]`, and the OpenSSH command lines that reach it.

Everything the user's OpenSSH knows applies: ~/.ssh/config (Host aliases, ProxyJump, IdentityFile), the agent,
known_hosts. servelab adds only what makes a non-interactive run safe (SAFETY_OPTIONS): BatchMode (never a
password prompt, which nobody would see), StrictHostKeyChecking=yes (a new or changed host key is refused, never
accepted silently), keep-alives so a dead connection is noticed within ALIVE_INTERVAL_S * ALIVE_COUNT seconds
rather than the TCP timeout's minutes, no pty and no RemoteCommand. They are written first in a config file of
their own that includes the user's (the first value obtained wins), so they hold whatever the config says, for
the host and for every jump host on the way.

SERVELAB_SSH_CONFIG names a config file to use instead of ~/.ssh/config (`ssh -F`): the tests' own sshd, or a
site's shared config.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from servelab.errors import UserError

CONFIG_VAR = "SERVELAB_SSH_CONFIG"
SSH_BINARY_VAR = "SERVELAB_SSH"  # another ssh client binary (the default: `ssh` on PATH)
ALIVE_INTERVAL_S = 5
ALIVE_COUNT = 3
CONNECT_TIMEOUT_S = 20

_HOST = re.compile(r"^[A-Za-z0-9_.\-]+$|^\[[0-9A-Fa-f:.]+\]$")
_USER = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class SshTarget:
    """Where `--on` points. `host` may be an alias of ~/.ssh/config; user and port are left to the config when
    the URL does not give them."""

    host: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, url: str) -> SshTarget:
        parts = urlsplit(url)
        if parts.scheme != "ssh":
            raise UserError(f"'{url}' is not an ssh:// URL", hint="--on ssh://[user@]host[:port]")
        if parts.password is not None:
            raise UserError("a password in the --on URL is refused: servelab never handles SSH passwords",
                            hint="use a key or your SSH agent; BatchMode keeps ssh from prompting")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise UserError(f"'{url}' has a path or query; --on takes ssh://[user@]host[:port] only")
        host = parts.hostname or ""
        netloc_host = parts.netloc.rsplit("@", 1)[-1]
        if netloc_host.startswith("["):  # keep an IPv6 literal bracketed, as ssh -p wants it bare
            host = netloc_host.split("]")[0].lstrip("[")
        if not host or not (_HOST.match(host) or _HOST.match(f"[{host}]")):
            raise UserError(f"'{url}' names no host servelab can pass to ssh")
        user = unquote(parts.username) if parts.username else None
        if user is not None and not _USER.match(user):
            raise UserError(f"the user name in '{url}' has characters ssh would read as options")
        try:
            port = parts.port
        except ValueError:
            raise UserError(f"the port in '{url}' is not a number between 1 and 65535") from None
        return cls(host=host, user=user, port=port)

    @property
    def url(self) -> str:
        user = f"{self.user}@" if self.user else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ssh://{user}{host}" + (f":{self.port}" if self.port else "")

    def __str__(self) -> str:
        return self.url


SAFETY_OPTIONS = {  # for every host a connection reaches, jump hosts included
    "BatchMode": "yes",  # never a password or passphrase prompt, which nobody would see
    "StrictHostKeyChecking": "yes",  # a new or changed host key is refused, never accepted silently
    "ServerAliveInterval": str(ALIVE_INTERVAL_S),
    "ServerAliveCountMax": str(ALIVE_COUNT),
    "ConnectTimeout": str(CONNECT_TIMEOUT_S),
    "RequestTTY": "no",  # a pty would mix the command's streams and turn Ctrl-C into bytes
    "RemoteCommand": "none",  # a config's RemoteCommand would run instead of servelab
    "ForwardAgent": "no",
    "ClearAllForwardings": "yes",  # a config's LocalForward would fail on the second connection
}


def safety_config(user_config: str | None = None) -> str:
    """The text of the config file every call is given with `-F`: servelab's safety options for every host
    first (in ssh_config the first value obtained wins), then the user's own config and the system's, as ssh
    reads them by default. A file, not `-o` options: OpenSSH hands a ProxyJump hop its `-F` but none of the
    `-o` options, so options on the command line would not reach a jump host."""
    lines = ["# written by servelab for one command (servelab/remote/target.py)", "Host *"]
    lines += [f"  {key} {value}" for key, value in SAFETY_OPTIONS.items()]
    lines += ["Host *", f"Include {user_config or '~/.ssh/config'}", "Include /etc/ssh/ssh_config", ""]
    return "\n".join(lines)


def ssh_base(target: SshTarget, control_path: str | None = None, config_path: str | None = None) -> list[str]:
    """`ssh [options] host`, without the remote command: the command line every call starts with. `config_path`:
    the file `safety_config` wrote (without one, the same options on the command line, for this host only)."""
    argv = [os.environ.get(SSH_BINARY_VAR) or "ssh"]
    if config_path is not None:
        argv += ["-F", config_path]
    else:
        config = os.environ.get(CONFIG_VAR)
        if config:
            argv += ["-F", config]
        for key, value in SAFETY_OPTIONS.items():
            argv += ["-o", f"{key}={value}"]
    if control_path is not None:
        argv += ["-o", f"ControlPath={control_path}"]
    if target.port is not None:
        argv += ["-p", str(target.port)]
    if target.user is not None:
        argv += ["-l", target.user]
    return argv + ["--", target.host]
