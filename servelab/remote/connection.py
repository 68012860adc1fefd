"""One control master per servelab command, and OpenSSH's failures said in one line each.

Why the system's OpenSSH, not a Python SSH library: it is what the user's ~/.ssh/config, agent, hardware keys,
ProxyJump chains and known_hosts were written for, so `--on ssh://gpu-box` reaches exactly what `ssh gpu-box`
reaches, and no key material ever passes through servelab. The control master (`ssh -M`) authenticates once; every
later call of the same command (start, follow, the copy back) rides on it in milliseconds. The master is a child
of servelab with a parent-death signal: a servelab that dies takes its connection with it, which is what tells
the far side its controller is gone (worker.py).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from servelab.errors import UserError
from servelab.lifecycle.supervisor import _pdeathsig_preexec
from servelab.remote.target import CONFIG_VAR, CONNECT_TIMEOUT_S, SSH_BINARY_VAR, SshTarget, safety_config, ssh_base

SSH_FAILED = 255  # OpenSSH's own failures exit 255; anything else is the remote command's status
NOT_FOUND = 127  # the remote shell found no such command
MASTER_WAIT_S = CONNECT_TIMEOUT_S + 10


def ssh_failure(target: SshTarget, stderr: str) -> UserError:
    """What OpenSSH's stderr says went wrong, as one line with what to do about it."""
    text = stderr.strip()
    host = target.host if target.port is None else f"[{target.host}]:{target.port}"
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text or "Host key for" in text and "has changed" in text:
        return UserError(f"the host key of {target} has CHANGED since it was accepted: refused (it could be "
                         f"another machine answering)",
                         hint=f"if it changed on purpose: ssh-keygen -R '{host}', then `ssh {target.host}` once "
                              f"to check and accept the new key")
    if "Host key verification failed" in text or "host key is known for" in text:
        return UserError(f"the host key of {target} is not in known_hosts: refused",
                         hint=f"check its fingerprint and accept it once with `ssh {target.host}` (or "
                              f"ssh-keyscan{' -p ' + str(target.port) if target.port else ''} {target.host} "
                              f">> ~/.ssh/known_hosts)")
    if "Permission denied" in text:
        return UserError(f"{target} refused the login: {_last_line(text)}",
                         hint="servelab logs in with your SSH agent and keys only (no password prompts): "
                              "ssh-add the key, or set IdentityFile in ~/.ssh/config")
    if "Connection refused" in text or "Could not resolve" in text or "timed out" in text \
            or "No route to host" in text:
        return UserError(f"cannot reach {target}: {_last_line(text)}")
    return UserError(f"ssh to {target} failed: {_last_line(text) or 'no message from ssh'}")


def _missing_ssh() -> UserError:
    return UserError("the OpenSSH client (`ssh`) is not installed here, which --on needs",
                     hint=f"apt-get install openssh-client, or set {SSH_BINARY_VAR} to an ssh binary")


def _spawn(argv: list[str], **kwargs) -> subprocess.Popen:
    try:
        return subprocess.Popen(argv, **kwargs)
    except FileNotFoundError:
        raise _missing_ssh() from None


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, **kwargs)
    except FileNotFoundError:
        raise _missing_ssh() from None


_KNOWN = ("Permission denied", "Host key", "host key", "Connection refused", "Could not resolve", "timed out",
          "No route to host", "Bad configuration option", "line ", "Connection closed")


def _last_line(text: str) -> str:
    """The line that says what went wrong: the first naming a known failure (a bad config option's line comes
    before ssh's "terminating"), else the last."""
    lines = [line.strip() for line in text.replace("\r", "").splitlines() if line.strip()]
    for line in lines:
        if any(mark in line for mark in _KNOWN):
            return line
    return lines[-1] if lines else ""


# Every ssh this module starts is in a process group of its own (process_group=0): a Ctrl-C at the terminal goes to
# servelab alone, which asks the far side to stop and keeps following it; an ssh that got the SIGINT too would drop
# the very connection the stop and the results travel on.


