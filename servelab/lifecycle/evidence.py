"""Liveness evidence: cheap looks (~1/s) at a starting engine's process tree, log, port and GPUs.

Why so many signals: no single one tells slow from hung. A loading engine can be silent in its log for minutes
(tqdm rewrites one line; rank 0 alone prints it), sit at 0 % GPU with 100+ threads parked in futex waits (reader
pools waiting on I/O), and still be fine, because its read counters, its tqdm counter or its GPU memory move.
Each reading here is best effort: a counter that cannot be read (another user's process, no NVML) is None and
simply cannot count as movement.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from servelab.host.gpus import Nvml
from servelab.records import EvidenceSample

# --------------------------------------------------------------------------------------------------------------
# /proc readers
# --------------------------------------------------------------------------------------------------------------

def thread_states(pid: int) -> tuple[Counter[str], int]:
    """(count of threads by state letter, threads waiting in a futex) for one process, from /proc/<pid>/task.

    The state is the field after the command name in `stat` (R running, S sleeping, D uninterruptible I/O, ...);
    `wchan` names the kernel function a sleeping thread waits in (`futex_do_wait` and friends for pthread locks,
    condition variables and Python's threading.Event).
    """
    states: Counter[str] = Counter()
    futex = 0
    task_dir = f"/proc/{pid}/task"
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return states, 0
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/stat", "rb") as fh:
                stat = fh.read()
            states[chr(stat[stat.rindex(b")") + 2])] += 1
        except (OSError, ValueError, IndexError):
            continue
        try:
            with open(f"{task_dir}/{tid}/wchan", "rb") as fh:
                if b"futex" in fh.read():
                    futex += 1
        except OSError:
            pass
    return states, futex


def port_state(host: str, port: int, timeout_s: float = 0.2) -> str:
    """'open' when something accepts a TCP connection on host:port, else 'closed'."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return "open"
    except OSError:
        return "closed"


# --------------------------------------------------------------------------------------------------------------
# The sampler
# --------------------------------------------------------------------------------------------------------------

@dataclass
class LogCounters:
    """What the log reader knows, handed to each sample: the sampler itself never parses the log."""

    lines: int = 0  # lines that can mean progress
    phase: str | None = None
    progress: float | None = None


@dataclass
class EvidenceSampler:
    """Samples one process tree (root `pid`), an optional log file and an optional port."""

    pid: int | None
    log_path: Path | None = None
    host: str | None = None
    port: int | None = None
    gpu: Nvml | None = None
    samples: list[EvidenceSample] = field(default_factory=list)
    _seen: dict[int, psutil.Process] = field(default_factory=dict)
    _exited: set[int] = field(default_factory=set)
    _root: psutil.Process | None = None

    def __post_init__(self) -> None:
        if self.pid is not None:
            try:
                self._root = psutil.Process(self.pid)
            except psutil.Error:
                self._root = None
        if self.gpu is None:
            self.gpu = Nvml()

    def tree(self) -> list[psutil.Process]:
        """The root and its live descendants; remembers members so that their exit can be counted."""
        if self._root is None:
            return []
        try:
            members = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            members = []
        live = []
        for proc in members:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
            except psutil.Error:
                continue
            self._seen.setdefault(proc.pid, proc)
            live.append(proc)
        live_pids = {p.pid for p in live}
        self._exited |= {pid for pid in self._seen if pid not in live_pids}
        return live

    def sample(self, t_s: float, log: LogCounters | None = None, probe: str | None = None) -> EvidenceSample:
        log = log or LogCounters()
        procs = self.tree()
        cpu = read_b = read_c = rss = threads = 0
        cpu_ok = io_ok = mem_ok = False
        states: Counter[str] = Counter()
        futex = 0
        for proc in procs:
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    cpu += times.user + times.system
                    cpu_ok = True
                    mem = proc.memory_info()
                    rss += mem.rss
                    mem_ok = True
                    threads += proc.num_threads()
            except psutil.Error:
                continue
            try:
                io = proc.io_counters()
                read_b += io.read_bytes
                read_c += getattr(io, "read_chars", 0)
                io_ok = True
            except (psutil.Error, AttributeError, NotImplementedError):
                pass
            by_state, in_futex = thread_states(proc.pid)
            states += by_state
            futex += in_futex
        gpu_mem, gpu_util = self.gpu.memory_of({p.pid for p in procs}) if self.gpu else (None, None)
        sample = EvidenceSample(
            t_s=round(t_s, 3), phase=log.phase, progress=log.progress,
            log_bytes=_size(self.log_path), log_lines=log.lines,
            cpu_s=round(cpu, 3) if cpu_ok else None,
            read_bytes=read_b if io_ok else None, read_chars=read_c if io_ok else None,
            rss_bytes=rss if mem_ok else None, threads=threads if procs else None,
            thread_states=dict(sorted(states.items())), threads_in_futex=futex if procs else None,
            processes=len(procs) if self._root is not None else None, processes_exited=len(self._exited),
            port=port_state(self.host, self.port) if self.host and self.port else None, probe=probe,
            gpu_memory_bytes=gpu_mem, gpu_util_percent=gpu_util,
        )
        self.samples.append(sample)
        return sample

    def close(self) -> None:
        if self.gpu is not None:
            self.gpu.close()


def _size(path: Path | None) -> int | None:
    if path is None:
        return None
    try:
        return os.stat(path).st_size
    except OSError:
        return None
