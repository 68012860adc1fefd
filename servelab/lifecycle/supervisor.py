"""Run one command as a supervised process: its own process group, its output in a log file, a clean stop.

Why a process group: engines spawn workers (vLLM engine core, SGLang scheduler ranks, tokenizer managers). A
signal to the leader alone can leave those behind holding GPU memory and the port. `start_new_session=True`
makes the engine the leader of a fresh group (pgid == pid) that servelab can signal as a whole; it also keeps a
terminal's Ctrl-C away from the engine, so servelab decides how the engine stops.

Why PR_SET_PDEATHSIG: if servelab itself is SIGKILLed it runs no cleanup, and the engine (in its own session)
would keep running. The kernel sends SIGTERM to the engine when its parent dies. Two limits: the signal fires when
the *thread* that forked the child exits (start engines from a long-lived thread, e.g. the main thread), and it
reaches only the direct child.

Why a guard (lifecycle/guard.py): past the direct child, a launcher that forks its server, or a server that
double-forks into a session of its own, would outlive a SIGKILLed servelab and keep the port. Every process the
engine starts inherits a mark in its environment (SERVELAB_TREE=<id>); a guard process, in a session of its own,
waits for servelab to go away (the end of a pipe only servelab holds) and then stops the engine's group and every
marked process. `stop()` finds the marked processes the same way, so a clean stop reaches them too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

from servelab.lifecycle import guard as _guard

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_LINE_SEPARATORS = re.compile(rb"[\r\n]")  # tqdm rewrites its line with \r: each rewrite is a line for us
_TAIL_BLOCK = 64 * 1024
_TAIL_MAX_BYTES = 8 * 1024 * 1024  # never read more than this from the end of a log to find n lines


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """A preexec_fn that asks the kernel to SIGTERM the child when servelab dies; None where that is unsupported.

    Everything is looked up here, in the parent: between fork and exec the child should only make the one call.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent_pid = os.getpid()
    sigterm = int(signal.SIGTERM)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
        # The parent may have died between fork and prctl: then no death signal will ever come.
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), sigterm)

    return preexec


