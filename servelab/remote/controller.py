"""This side of a remote job: start it, follow its events (reconnecting when the connection drops), turn Ctrl-C
into a stop request, and copy its results back whole.

A dropped connection is not the end of a run: the far side's worker goes on (its policy decides what happens
once the controller has been gone past the grace period), so the controller reconnects, as often as it takes
within that period, and resumes following at the byte where it left off. Only when the host cannot be reached
for the whole grace period does it give up, saying what became of the engine.
"""

from __future__ import annotations

import contextlib
import json
import queue
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from servelab import __version__
from servelab.errors import UserError
from servelab.remote.agent import MANIFEST, NO_JOB, file_digest
from servelab.remote.connection import NOT_FOUND
from servelab.remote.link import LINK_FAILED, Link, attach_target, lost_for_good
from servelab.remote.protocol import BEAT_S, compatibility, decode

SILENT_LIMIT_S = 4 * BEAT_S  # a follower that sent nothing, not even a beat, for this long is on a dead link
FIRST_LINE_S = 60.0  # … but its first line may wait for a slow start there (an interpreter importing from NFS)
RECONNECT_EVERY_S = 1.0
FETCH_TRIES = 3  # copies of the results begun again after a dropped connection, at most
ALIVE_EVERY_S = 0.5  # how often the follower there hears that this side is still here: well within any grace


@dataclass
class RemoteOptions:
    """How to run servelab on the far side."""

    remote_python: str | None = None  # an interpreter that has servelab; default: `servelab` on the remote PATH
    remote_dir: str | None = None  # the root of job directories there (default ~/.servelab/remote)
    on_disconnect: str = "stop"
    grace_s: float = 60.0
    columns: int | None = None

    def servelab(self) -> list[str]:
        return [self.remote_python, "-m", "servelab.cli"] if self.remote_python else ["servelab"]


def hello(conn: Link, options: RemoteOptions, warn: Callable[[str], None]) -> dict[str, Any]:
    """The far side's servelab, checked against the compatibility rule; UserError when it is missing or cannot be
    driven."""
    done = conn.run([*options.servelab(), "remote", "hello"], timeout_s=60)
    if done.returncode == NOT_FOUND or (done.returncode != 0 and b"No module named" in done.stderr):
        what = f"`{options.remote_python} -m servelab`" if options.remote_python else "`servelab` on its PATH"
        raise UserError(f"servelab is not installed on {conn.target} (no {what})",
                        hint="install it there (pip install servelab, in the environment the engines run in), "
                             "or pass --remote-python PATH naming an interpreter that has it")
    if done.returncode != 0:
        raise UserError(f"servelab on {conn.target} did not answer `remote hello`: "
                        f"{_last(done.stderr) or f'exit status {done.returncode}'}",
                        hint="it may predate remote hosts: upgrade servelab there")
    try:
        info = _last_json(done.stdout)
    except ValueError:
        info = None
    if not isinstance(info, dict):
        raise UserError(f"servelab on {conn.target} answered `remote hello` with something that is not JSON")
    usable, message = compatibility(__version__, info)
    if not usable:
        raise UserError(message or "incompatible remote servelab")
    if message:
        warn(message)
    return info


def _last_json(stdout: bytes):
    """The JSON document on the last line that holds one: a login shell's rc files may print before the
    command does. Raises ValueError when there is none."""
    lines = [line for line in stdout.splitlines() if line.strip().startswith(b"{")]
    if not lines:
        raise ValueError("no JSON line")
    return json.loads(lines[-1])


def _last(data: bytes) -> str:
    lines = [x.strip() for x in data.decode("utf-8", "replace").splitlines() if x.strip()]
    return lines[-1] if lines else ""