class SshConnection:
    """A control master to `target`, open while the `with` lasts. `run` a remote command to completion,
    `popen` one that streams. Remote commands are argv lists, quoted here for the remote shell."""

    def __init__(self, target: SshTarget):
        self.target = target
        self._dir = tempfile.mkdtemp(prefix="sl-ssh-")  # short: a unix socket path has ~104 bytes at most
        self.control_path = str(Path(self._dir) / "cm")
        self.config_path = str(Path(self._dir) / "config")
        Path(self.config_path).write_text(safety_config(os.environ.get(CONFIG_VAR)))
        self._master_log = Path(self._dir) / "master.log"  # a file, not a pipe nobody reads while it runs
        self._master: subprocess.Popen | None = None

    @classmethod
    @contextlib.contextmanager
    def open(cls, target: SshTarget) -> Iterator[SshConnection]:
        connection = cls(target)
        try:
            connection.start_master()
            yield connection
        finally:
            connection.close()

    def base(self) -> list[str]:
        return ssh_base(self.target, self.control_path, self.config_path)

    def start_master(self, wait_s: float = MASTER_WAIT_S) -> None:
        """Authenticate once; raises UserError with OpenSSH's reason when it cannot."""
        argv = self.base()
        host_at = argv.index("--")
        argv = argv[:host_at] + ["-M", "-N", "-o", "ControlPersist=no"] + argv[host_at:]
        # a master killed outright leaves its socket, and a new master on that path would give up multiplexing
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.control_path)
        with open(self._master_log, "wb") as log:
            self._master = _spawn(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                  preexec_fn=_pdeathsig_preexec(), process_group=0)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self._master.poll() is not None:
                raise ssh_failure(self.target, self._master_log.read_text("utf-8", "replace"))
            if self.check():
                return
            time.sleep(0.05)
        self._stop_master()  # not close(): that removes the control socket's directory, which a retry needs
        raise UserError(f"ssh to {self.target} did not connect within {wait_s:.0f} s")

    def check(self) -> bool:
        """Whether the master answers (`ssh -O check`)."""
        argv = self.base()
        at = argv.index("--")
        done = _run(argv[:at] + ["-O", "check"] + argv[at:], stdin=subprocess.DEVNULL, capture_output=True,
                    timeout=10)
        return done.returncode == 0

    @property
    def master_alive(self) -> bool:
        return self._master is not None and self._master.poll() is None

    def command(self, remote: Sequence[str]) -> list[str]:
        return self.base() + [shlex.join(remote)]

    def run(self, remote: Sequence[str], timeout_s: float = 60.0, stdin: bytes | None = None,
            stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
        """Run `remote` to completion. OpenSSH's own failure (exit 255) raises UserError; the remote command's
        exit status is returned for the caller to read."""
        try:
            done = _run(self.command(remote), input=stdin, stdout=stdout, stderr=subprocess.PIPE,
                                  timeout=timeout_s, stdin=None if stdin is not None else subprocess.DEVNULL,
                                  process_group=0)
        except subprocess.TimeoutExpired:
            raise UserError(f"`{shlex.join(remote)}` on {self.target} did not end within {timeout_s:.0f} s") \
                from None
        if done.returncode == SSH_FAILED and not (self.master_alive and not done.stderr.strip()):
            # 255 with a silent stderr while the master lives is the remote command killed by a signal, which
            # OpenSSH reports as 255 too: the caller reads it as the command's failure, not the link's
            raise ssh_failure(self.target, done.stderr.decode("utf-8", "replace"))
        return done

    def popen(self, remote: Sequence[str]) -> subprocess.Popen:
        """Start `remote` with its stdin and stdout as pipes (stderr too), for a streaming exchange."""
        return _spawn(self.command(remote), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, bufsize=0, preexec_fn=_pdeathsig_preexec(),
                                process_group=0)

    def reconnect(self, wait_s: float = CONNECT_TIMEOUT_S) -> bool:
        """A new master after the old one died (the connection dropped), within `wait_s`; False when the host
        cannot be reached by then."""
        self._stop_master()
        try:
            self.start_master(wait_s=wait_s)
        except UserError:
            return False
        return True

    def _stop_master(self) -> None:
        master, self._master = self._master, None
        if master is None:
            return
        if master.poll() is None:
            with contextlib.suppress(Exception):
                argv = self.base()
                at = argv.index("--")
                subprocess.run(argv[:at] + ["-O", "exit"] + argv[at:], stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=5)
            with contextlib.suppress(subprocess.TimeoutExpired):
                master.wait(timeout=5)
            if master.poll() is None:
                master.kill()
                master.wait()

    def close(self) -> None:
        self._stop_master()
        shutil.rmtree(self._dir, ignore_errors=True)
