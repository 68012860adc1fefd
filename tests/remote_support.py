"""What the remote-host tests share: a local servelab run as a user runs it (a subprocess whose environment names
the test sshd's client config), its output lines read as they arrive, and what it left on the far side.

The far side is this same machine, reached through the real sshd of tests/ssh_host.py: the processes servelab
starts there are found again by the host's tag (`SshHost.session_processes`), its job directories are under the
`--remote-dir` a test gives, and an engine's URL there is reachable from here.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

PY = sys.executable
SERVELAB = [PY, "-m", "servelab.cli"]
RUNNING = re.compile(r"remote: running on (\S+) in (\S+) \(pid (\d+)\)")
READY = re.compile(r"ready in [0-9.]+ s at (http://\S+)")


class Run:
    """`servelab ARGS…` started now, its stdout and stderr collected line by line by two threads."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path):
        self.args = args
        self.proc = subprocess.Popen([*SERVELAB, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, cwd=cwd)
        self.out: list[str] = []
        self.err: list[str] = []
        self._changed = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read(self, pipe, into: list[str]) -> None:
        for raw in iter(pipe.readline, b""):
            with self._changed:
                into.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, pattern: str | re.Pattern, *, stream: str = "out", timeout: float = 30.0) -> re.Match:
        """The first line of `stream` ("out" or "err") matching `pattern`, waiting up to `timeout` seconds."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        lines = self.out if stream == "out" else self.err
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in lines:
                    if found := regex.search(line):
                        return found
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not any(r.is_alive() for r in self._readers)):
                    raise AssertionError(f"no {stream} line matching {regex.pattern!r} within {timeout:g} s; "
                                         f"exit {self.proc.poll()}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}")
                self._changed.wait(min(left, 0.2))

    def job(self, timeout: float = 30.0) -> tuple[Path, int]:
        """The far side's job directory and worker pid, from the note servelab prints once it started there."""
        found = self.wait_for(RUNNING, stream="err", timeout=timeout)
        return Path(found.group(2)), int(found.group(3))

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)

    def finish(self, timeout: float = 30.0) -> int:
        """Its exit status, once it ended and its output is read whole."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"servelab {' '.join(self.args)} did not end within {timeout:g} s\n"
                                 f"stdout:\n{self.stdout}\nstderr:\n{self.stderr}") from None
        for reader in self._readers:
            reader.join(10)
        return code

    def kill(self) -> None:
        """SIGKILL servelab alone: its ssh processes die with it (their parent-death signal)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def tree(self) -> list[psutil.Process]:
        try:
            return [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    @property
    def stdout(self) -> str:
        return "\n".join(self.out)

    @property
    def stderr(self) -> str:
        return "\n".join(self.err)


def run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 60.0) -> tuple[int, Run]:
    started = Run(args, env, cwd)
    return started.finish(timeout), started


def wait_gone(host, timeout: float) -> list[str]:
    """Until nothing started through `host` runs any more; what is still running after `timeout` seconds (the
    command lines), empty when all is gone."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for proc in host.session_processes():
            try:
                left.append(" ".join(proc.cmdline())[:200])
            except psutil.Error:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def engine_processes(host) -> list[psutil.Process]:
    """The replay engine's processes among what `host` started (its ranks rename themselves: sglang::…)."""
    found = []
    for proc in host.session_processes():
        try:
            line = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "servelab.engines.replay" in line or line.startswith("sglang::"):
            found.append(proc)
    return found


def health(url: str) -> int | None:
    """The status GET /health answers, or None when nothing answers."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=3) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def no_traceback(text: str) -> None:
    assert "Traceback" not in text and "internal error" not in text, text