@dataclass
class RemoteJob:
    conn: Link  # an SshConnection, a RayLink (link.py): the job's far side is the same either way
    options: RemoteOptions
    dir: str
    pid: int
    offset: int = 0  # bytes of events.jsonl already received
    stop_requested: int = 0
    last_heard: float = field(default_factory=time.monotonic)  # when any follower last sent a line
    reconnects: int = 0
    exit_code: int | None = None
    notes: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, conn: Link, options: RemoteOptions, argv: Sequence[str],
              secrets: dict[str, str] | None = None, files: dict[str, str] | None = None) -> RemoteJob:
        """Start `servelab ARGV…` there. `secrets` (an API key) travel on the channel's stdin into the worker's
        environment, never on a command line or into a file; `files` are written into the job directory first
        (relative paths in ARGV find them)."""
        remote = [*options.servelab(), "remote", "start", "--grace", f"{options.grace_s:g}",
                  "--on-disconnect", options.on_disconnect]
        if options.remote_dir:
            remote += ["--root", options.remote_dir]
        if options.columns:
            remote += ["--columns", str(options.columns)]
        given = {"env": secrets or {}, "files": files or {}}
        if secrets or files:
            remote.append("--stdin-json")
        done = conn.run([*remote, "--", *argv], timeout_s=60,
                        stdin=json.dumps(given).encode() if secrets or files else None)
        if done.returncode != 0:
            raise UserError(f"could not start servelab on {conn.target}: "
                            f"{_last(done.stderr).removeprefix('error: ') or f'exit status {done.returncode}'}")
        try:
            info = _last_json(done.stdout)
            return cls(conn=conn, options=options, dir=str(info["dir"]), pid=int(info["pid"]))
        except (ValueError, KeyError, TypeError):
            raise UserError(f"servelab on {conn.target} answered `remote start` with {done.stdout[:200]!r}") \
                from None

    def remote(self, *args: str) -> list[str]:
        return [*self.options.servelab(), "remote", *args]

    def follow(self, on_event: Callable[[dict[str, Any]], None], on_note: Callable[[str], None]) -> int:
        """Every event until the exit line; the command's exit status. Ctrl-C asks the far side to stop and keeps
        following (its results are what Ctrl-C must not lose); a second Ctrl-C asks again, which hurries it."""
        with self.interrupts_counted():
            while True:
                outcome = self._follow_once(on_event)
                if outcome == "exit":
                    return self.exit_code if self.exit_code is not None else 1
                if outcome.startswith("nojob:"):
                    raise UserError(f"on {self.conn.target}: {outcome[6:]}")
                if outcome.startswith("lost:"):
                    raise UserError(f"on {self.conn.target}: {outcome[5:]}",
                                    hint=f"what it wrote is in {self.dir} there")
                if time.monotonic() - self.last_heard > self.options.grace_s + FIRST_LINE_S:
                    # connections that come back but never carry a line: as gone as one that never comes back
                    raise UserError(f"nothing came from {self.conn.target} for "
                                    f"{time.monotonic() - self.last_heard:.0f} s over {self.reconnects} "
                                    f"reconnections: {self._fate()}")
                self.reconnects += 1
                self._reconnect(on_note)

    @contextlib.contextmanager
    def interrupts_counted(self) -> Iterator[None]:
        """Ctrl-C (and SIGTERM, SIGHUP, which interrupts.py routes to it) counted while following, not raised: a
        KeyboardInterrupt raised wherever the main thread happens to be escaped between two calls (exit 130, the
        far side never told) or, arriving while a reconnect forked ssh, was swallowed by CPython's after-fork
        hooks (the stop lost, the command waiting for an end that never came)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def count(signum, frame) -> None:
            self.stop_requested += 1

        previous = signal.signal(signal.SIGINT, count)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def _follow_once(self, on_event: Callable[[dict[str, Any]], None]) -> str:
        proc = self.conn.popen(self.remote("follow", self.dir, "--offset", str(self.offset)))
        lines: queue.Queue[bytes | None] = queue.Queue()

        def read() -> None:
            # This thread closes the pipe it reads, once at its end: closed under a read in progress, the fd's
            # number could be reused by another file and the read would take that file's bytes.
            assert proc.stdout is not None
            try:
                for raw in iter(proc.stdout.readline, b""):
                    lines.put(raw)
            except (OSError, ValueError):
                pass
            finally:
                lines.put(None)
                proc.stdout.close()

        threading.Thread(target=read, daemon=True).start()
        stops_sent = self.stop_requested  # on a new connection, one stop for all those asked before
        if stops_sent:
            self._send_stop(proc)
        last_heard = time.monotonic()
        heard = False
        last_said = 0.0
        try:
            while True:
                if self.stop_requested > stops_sent:
                    self._send_stop(proc)
                    stops_sent = self.stop_requested
                if time.monotonic() - last_said >= ALIVE_EVERY_S:  # what keeps the engine up there (agent.follow)
                    self._say(proc, b"alive\n")
                    last_said = time.monotonic()
                try:
                    raw = lines.get(timeout=0.2)
                except queue.Empty:
                    if time.monotonic() - last_heard > (SILENT_LIMIT_S if heard else FIRST_LINE_S):
                        return "dropped"
                    continue
                except KeyboardInterrupt:  # where interrupts are not counted (interrupts_counted): sent above
                    self.stop_requested += 1
                    continue
                if raw is None:
                    proc.wait()
                    if proc.returncode == LINK_FAILED or not self.conn.master_alive:
                        return "dropped"
                    stderr = _last(proc.stderr.read() if proc.stderr else b"")
                    why = stderr.removeprefix('error: ') or 'the follower ended without the exit line'
                    return f"{'nojob' if proc.returncode == NO_JOB else 'lost'}:{why}"
                last_heard = self.last_heard = time.monotonic()
                heard = True
                event = decode(raw)
                if event is None:  # still a line of the file (one a full disk tore): counted, so a resume is exact
                    self.offset += len(raw)
                    continue
                kind = event["k"]
                if kind == "beat":
                    continue
                if kind == "job":  # the job's own policy: `attach` does not know it otherwise
                    self.options.on_disconnect = str(event.get("on_disconnect", self.options.on_disconnect))
                    self.options.grace_s = float(event.get("grace_s", self.options.grace_s))
                    continue
                if kind == "lost":
                    proc.wait()
                    return f"lost:{event.get('why', 'the remote servelab is gone')}"
                self.offset += len(raw)
                if kind == "exit":
                    self.exit_code = int(event.get("code") or 0)
                    proc.wait()
                    return "exit"
                try:
                    on_event(event)
                except KeyboardInterrupt:
                    self.stop_requested += 1
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdin, proc.stderr):  # stdout: the reading thread's, closed at its end
                if pipe is not None:
                    pipe.close()

    def _send_stop(self, proc: subprocess.Popen) -> None:
        self._say(proc, b"stop\n")  # when the link is going, the stop is sent again once it is back

    @staticmethod
    def _say(proc: subprocess.Popen, line: bytes) -> None:
        try:
            assert proc.stdin is not None
            proc.stdin.write(line)
            proc.stdin.flush()
        except (OSError, AssertionError):
            pass

    def _reconnect(self, on_note: Callable[[str], None]) -> None:
        """Back within the grace period, or UserError saying what became of the engine."""
        started = time.monotonic()
        if gone := lost_for_good(self.conn):
            raise UserError(f"on {self.conn.target}: {gone}: {self._fate(coming=True)}")
        on_note(f"the connection to {self.conn.target} dropped; reconnecting (the far side waits "
                f"{self.options.grace_s:g} s for a controller)")
        while (left := self.options.grace_s - (time.monotonic() - started)) > 0:
            # each try within what is left of the grace, not ssh's own ConnectTimeout: a host that accepts but
            # never answers (gone, or its sshd hung) must not hold a 2 s grace for 20
            if self.conn.reconnect(wait_s=max(left, 1.0)):
                on_note(f"reconnected to {self.conn.target} after {time.monotonic() - started:.1f} s; following "
                        f"again")
                return
            if gone := lost_for_good(self.conn):  # a link that cannot come back: no use waiting out the grace
                raise UserError(f"on {self.conn.target}: {gone}: {self._fate(coming=True)}")
            time.sleep(RECONNECT_EVERY_S)
        raise UserError(f"lost {self.conn.target} for {self.options.grace_s:g} s: {self._fate()}")

    def _fate(self, coming: bool = False) -> str:
        """What became of the engine there; `coming`: what will, the grace period not yet over."""
        if self.options.on_disconnect == "stop":
            if coming:
                return (f"the job there stops the engine once it has heard from no controller for "
                        f"{self.options.grace_s:g} s, as --on-disconnect stop says")
            return "it has stopped the engine there, as --on-disconnect stop says"
        return (f"the engine keeps running there (--on-disconnect keep): `servelab attach "
                f"{attach_target(self.conn)} {self.dir}` follows it again")

    def fetch(self, path: str, into: Path, on_note: Callable[[str], None] | None = None) -> list[str]:
        """Copy DIR/path into `into`, checked against the far side's manifest before anything is kept; the files
        copied (relative to `into`). A connection that drops during the copy is reconnected (within the grace
        period) and the copy made again from its start: the results are safe there meanwhile."""
        tries = 1
        while True:
            try:
                return self._fetch_once(path, into)
            except UserError:
                if tries == FETCH_TRIES or self._link_up():
                    raise  # with the link up, the copy itself is wrong (it does not match): never used
            tries += 1
            self._reconnect(on_note or (lambda _text: None))

    def _link_up(self) -> bool:
        """Whether the connection still stands, asked a moment after a copy broke off: the master notices a
        dropped link a little after the copy's own stream does."""
        time.sleep(0.5)
        return self.conn.master_alive and self.conn.check()

    def _fetch_once(self, path: str, into: Path) -> list[str]:
        into.parent.mkdir(parents=True, exist_ok=True)
        # a directory of this copy's own: two `bench --on` into one --out must not share (and remove) one
        staging = Path(tempfile.mkdtemp(prefix=f".{into.name}.incoming-", dir=into.parent))
        try:
            proc = self.conn.popen(self.remote("pack", self.dir, path))
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.close()
            names = _untar(proc.stdout, staging)
            proc.wait()
            if proc.returncode != 0:
                stderr = _last(proc.stderr.read() if proc.stderr else b"")
                raise UserError(f"copying {path} back from {self.conn.target} failed: "
                                f"{stderr.removeprefix('error: ') or f'exit status {proc.returncode}'}")
            files = _check_manifest(staging, names, self.conn.target)
            into.mkdir(parents=True, exist_ok=True)
            for name in files:
                target = into / name
                target.parent.mkdir(parents=True, exist_ok=True)
                (staging / name).replace(target)
            return files
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _untar(stream, into: Path) -> list[str]:
    names = []
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                tar.extract(member, into, filter="data")  # no absolute paths, no .., no links out
                names.append(member.name)
    except (tarfile.TarError, OSError) as exc:
        raise UserError(f"the copy from the far side broke off: {exc}") from None
    return names