def signal_name(returncode: int | None) -> str | None:
    """'SIGKILL' for a returncode of -9; None for a normal exit or a process still running."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def decode_lines(parts: list[bytes]) -> list[str]:
    """Decode raw lines leniently (a crashing engine can cut a UTF-8 sequence) and drop the blank ones."""
    lines = (part.decode("utf-8", errors="replace").rstrip() for part in parts)
    return [line for line in lines if line.strip()]


def split_lines(data: bytes) -> list[str]:
    """Non-blank lines of a log chunk, split on \\n and \\r."""
    return decode_lines(_LINE_SEPARATORS.split(data))


class SupervisedProcess:
    """A started command. Created by `start_process`."""

    def __init__(self, popen: subprocess.Popen, command: Sequence[str], log_path: Path, log_offset: int,
                 tree_id: str | None = None):
        self._popen = popen
        self.command = list(command)
        self.log_path = log_path
        self.log_offset = log_offset  # where this process's output starts in a log that may hold earlier runs
        self.pid: int = popen.pid
        self.pgid: int = popen.pid  # start_new_session: the child leads its own group
        self.tree_id = tree_id  # the SERVELAB_TREE mark every process of the engine inherits (guard.py)
        self._guard: subprocess.Popen | None = None
        self._guard_pipe: int | None = None  # servelab's end: when it closes, the guard stops the engine's tree

    # ---- exit status ----
    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Wait for the leader to exit on its own; its returncode, or None if it is still running."""
        try:
            return self._popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    @property
    def exit_signal(self) -> str | None:
        return signal_name(self.returncode)

    def describe_exit(self) -> str:
        rc = self.returncode
        if rc is None:
            return "still running"
        name = signal_name(rc)
        return f"killed by {name}" if name else f"exit code {rc}"

    # ---- the group ----
    def group_pids(self) -> list[int]:
        """Live (non-zombie) processes of the group. A zombie holds no resources and cannot be signalled away."""
        self._popen.poll()  # reap the leader if it exited, so it does not count as a member
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return []  # the fast, common answer once everything is gone
        except PermissionError:
            pass
        members = []
        for proc in psutil.process_iter(["status"]):
            try:
                if os.getpgid(proc.pid) == self.pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    members.append(proc.pid)
            except (OSError, psutil.Error):
                continue
        return members

    def group_alive(self) -> bool:
        return bool(self.group_pids())

    def _descendants(self) -> list[psutil.Process]:
        """The engine's processes outside its group too: its live descendants, and every process carrying its
        mark (a server that double-forked into a session of its own is nobody's descendant any more)."""
        tree: list[psutil.Process] = []
        if self._popen.poll() is None:  # once reaped, the pid may belong to someone else, whose children are not ours
            try:
                tree = psutil.Process(self.pid).children(recursive=True)
            except psutil.Error:
                tree = []
        if self.tree_id:
            known = {p.pid for p in tree}
            for pid in _guard.marked_pids(self.tree_id):
                if pid not in known and pid != self.pid:
                    try:
                        tree.append(psutil.Process(pid))
                    except psutil.Error:
                        continue
        return tree

    def _signal(self, sig: signal.Signals, tree: list[psutil.Process]) -> None:
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        # Descendants that moved to a group of their own (setsid in a worker) are signalled one by one.
        # psutil checks each process's identity first, so a reused pid is never hit.
        for proc in tree:
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass

    def _wait_gone(self, timeout_s: float, tree: list[psutil.Process]) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.group_pids() and not any(_is_live(p) for p in tree):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the whole group, wait up to `grace_s`, then SIGKILL it. Returns the leader's returncode.

        Safe to call more than once and after the process exited (its workers may still be running).
        A Ctrl-C while waiting escalates to SIGKILL at once instead of leaving the group half-stopped.
        """
        tree = self._descendants()  # snapshot now: once the leader dies its children are reparented
        try:
            self._signal(signal.SIGTERM, tree)
            if not self._wait_gone(grace_s, tree):
                self._signal(signal.SIGKILL, tree)
                self._wait_gone(5.0, tree)
        except KeyboardInterrupt:
            self._signal(signal.SIGKILL, tree)
            self._release_guard()
            raise
        code = self.wait(1.0)
        self._release_guard()
        return code

    # ---- the guard ----
    def _start_guard(self) -> None:
        """Start the guard that stops this engine's tree if servelab goes away without stopping it."""
        if not self.tree_id or not sys.platform.startswith("linux"):
            return
        read_end, write_end = os.pipe()  # both non-inheritable: no engine started later holds servelab's end
        try:
            self._guard = subprocess.Popen(
                [sys.executable, "-I", "-S", _guard.__file__, str(self.pgid), self.tree_id], stdin=read_end,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                env={"PATH": os.environ.get("PATH", "")})
        except OSError:
            os.close(write_end)
            return
        finally:
            os.close(read_end)
        self._guard_pipe = write_end

    def _release_guard(self) -> None:
        """The engine was stopped: close servelab's end, so the guard looks once more and exits."""
        if self._guard_pipe is not None:
            os.close(self._guard_pipe)
            self._guard_pipe = None
        if self._guard is not None:
            try:
                self._guard.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass  # still sweeping a leftover: it ends on its own; a later Popen reaps it
            self._guard = None

    # ---- the log ----
    def log_tail(self, n: int = 20) -> list[str]:
        """The last `n` non-blank lines this process wrote, split on \\n and \\r."""
        try:
            with open(self.log_path, "rb") as fh:
                end = fh.seek(0, os.SEEK_END)
                start = max(self.log_offset, end - _TAIL_MAX_BYTES)
                if end < self.log_offset:  # the log was truncated since we started: all of it is ours
                    start = max(0, end - _TAIL_MAX_BYTES)
                data = b""
                pos = end
                # Read backwards block by block until the chunk holds more than n separators.
                while pos > start and len(_LINE_SEPARATORS.findall(data)) <= n:
                    step = min(_TAIL_BLOCK, pos - start)
                    pos -= step
                    fh.seek(pos)
                    data = fh.read(step) + data
        except OSError:
            return []
        lines = split_lines(data)
        if pos > start and lines:
            lines = lines[1:]  # the first piece may be the end of a longer line
        return lines[-n:] if n > 0 else []


def _is_live(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def start_process(command: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
                  cwd: Path | None = None) -> SupervisedProcess:
    """Start `command` in its own process group with stdout and stderr appended to `log_path`.

    The environment is servelab's own plus `env` (additions win).
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tree_id = uuid.uuid4().hex
    full_env = {**os.environ, **(env or {}), _guard.TREE_VAR: tree_id}
    with open(log_path, "ab") as log:
        offset = log.tell()
        popen = subprocess.Popen(
            list(command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=full_env,
            cwd=cwd, start_new_session=True, preexec_fn=_pdeathsig_preexec(), close_fds=True)
    # The child holds its own copy of the log descriptor; ours is closed by the `with`.
    process = SupervisedProcess(popen, command, log_path, offset, tree_id=tree_id)
    process._start_guard()
    return process
