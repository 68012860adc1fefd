"""The link to a Ray node chosen by resources (`--on ray:GPU=8`): an actor that holds those resources for the
whole command and runs the far side's `servelab remote …` commands on its node as subprocesses.

Nothing else of the remote path changes: the controller (controller.py) starts the same detached job there
(agent.py, worker.py: ~/.servelab/remote/<id>, events.jsonl, the watchdog on controller.alive), follows it with
the same alive lines and stops, and copies its results back through the same `remote pack` and its SHA-256
manifest. The actor only carries bytes: a command run to its end (`run`), or one streamed (`open`, then `read`
by offset, `write` for its stdin), each relayed here by a thread into a pipe, so the controller reads a file as it
reads ssh's stdout.

Why an actor and not a Ray task or job: the actor is the reservation. Ray counts the GPUs it holds as taken for
as long as it lives, and gives the command's processes the ones it chose (CUDA_VISIBLE_DEVICES, which they
inherit; empty when it holds none; their environment is otherwise the node's, not the one Ray gives its
workers). So when the actor is gone (killed, its node lost, this side's driver dead, which takes its actors with
it) the job there hears no controller any more, since only the actor relayed the alive lines, and its watchdog
stops the engine once the grace period is over, as over SSH. The controller does not place a new actor then: the
GPUs the old one held are Ray's again, and something else may have them by now.

Where the placement cannot be had: no cluster, or no node with those resources at all, is one line at once; a
node that has them but has them busy is waited for, a bounded time (SERVELAB_RAY_PLACE_WAIT_S, default 60 s), and
then one line too: Ray would leave the actor pending forever.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from servelab.errors import UserError
from servelab.ray_support import first_line, import_ray, join
from servelab.remote.link import LINK_FAILED
from servelab.remote.placement import RayPlacement

NAMESPACE = "servelab"  # the actors' namespace: `ray list actors` shows them as servelab-link-…
PLACE_WAIT_VAR = "SERVELAB_RAY_PLACE_WAIT_S"
PLACE_WAIT_S = 60.0
CALL_TIMEOUT_S = 30.0  # an actor that has not answered a call by then is as good as a dropped link
READ_WAIT_S = 1.0  # how long one read waits there for new bytes (a long poll)
CHUNK = 1 << 20  # bytes per read at most
BUFFERED_MAX = 64 << 20  # bytes a stream holds there unread before its command is made to wait
STDERR_MAX = 64 << 10


# ---- the far side: the actor and its streams -------------------------------------------------------------------


def _here(argv: Sequence[str]) -> list[str]:
    """`servelab …` as this node runs it: the actor's own interpreter, which has servelab (it imported this
    module), rather than a `servelab` a worker's PATH may lack. --remote-python's interpreter is used as given."""
    argv = list(argv)
    if argv[:1] == ["servelab"]:
        return [sys.executable, "-m", "servelab.cli", *argv[1:]]
    return argv


@contextlib.contextmanager
def _signals_as_usual() -> Iterator[None]:
    """No signal blocked in the processes started within. Ray's threads block SIGINT, and a child inherits the
    signal mask of the thread that forked it: the detached job would never hear the Ctrl-C its watchdog sends
    itself when the controller is gone, nor the engine the signals that stop it. The mask is this thread's alone,
    cleared around the fork and put back after (not a preexec_fn: Python code between fork and exec is unsafe in
    a process with threads, as the actor is)."""
    import signal

    before = signal.pthread_sigmask(signal.SIG_SETMASK, set())
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


# What Ray sets in its workers' environments for Ray's own sake, and not for the commands the actor starts: the
# engine and bench there are to run as over SSH. OMP_NUM_THREADS=1 is Ray's for a worker holding no CPU (the
# actor's default), which would make a CPU engine single-threaded; PYTHONBREAKPOINT (Ray's debugger), SPT_NOENV
# (its process titles) and RAY_* (RAY_JOB_ID, RAY_RAYLET_PID, ...) are its workers' bookkeeping.
_RAYS_OWN = ("OMP_NUM_THREADS", "PYTHONBREAKPOINT", "SPT_NOENV")
_RAYS_PREFIX = "RAY_"
# Where the raylet's environment cannot be read: the ones Ray is known to add for a worker.
_RAYS_WORKER_ONLY = {"RAY_JOB_ID", "RAY_RAYLET_PID", "SPT_NOENV"}


def _node_environ() -> dict[str, str] | None:
    """The environment the node's raylet runs with (the actor's parent): what the user started Ray with."""
    try:
        with open(f"/proc/{os.getppid()}/comm") as comm:
            if "raylet" not in comm.read():
                return None
        with open(f"/proc/{os.getppid()}/environ", "rb") as environ:
            raw = environ.read()
    except OSError:
        return None
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def _far_env(gpu_ids: Sequence[Any]) -> dict[str, str]:
    """The environment of the processes the actor starts: its own, less what Ray set for its workers (each put
    back as the node's raylet, the actor's parent, had it: the environment the user started Ray with);
    CUDA_VISIBLE_DEVICES as Ray gave it, and empty when the actor holds no GPU (Ray leaves it unset then, and an
    engine would see every GPU of the node while holding none)."""
    env = dict(os.environ)
    node = _node_environ()
    for key in [k for k in env if k in _RAYS_OWN or k.startswith(_RAYS_PREFIX)]:
        if node is None:
            if (key in _RAYS_WORKER_ONLY or key == "OMP_NUM_THREADS" and env[key] == "1"
                    or key == "PYTHONBREAKPOINT" and env[key].startswith("ray.")):
                del env[key]
        elif key not in node:
            del env[key]
        else:
            env[key] = node[key]
    if not gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


class _Stream:
    """One streamed command there: its stdout gathered by a thread, read from here by offset; what was read is
    dropped, and a reader that falls BUFFERED_MAX behind holds the command up (its pipe fills), never the
    actor's memory."""

    def __init__(self, proc: subprocess.Popen | None, error: bytes = b"", code: int = 127):
        self.proc = proc
        self.buffer = bytearray()
        self.base = 0  # the offset of buffer[0]
        self.stderr = bytearray(error)
        self.done = proc is None
        self.abandoned = False  # killed from this side: nobody reads the rest
        self.code: int | None = code if proc is None else None
        self.changed = threading.Condition()
        if proc is not None:
            self._err = threading.Thread(target=self._read_err, daemon=True)
            self._err.start()
            threading.Thread(target=self._read_out, daemon=True).start()

    def _read_err(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while chunk := self.proc.stderr.read1(65536):
            with self.changed:
                self.stderr += chunk
                del self.stderr[:-STDERR_MAX]

    def _read_out(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while chunk := self.proc.stdout.read1(65536):
            with self.changed:
                while len(self.buffer) > BUFFERED_MAX and not self.abandoned:
                    self.changed.wait(1.0)
                if not self.abandoned:
                    self.buffer += chunk
                self.changed.notify_all()
        code = self.proc.wait()
        self._err.join(10)
        with self.changed:
            self.code, self.done = code, True
            self.changed.notify_all()

    def read(self, offset: int, wait_s: float, limit: int) -> tuple[bytes, bool, int | None, bytes]:
        with self.changed:
            if offset > self.base:  # the reader has these: they need not be kept
                del self.buffer[:offset - self.base]
                self.base = offset
                self.changed.notify_all()
            if not self.buffer and not self.done:
                self.changed.wait(wait_s)
            data = bytes(self.buffer[:limit])
            ended = self.done and len(data) == len(self.buffer)
            return data, ended, self.code if ended else None, bytes(self.stderr) if ended else b""

    def write(self, data: bytes) -> bool:
        try:
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError, AssertionError):
            return False

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.proc.stdin.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()
        with self.changed:
            self.abandoned = True
            self.buffer.clear()
            self.changed.notify_all()


class LinkActor:
    """The actor on the chosen node (threaded: a read waiting for bytes must not hold up a write)."""

    def __init__(self) -> None:
        import ray

        self._streams: dict[str, _Stream] = {}
        self._killed: set[str] = set()
        self._lock = threading.Lock()
        self._env = _far_env(ray.get_gpu_ids())

    def where(self) -> dict[str, Any]:
        import socket

        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "host": socket.gethostname(), "pid": os.getpid(), "python": sys.executable,
                "gpus": self._env.get("CUDA_VISIBLE_DEVICES")}

    def ping(self) -> bool:
        return True

    def run(self, argv: list[str], stdin: bytes | None, timeout_s: float) -> tuple[int, bytes, bytes]:
        try:
            with _signals_as_usual():
                proc = subprocess.Popen(_here(argv), stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self._env)
        except OSError as exc:
            code, err = _not_started(argv, exc)
            return code, b"", err
        try:
            out, err = proc.communicate(stdin, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return 124, b"", f"error: did not end within {timeout_s:g} s".encode()
        return proc.returncode, out, err

    def open(self, sid: str, argv: list[str]) -> None:
        """Start a streamed command under `sid`, the name this side gave it: so a stream this side stopped
        waiting for can still be killed by it."""
        try:
            with _signals_as_usual():
                stream = _Stream(subprocess.Popen(_here(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                  stderr=subprocess.PIPE, env=self._env))
        except OSError as exc:
            code, err = _not_started(argv, exc)
            stream = _Stream(None, err, code)
        with self._lock:
            killed = sid in self._killed
            if not killed:
                self._streams[sid] = stream
        if killed:  # this side gave up on it before it started
            stream.kill()

    def read(self, sid: str, offset: int, wait_s: float, limit: int) -> tuple[bytes, bool, int | None, bytes]:
        stream = self._streams.get(sid)
        if stream is None:
            return b"", True, LINK_FAILED, b"no such stream"
        answer = stream.read(offset, wait_s, limit)
        if answer[1]:
            with self._lock:
                self._streams.pop(sid, None)
        return answer

    def write(self, sid: str, data: bytes) -> bool:
        stream = self._streams.get(sid)
        return stream.write(data) if stream is not None else False

    def close_stdin(self, sid: str) -> None:
        if (stream := self._streams.get(sid)) is not None:
            stream.close_stdin()

    def kill(self, sid: str) -> None:
        with self._lock:
            stream = self._streams.pop(sid, None)
            if stream is None:
                self._killed.add(sid)  # not open yet (or ended): an open that comes after is killed at once
        if stream is not None:
            stream.kill()


def _not_started(argv: Sequence[str], exc: OSError) -> tuple[int, bytes]:
    """A command that could not be started, as a shell says it: 127 for one not there, 126 for one that cannot
    be run (a --remote-python that is not executable), with the reason."""
    if isinstance(exc, FileNotFoundError):
        return 127, f"{argv[0]}: command not found".encode()
    return 126, f"{argv[0]}: {exc.strerror or exc}".encode()


# ---- this side: the link, and a streamed command as a Popen-like object -----------------------------------------


class _LinkDown(Exception):
    pass


class _StdinRelay:
    """A streamed command's stdin: each write a call on the actor, not waited for (an alive line twice a second
    must not wait on a slow link; a lost one is the next one's to make up)."""

    def __init__(self, actor: Any, sid: str, opened: bool = True):
        self.actor, self.sid, self.closed = actor, sid, not opened

    def write(self, data: bytes) -> int:
        if self.closed:
            raise OSError("closed")
        try:
            self.actor.write.remote(self.sid, bytes(data))
        except Exception as exc:  # noqa: BLE001 - Ray's, for an actor it knows is gone: a write that failed
            raise OSError(str(exc)) from None
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self.actor.close_stdin.remote(self.sid)


class RayProcess:
    """A command streamed from the actor, with what the controller uses of Popen: stdin, stdout (a pipe a thread
    here fills from the actor's reads), stderr (once it ended), poll, wait, kill, returncode. LINK_FAILED when
    the actor stopped answering under it."""

    def __init__(self, link: RayLink, sid: str, opened: bool = True):
        self.link, self.sid, self.actor = link, sid, link.actor  # the actor's handle, kept: close() drops the link's
        self.opened = opened  # False: `open` got no answer in time (the command may have started there anyway)
        read_end, self._write_end = os.pipe()
        self.stdout = os.fdopen(read_end, "rb")
        self.stdin = _StdinRelay(self.actor, sid, opened)
        self.stderr: io.BytesIO | None = None
        self.returncode: int | None = None
        self._stopping = threading.Event()
        self._done = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        code, err, offset, ended = LINK_FAILED, b"", 0, False
        try:
            while self.opened and not self._stopping.is_set():
                try:
                    data, ended, status, stderr = self.link.get(
                        self.actor.read.remote(self.sid, offset, READ_WAIT_S, CHUNK),
                        READ_WAIT_S + CALL_TIMEOUT_S, self._stopping)
                except Exception:  # noqa: BLE001 - _LinkDown, or Ray's own at once (its runtime shut down): gone
                    break
                view = memoryview(data)
                while view:
                    view = view[os.write(self._write_end, view):]
                offset += len(data)
                if ended:
                    code, err = (status if status is not None else LINK_FAILED), stderr
                    break
            if self._stopping.is_set() and code == LINK_FAILED:
                code = -9
        except OSError:  # the reader closed its end: nobody wants the rest
            code = -9
        finally:
            if not ended:  # the command there may live on, its output held for a reader that is gone: killed
                self._kill_there()
            os.close(self._write_end)
            self.stderr = io.BytesIO(err)
            self.returncode = code
            self._done.set()

    def poll(self) -> int | None:
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired("ray link", timeout or 0)
        return self.returncode

    def kill(self) -> None:
        # Even once the pump is done: a pump that ended on an error left the command there running
        self._kill_there()
        self._stopping.set()

    def _kill_there(self) -> None:
        """The command there killed and its stream dropped, not waited for (the actor may be gone)."""
        with contextlib.suppress(Exception):
            self.actor.kill.remote(self.sid)


class RayLink:
    """The link controller.py talks to for `--on ray:…` (link.py's Link): one actor, placed by `placement`'s
    resources, for the `with` it is open in."""

    def __init__(self, placement: RayPlacement):
        self.target = placement
        self.ray = import_ray()
        self.actor: Any = None
        self.name = f"servelab-link-{uuid.uuid4().hex[:12]}"
        self.node: dict[str, Any] = {}
        self._dead: str | None = None
        self._started_ray = False

    @classmethod
    @contextlib.contextmanager
    def open(cls, placement: RayPlacement) -> Iterator[RayLink]:
        link = cls(placement)
        try:
            link.start()
            yield link
        finally:
            link.close()

    # where it runs, as the notes and `attach` name it
    @property
    def host(self) -> str:
        return str(self.node.get("ip") or self.target)

    @property
    def attach_target(self) -> str | None:
        return f"ssh://{self.node['ip']}" if self.node.get("ip") else None

    @property
    def placed_note(self) -> str:
        gpus = self.node.get("gpus")
        shown = (f" (CUDA_VISIBLE_DEVICES={gpus})" if gpus else
                 ' (CUDA_VISIBLE_DEVICES="", no GPU held)' if gpus == "" else "")
        return (f"placed on Ray node {self.node.get('ip')} ({self.node.get('host')}), actor {self.name} in "
                f"namespace {NAMESPACE}, holding {self.target}" + shown)

    def start(self) -> None:
        self._join()
        self._check_feasible()
        ray = self.ray
        actor_class = ray.remote(max_concurrency=16, max_restarts=0)(LinkActor)
        try:
            self.actor = actor_class.options(name=self.name, namespace=NAMESPACE,
                                             **self.target.actor_options()).remote()
        except Exception as exc:  # noqa: BLE001 - Ray refuses options of many kinds
            raise UserError(f"Ray refused an actor for {self.target}: {first_line(exc)}") from None
        where = self.actor.where.remote()
        wait_s = _place_wait_s()
        ready, _ = ray.wait([where], timeout=wait_s)
        if not ready:
            self._kill_actor()
            raise UserError(f"no node of the Ray cluster had {self.target} free within {wait_s:g} s: the nodes "
                            f"that have them are busy",
                            hint=f"`ray status` shows what holds them; {PLACE_WAIT_VAR}=SECONDS waits longer")
        try:
            self.node = ray.get(where)
        except Exception as exc:  # noqa: BLE001 - the actor could not start there (servelab missing on the node)
            self._kill_actor()
            raise UserError(f"the Ray actor for {self.target} did not start on its node: {first_line(exc)}",
                            hint="servelab must be installed on every node of the cluster, in the same Python "
                                 "version (pip install 'servelab[ray]')") from None

    def _join(self) -> None:
        """Join the cluster RAY_ADDRESS names, else the one `ray start` made on this host; never start one (a
        cluster of this laptop alone has no GPU node). A runtime already up in this process is used as is."""
        ray = self.ray
        if ray.is_initialized():
            return
        address = os.environ.get("RAY_ADDRESS") or "auto"
        hint = ("start one (`ray start --head`, then `ray start --address HEAD:6379` on each GPU node) or set "
                "RAY_ADDRESS to its address")
        join(ray, address, str(self.target), hint)
        self._started_ray = True

    def _check_feasible(self) -> None:
        """A placement no node could ever hold, said at once (Ray would leave its actor pending for ever): which
        resources no node has, and the most one has."""
        nodes = [n.get("Resources") or {} for n in self.ray.nodes() if n.get("Alive")]
        wanted = self.target.wanted
        if any(all(node.get(k, 0) >= v for k, v in wanted.items()) for node in nodes):
            return
        short = [k for k, v in wanted.items() if not any(node.get(k, 0) >= v for node in nodes)]
        if not short:
            raise UserError(f"no node of the Ray cluster has all of {self.target} at once (each resource is on "
                            f"some node, not all of them on one)",
                            hint="name fewer resources, or start a node that has them all")

        def most(k: str) -> str:
            return f"{k}={max((node.get(k, 0) for node in nodes), default=0):g}"

        raise UserError(f"no node of the Ray cluster has {', '.join(f'{k}={wanted[k]:g}' for k in short)} "
                        f"({len(nodes)} node{'s' if len(nodes) != 1 else ''}; the most any has: "
                        f"{', '.join(most(k) for k in short)})",
                        hint="`ray status` lists what the nodes have; a custom resource is one a node was started "
                             "with (ray start --resources '{\"NAME\": N}')")

    def get(self, ref, timeout_s: float, stop: threading.Event | None = None):
        """A call's answer, waited for in short steps (so `stop` is heard); _LinkDown when the actor is gone or
        has not answered within `timeout_s`."""
        ray = self.ray
        deadline = time.monotonic() + timeout_s
        while True:
            ready, _ = ray.wait([ref], timeout=0.2)
            if ready:
                try:
                    return ray.get(ref)
                except ray.exceptions.ActorDiedError as exc:
                    self._dead = first_line(exc)
                    raise _LinkDown(self._dead) from None
                except ray.exceptions.RayError as exc:
                    raise _LinkDown(first_line(exc)) from None
            if (stop is not None and stop.is_set()) or time.monotonic() > deadline:
                raise _LinkDown("no answer")

    # Link's methods
    def run(self, remote: Sequence[str], timeout_s: float = 60.0,
            stdin: bytes | None = None) -> subprocess.CompletedProcess:
        try:
            code, out, err = self.get(self.actor.run.remote(list(remote), stdin, timeout_s),
                                      timeout_s + CALL_TIMEOUT_S)
        except _LinkDown as down:
            raise UserError(f"`{shlex.join(remote)}` on {self.target} (Ray node {self.host}) got no answer: "
                            f"{down}") from None
        return subprocess.CompletedProcess(list(remote), code, out, err)

    def popen(self, remote: Sequence[str]) -> RayProcess:
        sid = uuid.uuid4().hex  # named here: a stream whose `open` went unanswered can still be killed
        try:
            self.get(self.actor.open.remote(sid, list(remote)), CALL_TIMEOUT_S)
        except _LinkDown:
            return RayProcess(self, sid, opened=False)  # ends with LINK_FAILED at once: the controller reconnects
        return RayProcess(self, sid)

    @property
    def master_alive(self) -> bool:
        return self.actor is not None and self._dead is None

    def check(self, wait_s: float = 5.0) -> bool:
        if not self.master_alive:
            return False
        try:
            return bool(self.get(self.actor.ping.remote(), wait_s))
        except _LinkDown:
            return False

    def reconnect(self, wait_s: float = CALL_TIMEOUT_S) -> bool:
        """The same actor answering again: never a new one (the resources the old one held are not ours)."""
        return self.check(wait_s=min(wait_s, CALL_TIMEOUT_S))

    def lost_for_good(self) -> str | None:
        if self._dead is None:
            return None
        return (f"the Ray actor {self.name} that held {self.target} on node {self.host} is gone "
                f"({self._dead})")

    def _kill_actor(self) -> None:
        actor, self.actor = self.actor, None
        if actor is not None:
            with contextlib.suppress(Exception):
                self.ray.kill(actor)

    def close(self) -> None:
        self._kill_actor()
        if self._started_ray:
            with contextlib.suppress(Exception):
                self.ray.shutdown()
            self._started_ray = False


def _place_wait_s() -> float:
    try:
        return max(float(os.environ.get(PLACE_WAIT_VAR) or PLACE_WAIT_S), 0.1)
    except ValueError:
        raise UserError(f"{PLACE_WAIT_VAR} must be a number of seconds") from None
