"""The replay engine's process tree, and what each process is doing, so that its Python stacks read like the real
engine's (servelab/engines/replay_frames/).

The leader (the HTTP server, as SGLang's and vLLM's main process) forks the tree before any thread exists:
SGLang: one `sglang::scheduler_TP<n>` per TP rank and a `sglang::detokenizer`; vLLM: a `VLLM::EngineCore_DP0`
and one `VLLM::Worker_TP<n>` per rank. Each child runs the stand-in of its real entry point (run_scheduler_process,
WorkerProc.worker_main, ...) on its main thread. The stand-ins follow the real call chain, so a rank that is
loading weights sits in DefaultModelLoader.load_model with its loader threads in the weights iterator, reading the
model file; one that captures graphs sits in CudaGraphRunner.capture; one that is ready sits in its request loop.

The leader's timeline (replay.py) tells every child where the start-up is with one line per change on a pipe:
a phase (PHASES) or `freeze` (a hang: every wait blocks for ever where it is, so the stacks stop changing). A
child exits when the pipe closes: the leader died, however it died.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

FRAMES = Path(__file__).parent / "replay_frames"
# Where the start-up is, in order. serve: the schedulers are up (their request loops run) but the server is not
# yet taking requests; warmup: the server's own warm-up request is running a batch; decode-hang (hang-in-decode):
# a batch that never ends, its ranks in collectives that never complete.
PHASES = ("init", "load", "kv", "graph", "serve", "warmup", "ready", "decode-hang")
READ_CHUNK = 64 << 10  # what one loader read takes from the model file; small: the cores are shared
READ_PAUSE_S = 0.04  # between two reads of one loader thread: ~1.6 MB/s each, a few tens of MB/s a tree


class StartupState:
    """One process's view of the start-up: the phase, and whether everything is frozen (a hang)."""

    READ_CHUNK, READ_PAUSE_S = READ_CHUNK, READ_PAUSE_S

    def __init__(self, engine: str, role: str, rank: int, tp: int, variant: str, model_file: str | None):
        self.engine, self.role, self.rank, self.tp, self.variant = engine, role, rank, tp, variant
        self.model_file = model_file if model_file and os.path.isfile(model_file) else None
        self.phase = "init"
        self.frozen = False
        self._changed = threading.Condition()

    def set_phase(self, phase: str) -> None:
        with self._changed:
            if phase == "freeze":
                self.frozen = True
            else:
                self.phase = phase
            self._changed.notify_all()

    def in_phase(self, *phases: str) -> bool:
        return self.phase in phases

    def wait_while(self, *phases: str, timeout: float | None = None) -> str:
        """Block while the phase is one of `phases` (for ever once frozen); the phase it moved to."""
        with self._changed:
            while self.frozen or self.phase in phases:
                if not self._changed.wait(timeout) and timeout is not None and not self.frozen:
                    break
            return self.phase

    def peers_never_join(self) -> bool:
        """A collective called now never completes: the variants where the ranks disagree on which one."""
        return self.variant == "deadlock-at-init" or self.phase == "decode-hang"

    def hold(self) -> None:
        """Where a frozen process stops: here, for ever, in the frame that called it."""
        if self.frozen:
            self.hang()

    def hang(self) -> None:
        threading.Event().wait()

    def open_model(self) -> int | None:
        return os.open(self.model_file, os.O_RDONLY) if self.model_file else None


def set_title(title: str) -> None:
    """Name the process as the engine does (setproctitle, as SGLang and vLLM call it). Without the setproctitle
    package, the kernel's process name (/proc/PID/comm: what ps and top show, 15 bytes) and the main thread's."""
    threading.current_thread().name = title
    try:
        import setproctitle  # type: ignore[import-not-found]

        setproctitle.setproctitle(title)
        return
    except ImportError:
        pass
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, title.encode()[:15] + b"\0", 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def frames() -> None:
    """Put the stand-ins first on sys.path, in this (replay) process only: `import sglang` here is the stand-in."""
    if str(FRAMES) not in sys.path:
        sys.path.insert(0, str(FRAMES))


