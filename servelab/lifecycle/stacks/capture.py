"""Reading the stacks of an engine's process tree with py-spy, several times, every process at once.

Why py-spy (not pystack): it works on these machines as root without gdb, prints JSON (`--json`) that is parsed
rather than scraped, and unwinds native frames (`--native`: NCCL, CUDA, libc waits) as well as Python ones.

Each dump is blocking (py-spy pauses the process for the few milliseconds it takes to unwind it), because native
frames need it: `--native` and `--nonblocking` cannot be combined, and a futex wait only says what it waits for
through its native frames. A process py-spy cannot pause (stopped with SIGSTOP, or being traced) is read again
with `--nonblocking`, which reads its memory without pausing it: Python frames only. A sample dumps every process
at once, each under a subprocess timeout that ends by the sample's deadline (itself within the capture's), and
waits on that one deadline: a process that has not answered by then is "did not answer", so a capture never runs
past its deadline, whatever the number of processes.

What goes wrong is one line per process (`DumpFailure`): py-spy missing, ptrace not permitted, not a Python
process, process gone, no answer in time. The texts py-spy prints for each are matched below (py-spy 0.4).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import psutil

from servelab.records import StackFrame, ThreadStack

PY_SPY_INSTALL = "pip install py-spy"
MAX_PROCESSES = 32  # an 8-rank engine is about a dozen processes; more are read as "not read: over the cap"
PER_PROCESS_TIMEOUT_S = 5.0  # a dump takes tens of milliseconds (a large torch rank longer); 5 s is no answer
_PTRACE_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")


@dataclass
class Dump:
    """One process at one sample: its threads, or why there are none."""

    pid: int
    t_s: float  # time.monotonic() when the dump was asked for
    threads: list[ThreadStack] | None = None
    error: str | None = None
    final: bool = False  # the error will not change with another try (not permitted, not Python, gone)
    native: bool = True  # native frames were read (False: the --nonblocking fallback)
    raw: str = ""  # py-spy's JSON as printed
    cpu_s: float | None = None  # the process's CPU time (user + system) when dumped
    # the bytes it has read (read() and pread(), page cache included: /proc/PID/io rchar) when dumped; None: unread
    read_chars: int | None = None
    stopped: bool = False  # py-spy could not pause it because it is stopped (SIGSTOP, Ctrl-Z)


@dataclass
class Capture:
    """Every process of the tree across the samples."""

    tool: str | None
    pids: list[int]
    commands: dict[int, list[str]] = field(default_factory=dict)
    dumps: dict[int, list[Dump]] = field(default_factory=dict)
    samples: int = 0
    unavailable: str | None = None
    left_out: int = 0  # processes over MAX_PROCESSES


def find_py_spy() -> str | None:
    """py-spy next to the running Python (a venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


@lru_cache(maxsize=4)
def py_spy_version(binary: str) -> str:
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=3)
        return done.stdout.strip() or "py-spy"
    except (OSError, subprocess.SubprocessError):
        return "py-spy"


def process_tree(root_pid: int, limit: int = MAX_PROCESSES) -> tuple[list[int], dict[int, list[str]], int]:
    """The root and its children (recursive), at most `limit`; their command lines; how many were left out."""
    try:
        root = psutil.Process(root_pid)
        members = [root, *root.children(recursive=True)]
    except psutil.Error:
        return [], {}, 0
    commands: dict[int, list[str]] = {}
    for proc in members[:limit]:
        try:
            commands[proc.pid] = proc.cmdline()
        except psutil.Error:
            commands[proc.pid] = []
    return [p.pid for p in members[:limit]], commands, max(0, len(members) - limit)


def capture(root_pid: int, *, samples: int, interval_s: float, deadline_s: float,
            py_spy: str | None = None) -> Capture:
    """`samples` dumps of every process of the tree, `interval_s` apart, all within `deadline_s`."""
    started = time.monotonic()
    binary = py_spy or find_py_spy()
    if binary is None:
        return Capture(tool=None, pids=[], unavailable=f"py-spy is not installed: {PY_SPY_INSTALL}")
    pids, commands, left_out = process_tree(root_pid)
    if not pids:
        return Capture(tool=py_spy_version(binary), pids=[],
                       unavailable=f"no process with pid {root_pid}: it has exited")
    result = Capture(tool=py_spy_version(binary), pids=pids, commands=commands, left_out=left_out,
                     dumps={pid: [] for pid in pids})
    end = started + deadline_s
    # one thread per process (at most MAX_PROCESSES): a sample's dumps all start at once and all end by one
    # deadline, however many processes there are and however many of them do not answer
    pool = ThreadPoolExecutor(max_workers=len(pids), thread_name_prefix="py-spy")
    try:
        for index in range(max(1, samples)):
            if index:
                wait = started + index * interval_s - time.monotonic()
                if time.monotonic() + max(wait, 0.0) + 0.2 > end:
                    break  # no time for another sample: the ones taken stand
                if wait > 0:
                    time.sleep(wait)
            todo = [pid for pid in pids if not (result.dumps[pid] and result.dumps[pid][-1].final)]
            asked = time.monotonic()
            sample_end = max(asked + 0.2, min(end, asked + PER_PROCESS_TIMEOUT_S))
            futures = {pool.submit(dump_process, binary, pid, sample_end - asked): pid for pid in todo}
            # the dumps end by their own timeouts; the grace covers starting py-spy on a loaded host
            done, _ = wait_for(futures, timeout=max(0.0, sample_end - time.monotonic()) + 0.5)
            for future, pid in futures.items():
                if future in done:
                    result.dumps[pid].append(future.result())
                else:
                    result.dumps[pid].append(Dump(pid, asked, error=_no_answer(sample_end - asked)))
            result.samples += 1
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a straggler's py-spy is killed at its own timeout
    return result