def _check_manifest(staging: Path, names: list[str], target) -> list[str]:
    """The files of a whole, untampered copy: the manifest names exactly the files the tar held (plain relative
    paths), each of its size and SHA-256."""
    try:
        manifest = json.loads((staging / MANIFEST).read_text())
    except (OSError, ValueError):
        raise UserError(f"the copy from {target} has no manifest: it broke off before its end") from None
    if not isinstance(manifest, dict):
        raise UserError(f"the copy from {target} has a manifest that is not one: not used")
    for name in manifest:
        parts = PurePosixPath(name).parts
        if not parts or PurePosixPath(name).is_absolute() or ".." in parts or name != PurePosixPath(name).as_posix():
            raise UserError(f"the copy from {target} names a file outside its directory ({name!r}): not used")
    held = set(names) - {MANIFEST}
    if held != set(manifest):
        extra = sorted(held ^ set(manifest))[:3]
        raise UserError(f"the copy from {target} and its manifest disagree on which files it holds ({extra}): "
                        f"not used")
    for name, want in manifest.items():
        path = staging / name
        if not path.is_file():
            raise UserError(f"the copy from {target} lacks {name}: it broke off")
        if file_digest(path) != (want.get("sha256"), want.get("size")):
            raise UserError(f"{name} copied from {target} does not match its SHA-256: not used")
    return sorted(manifest)