def children_of(engine: str, tp: int) -> list[tuple[str, int, str]]:
    """(role, rank, title) of each child the leader forks, as the engine's own tree has them."""
    if engine == "vllm":
        return [("engine_core", 0, "VLLM::EngineCore_DP0"),
                *[("worker", r, f"VLLM::Worker_TP{r}") for r in range(tp)]]
    return [*[("scheduler", r, f"sglang::scheduler_TP{r}") for r in range(tp)],
            ("detokenizer", 0, "sglang::detokenizer")]


def entry_point(state: StartupState) -> Callable[[StartupState], None]:
    """The stand-in of the real engine's entry point for this process's role."""
    frames()
    module, function = {
        ("sglang", "scheduler"): ("sglang.srt.managers.scheduler", "run_scheduler_process"),
        ("sglang", "detokenizer"): ("sglang.srt.managers.detokenizer_manager", "run_detokenizer_process"),
        ("sglang", "leader"): ("sglang.srt.entrypoints.http_server", "launch_server"),
        ("vllm", "engine_core"): ("vllm.v1.engine.core", "run_engine_core"),
        ("vllm", "worker"): ("vllm.v1.executor.multiproc_executor", "worker_main"),
        ("vllm", "leader"): ("vllm.entrypoints.openai.api_server", "run_server"),
    }[(state.engine, state.role)]
    return getattr(importlib.import_module(module), function)


class ProcessTree:
    """The leader's side: fork the children, tell them the phase, and let them die with it."""

    def __init__(self, engine: str, tp: int, variant: str, model_file: str | None, idle_threads: int,
                 park: Callable[[int], None]):
        self.engine, self.tp, self.variant, self.model_file = engine, tp, variant, model_file
        self.idle_threads, self.park = idle_threads, park
        self.pids: list[int] = []
        self._pipes: list[int] = []  # write ends, held open: a child exits when they close (we died)
        self.phase = "init"

    def fork(self, leader_only: tuple[int, ...] = ()) -> None:
        """One child per role, forked before any thread exists (forking a threaded process copies locks in
        unknown states). `leader_only`: descriptors the children close (the HTTP socket: only the leader listens,
        as only the real engine's HTTP server does)."""
        for role, rank, title in children_of(self.engine, self.tp):
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                for fd in [write_fd, *self._pipes, *leader_only]:  # only the leader keeps a child's pipe open
                    os.close(fd)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the leader's; the child goes with it
                try:
                    self._child(role, rank, title, read_fd)
                except BaseException:
                    traceback.print_exc()  # a bug in a stand-in: said in the log, as an engine's crash would be
                    sys.stderr.flush()
                    os._exit(1)
                os._exit(0)
            os.close(read_fd)
            self.pids.append(pid)
            self._pipes.append(write_fd)

    def _child(self, role: str, rank: int, title: str, read_fd: int) -> None:
        set_title(title)
        state = StartupState(self.engine, role, rank, self.tp, self.variant, self.model_file)
        threading.Thread(target=_follow, args=(read_fd, state), name="replay-phase-feed", daemon=True).start()
        self.park(self.idle_threads)
        entry_point(state)(state)
        state.hang()

    def send(self, phase: str) -> None:
        """Tell every child (a phase, or "freeze"); a child that is gone is skipped."""
        if phase == self.phase:
            return
        self.phase = phase
        for fd in self._pipes:
            try:
                os.write(fd, phase.encode() + b"\n")
            except OSError:
                pass


def _follow(read_fd: int, state: StartupState) -> None:
    """A child's reader of the leader's pipe: each line a phase; end of file: the leader is gone, so are we."""
    buffered = b""
    while True:
        chunk = os.read(read_fd, 256)
        if not chunk:
            os._exit(0)
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            state.set_phase(line.decode())