def dump_process(binary: str, pid: int, timeout_s: float) -> Dump:
    """One py-spy dump of one process within `timeout_s`, never raising: blocking with native frames, else
    non-blocking in the time left."""
    t = time.monotonic()
    dump = _run(binary, pid, ["--native"], timeout_s)
    left = timeout_s - (time.monotonic() - t)
    if dump.error is not None and dump.error.startswith(_CANNOT_PAUSE):
        stopped = _is_stopped(pid)
        if stopped:
            dump.error = stopped_text(pid)
        if left > 0.1:
            fallback = _run(binary, pid, ["--nonblocking"], left)
            fallback.native = False
            if fallback.error is None:
                dump = fallback
        dump.stopped = stopped
    dump.t_s = t
    try:
        process = psutil.Process(pid)
        times = process.cpu_times()
        dump.cpu_s = times.user + times.system
        dump.read_chars = getattr(process.io_counters(), "read_chars", None)
    except (psutil.Error, AttributeError, OSError):  # io_counters: not on every platform, or not permitted
        pass
    return dump


def _is_stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def stopped_text(pid: int) -> str:
    """A process stopped by a signal waits for nothing but SIGCONT: the one thing to say about it."""
    return f"pid {pid} is stopped (SIGSTOP / Ctrl-Z): kill -CONT {pid}"


def _no_answer(timeout_s: float) -> str:
    # neutral: a blocking dump with native frames of a torch rank with hundreds of threads can itself be slow
    return (f"py-spy did not answer within {timeout_s:.1f} s (a process with many threads can take that long to "
            "unwind; one stopped or in uninterruptible I/O never answers)")


_CANNOT_PAUSE = "py-spy could not pause"


def _run(binary: str, pid: int, flags: list[str], timeout_s: float) -> Dump:
    t = time.monotonic()
    try:
        done = subprocess.run([binary, "dump", "--json", *flags, "--pid", str(pid)], capture_output=True,
                              text=True, errors="replace", timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Dump(pid, t, error=_no_answer(timeout_s))
    except OSError as exc:
        return Dump(pid, t, error=f"py-spy could not run: {exc.strerror or exc}", final=True)
    if done.returncode == 0:
        try:
            return Dump(pid, t, threads=parse_dump(done.stdout), raw=done.stdout)
        except ValueError as exc:
            return Dump(pid, t, error=f"py-spy's output could not be read: {exc}")
    error, final = explain_failure(pid, done.stderr or done.stdout)
    return Dump(pid, t, error=error, final=final)


def parse_dump(text: str) -> list[ThreadStack]:
    """py-spy's `dump --json` (a list of threads, frames innermost first) as ThreadStacks."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(data, list):
        raise ValueError("not a list of threads")
    threads = []
    for item in data:
        if not isinstance(item, dict):
            continue
        frames = []
        for f in item.get("frames") or []:
            if not isinstance(f, dict):
                continue
            native = f.get("module") is not None  # py-spy names the library of a native frame, None for Python
            line = f.get("line")
            frames.append(StackFrame(function=str(f.get("name") or "?"),
                                     module=str(f.get("short_filename") or f.get("filename") or "") or None,
                                     line=line if isinstance(line, int) and line > 0 else None, native=native))
        tid = item.get("os_thread_id") or item.get("thread_id") or 0
        threads.append(ThreadStack(tid=int(tid), name=item.get("thread_name"), active=item.get("active"),
                                   frames=frames))
    return threads


def explain_failure(pid: int, stderr: str) -> tuple[str, bool]:
    """py-spy's error as one line saying why and how to allow it; whether trying again would not help."""
    text = stderr or ""
    if "Permission Denied" in text or "Operation not permitted" in text or "EPERM" in text:
        return not_permitted(pid), True
    if "Failed to find python version" in text or "Failed to find a python interpreter" in text:
        if _looks_like_python(pid):  # an interpreter still starting has no version in memory yet: try again
            return f"py-spy found no Python interpreter state in pid {pid} yet (still starting?)", False
        return f"pid {pid} is not a Python process: py-spy reads only Python processes", True
    if ("Check that the process is running" in text or "No such process" in text or "ESRCH" in text
            or not psutil.pid_exists(pid)):
        return f"pid {pid} has exited", True
    if "Failed to suspend process" in text or ("Failed to get stack traces" in text and "waitpid" in text):
        return f"{_CANNOT_PAUSE} pid {pid} (stopped or traced)", False
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and "backtrace" not in ln.lower()), "")
    return f"py-spy failed on pid {pid}: {first.removeprefix('Error: ')[:200] or 'no message'}", False


def _looks_like_python(pid: int) -> bool:
    try:
        return "python" in Path(psutil.Process(pid).exe()).name.lower()
    except (psutil.Error, OSError):
        return False


def not_permitted(pid: int) -> str:
    """Why ptrace was refused and what allows it, as far as this host tells."""
    how = []
    try:
        owner = psutil.Process(pid).username()
        me = psutil.Process().username()
        if owner != me and os.geteuid() != 0:
            how.append(f"it belongs to {owner}: run as root" if owner == "root"
                       else f"it belongs to {owner}: run as {owner} or root")
    except (psutil.Error, KeyError):
        pass
    try:
        scope = int(_PTRACE_SCOPE.read_text().strip())
        if scope > 0:
            how.append(f"kernel.yama.ptrace_scope is {scope}: `sudo sysctl kernel.yama.ptrace_scope=0`, or run as root")
    except (OSError, ValueError):
        pass
    how.append("in a container, add CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE)")
    return f"ptrace not permitted on pid {pid}: " + "; ".join(how)
