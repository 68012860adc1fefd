"""From the dumps of a process tree to a StackReport: each process's activity, whether its stack moved, one line
per process, and the tree's verdict in one summary line.

A process's stacks "moved" when any of its threads moved between two consecutive samples: a thread (by its OS
thread id) present in both whose frames differ, each frame compared by function, file and line, innermost first,
native frames included. So the same function at another line is motion (a loop or a read going on), and a
loader's worker threads moving while its main thread waits on their futures make a loading process move. A
thread that appears or goes between two samples is not motion by itself: a server starts a thread for each
request that arrives, and a pool retires idle workers, whether or not the work in flight moves; only the threads
seen in both are compared. A sampler cannot tell a loop that is back at the same line from a thread that never
left it (a loader that reads a chunk, then sleeps or waits on the next, is caught at the same line every time),
so reads count too: a process that read at least READ_MOVING_BYTES_PER_S between two samples (its /proc/PID/io
rchar: read() and pread(), page cache included; socket receives are not counted there) moved. A helper reading
/proc now and then reads kilobytes, a loader megabytes. `unchanged_s` is how long the last run of samples with
nothing moving lasted, measured between the samples (so it is at most the window watched, never a guess about
before it). The verdict looks at the ranks (processes
whose title names a tensor-parallel rank) when there are any, else at the processes an engine signature named,
else at every process read:

- loading: a rank loading weights (moving or not: a slow disk is not a hang, and the line says unchanged), the
  ranks in a collective then named as waiting for it (a rank that finished loading all-reduces its free memory,
  SGLang's get_available_gpu_memory, vLLM's profiling, while the others still load);
- deadlock: ranks in collectives where no rank's stacks moved, where the ranks disagree (different collectives,
  or some ranks not in one), or all wait in the same one (a peer that never joins);
- busy: a rank running work (a batch, a compile, a CUDA-graph capture, tokenizing), collectives that move, or
  ranks in a collective waiting for ranks whose stacks move (one still starting while the others sit in the
  rendezvous: "not hung");
- idle: every rank idle in its request loop (a ready server waiting for requests), or only sleeping ("idle
  (sleeping)": nothing says it serves);
- stuck: the rest, with unchanged stacks (waiting, not idle), or any process stopped by a signal (SIGSTOP,
  Ctrl-Z: it waits for SIGCONT alone, and the summary says `kill -CONT PID`); unknown: no stacks, or waits that
  move.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from servelab.lifecycle.stacks.capture import Capture, Dump, stopped_text
from servelab.lifecycle.stacks.classify import ThreadActivity, role_of, telling_thread
from servelab.lifecycle.stacks.signatures import StackSignature
from servelab.records import ProcessStacks, StackReport, ThreadStack
from servelab.redaction import redact_command, redact_text
from servelab.textsafe import inert


# A process whose Python thread only parks while native threads work (llama.cpp's server) is busy when it used at
# least this much CPU during the capture (100 = one core): a parked server uses next to none.
NATIVE_BUSY_CPU_PERCENT = 20.0
NATIVE_BUSY = "busy in native threads"
# A process reading at least this fast between two samples moved, whatever its stacks show: a loader reads
# megabytes a second (the replay's reads about 12 MB/s a rank), a helper polling /proc a few kilobytes.
READ_MOVING_BYTES_PER_S = 1 << 20


def summarize(capture: Capture, engine_signatures: Sequence[StackSignature] = (), *, interval_s: float | None = None,
              raw: bool = False) -> StackReport:
    report = StackReport(tool=capture.tool, samples=capture.samples, interval_s=interval_s,
                         unavailable=capture.unavailable)
    if capture.unavailable:
        report.summary = capture.unavailable
        return report
    ranks: dict[int, int] = {}
    engine_named: set[int] = set()
    for pid in capture.pids:
        proc, rank, named = process_stacks(pid, capture.commands.get(pid, []), capture.dumps.get(pid, []),
                                           engine_signatures)
        report.processes.append(proc)
        if rank is not None:
            ranks[pid] = rank
        if named:
            engine_named.add(pid)
    stopped = [pid for pid in capture.pids if (capture.dumps.get(pid) or []) and capture.dumps[pid][-1].stopped]
    if stopped:
        # a stopped process waits for SIGCONT, not for a peer or a request: that is the verdict, whatever the
        # others' stacks say (they may well wait on it)
        report.verdict = "stuck"
        report.summary = "; ".join(stopped_text(pid) for pid in stopped[:3]) + (
            f" (and {len(stopped) - 3} more stopped)" if len(stopped) > 3 else "")
    else:
        report.verdict, report.summary = verdict(report.processes, ranks, engine_named)
    if capture.left_out:
        report.summary += f" ({capture.left_out} more processes not read: over {len(capture.pids)})"
    if raw:
        report.raw = raw_text(report.processes, capture)
    return report


def process_stacks(pid: int, command: list[str], dumps: list[Dump], engine_signatures: Sequence[StackSignature]
                   ) -> tuple[ProcessStacks, int | None, bool]:
    """One process across its dumps; its TP rank (from its title); whether an engine signature named it."""
    shown_command = inert(" ".join(redact_command(command)))[:500] if command else None
    read = [d for d in dumps if d.threads is not None]
    last = read[-1].threads if read else []
    role = role_of(command, last or [])
    # a role is read from the command line (sglang::NAME): text the process chose, made inert like its stacks
    role_name = inert(role.name)[:80] if role.name else None
    proc = ProcessStacks(pid=pid, role=role_name, command=shown_command, samples=len(read))
    who = f"{role_name} (pid {pid})" if role_name else f"pid {pid}"
    if not read:
        error = next((d.error for d in reversed(dumps) if d.error), "no dump taken")
        proc.error = inert(error)
        proc.line = f"{who}: no stacks: {proc.error}"
        return proc, role.rank, False
    stacks = [_stacks(d.threads or []) for d in read]  # before the names are made inert below
    activity = _across_samples([telling_thread(d.threads or [], engine_signatures) for d in read])
    for t in last:
        t.activity = inert(telling_thread([t], engine_signatures)[1].phrase)
    proc.threads = [_inert_thread(t) for t in last]
    proc.activity = inert(activity.activity)
    proc.detail = inert(activity.detail) if activity.detail else None
    proc.kind = activity.kind  # type: ignore[assignment]
    if len(read) > 1:
        moved = [_moved(stacks[i], stacks[i + 1]) or _read(read[i], read[i + 1]) for i in range(len(read) - 1)]
        proc.moving = any(moved)
        start = len(read) - 1
        while start > 0 and not moved[start - 1]:
            start -= 1
        proc.unchanged_s = round(read[-1].t_s - read[start].t_s, 1)
    cpu = [(d.t_s, d.cpu_s) for d in read if d.cpu_s is not None]
    if len(cpu) > 1 and cpu[-1][0] > cpu[0][0]:
        proc.cpu_percent = round(100.0 * (cpu[-1][1] - cpu[0][1]) / (cpu[-1][0] - cpu[0][0]), 1)
    phrase = activity.phrase
    if activity.native_work and proc.cpu_percent is not None and proc.cpu_percent >= NATIVE_BUSY_CPU_PERCENT:
        proc.kind = "busy"
        proc.activity = NATIVE_BUSY
        proc.detail = f"{proc.cpu_percent:.0f} % CPU; {inert(activity.activity)} in Python"
        phrase = f"{proc.activity} ({proc.detail})"
    proc.line = f"{who}: {inert(phrase)}{_motion(proc)}"
    if read[-1].stopped:
        proc.line = f"{who}: stopped (SIGSTOP / Ctrl-Z): kill -CONT {pid}; {inert(phrase)}{_motion(proc)}"
    if not read[-1].native:
        proc.line += " (Python frames only: the process could not be paused)"
    return proc, role.rank, activity.engine


def _across_samples(telling: Sequence[tuple[ThreadStack | None, ThreadActivity]]) -> ThreadActivity:
    """What the process does, from every sample rather than the last alone. A scheduler that loops without
    sleeping (SGLang with sleep_on_idle=False) is caught in its request loop in one sample and in the loop around
    it in the next: it is idle when a sample finds it idle and no sample finds it at work, work being a
    collective, a load or a busy activity named by a frame that is not one of the idle sample's own frames (the
    loop that calls the idle wait is no work; running a batch is). A process at work in any sample is named by
    the latest such sample."""
    last = telling[-1][1]
    idle = [(t, a) for t, a in telling if a.kind == "idle"]
    if not idle:
        return last
    idle_frames = {(f.function, f.module) for t, _ in idle if t is not None for f in t.frames}

    def is_work(thread: ThreadStack | None, a: ThreadActivity) -> bool:
        if a.kind not in ("collective", "loading", "busy"):
            return False
        if thread is None or a.frame_index is None or a.frame_index >= len(thread.frames):
            return True
        frame = thread.frames[a.frame_index]
        return (frame.function, frame.module) not in idle_frames

    work = [a for t, a in telling if is_work(t, a)]
    if not work:
        return idle[-1][1]
    return last if is_work(*telling[-1]) else work[-1]


def _stacks(threads: Sequence[ThreadStack]) -> dict[int, tuple]:
    """Each thread's frames (function, file, line; innermost first) by its OS thread id."""
    return {t.tid: tuple((f.function, f.module, f.line) for f in t.frames) for t in threads}


def _read(before: Dump, after: Dump) -> bool:
    """Whether the process read files at READ_MOVING_BYTES_PER_S or faster between two samples."""
    if before.read_chars is None or after.read_chars is None or after.t_s <= before.t_s:
        return False
    return (after.read_chars - before.read_chars) / (after.t_s - before.t_s) >= READ_MOVING_BYTES_PER_S


def _moved(before: dict[int, tuple], after: dict[int, tuple]) -> bool:
    """Whether a thread seen in both samples changed its frames (threads that come or go are not counted)."""
    return any(after[tid] != frames for tid, frames in before.items() if tid in after)


def _motion(proc: ProcessStacks) -> str:
    if proc.moving is None:
        return ""
    if proc.moving:
        return ", stack moving"
    return f", stack unchanged for {proc.unchanged_s:.1f} s"


def _inert_thread(thread: ThreadStack) -> ThreadStack:
    thread.name = inert(thread.name) if thread.name else thread.name
    for frame in thread.frames:
        frame.function = inert(frame.function)
        frame.module = inert(redact_text(frame.module)) if frame.module else frame.module
    return thread


# --------------------------------------------------------------------------------------------------------------
# The tree's verdict
# --------------------------------------------------------------------------------------------------------------

def verdict(processes: Sequence[ProcessStacks], ranks: dict[int, int], engine_named: set[int] = frozenset()
            ) -> tuple[str, str]:
    read = [p for p in processes if p.error is None]
    if not read:
        errors = [p.error for p in processes if p.error]
        return "unknown", "no stacks could be read: " + (errors[0] if errors else "no processes")
    ranked = [p for p in read if p.pid in ranks]
    # the ranks, else the processes the engine's own signatures name (a resource tracker or a launcher waiting on
    # its children says little about the engine), else every process read
    principal = ranked or [p for p in read if p.pid in engine_named] or read
    total = (len([p for p in processes if p.pid in ranks]) if ranked
             else len(principal) if principal is not read else len(processes))
    noun = "ranks" if ranked else "processes"

    def groups(procs: Sequence[ProcessStacks]) -> str:
        return _groups(procs, ranks if ranked else {})

    def count(procs: Sequence[ProcessStacks]) -> str:
        if total == 1 and len(procs) == 1:
            return f"pid {procs[0].pid}" + (f" ({procs[0].role})" if procs[0].role else "")
        return f"{len(procs)} of {total} {noun}"

    def described(procs: Sequence[ProcessStacks]) -> str:
        """"4 of 4 ranks running a batch" when they all do one thing, else each group by what it does."""
        if len({_phrase(p) for p in procs}) == 1:
            return f"{count(procs)} {_phrase(procs[0])}"
        return groups(procs)

    collective = [p for p in principal if p.kind == "collective"]
    loading = [p for p in principal if p.kind == "loading"]
    if loading:
        # before any collective: a rank that finished loading waits in one (SGLang's memory all_reduce after its
        # load, vLLM's profiling) for the ranks still loading; that is a load going on, not a deadlock
        what = _common_phrase(loading)
        rest = [p for p in principal if p.kind not in ("loading", "collective")]
        others = f"; {groups(rest)}" if rest else ""
        waiting = (f"; {_label(collective, ranks if ranked else {})} {_common_phrase(collective)}, waiting for "
                   f"the {noun} still loading" if collective else "")
        if all(p.moving is False for p in loading):
            return "loading", (f"{count(loading)} {what}{others}, stacks unchanged for "
                               f"{max(p.unchanged_s or 0.0 for p in loading):.1f} s{waiting}: loading, or waiting on "
                               "storage")
        motion = ", stacks moving" if any(p.moving for p in loading) else ""
        return "loading", f"{count(loading)} {what}{others}{motion}{waiting}: loading, not hung"
    if collective:
        window = max(p.unchanged_s or 0.0 for p in collective)
        names = {p.activity for p in collective}
        # a deadlock only when nothing the verdict looks at moved: a rank still starting (importing, setting up)
        # while the others sit in the rendezvous is a start going on
        if all(p.moving is False for p in principal):
            if len(names) > 1 or len(collective) < len(principal):
                return "deadlock", (f"{groups(principal)}: {noun} disagree on the collective (stacks unchanged for "
                                    f"{window:.1f} s): a likely deadlock")
            return "deadlock", (f"{count(collective)} {collective[0].activity}, stacks unchanged for {window:.1f} s: "
                                "all wait in the same collective for a peer that never joins: a likely deadlock")
        if any(p.moving for p in collective):
            return "busy", f"{described(principal)}, stacks moving: busy"
        moving = [p for p in principal if p.moving and p.kind != "collective"]
        if moving and all(p.moving is False for p in collective):
            return "busy", (f"{groups(moving)}, stacks moving; {_label(collective, ranks if ranked else {})} "
                            f"{_common_phrase(collective)}, waiting for them: not hung")
    busy = [p for p in principal if p.kind == "busy"]
    if busy:
        # a process busy in native threads keeps its Python stack still by nature: its CPU time moved instead
        if all(p.moving is False and p.activity != NATIVE_BUSY for p in busy):
            return "stuck", (f"{described(principal)}, stacks unchanged for "
                             f"{max(p.unchanged_s or 0.0 for p in busy):.1f} s: "
                             "stuck (the same stack in every sample, not idle)")
        motion = ", stacks moving" if any(p.moving for p in busy) else ""
        return "busy", f"{described(principal)}{motion}: busy"
    if all(p.kind == "idle" for p in principal):
        # a process that only sleeps is idle, but nothing says it serves: "ready server" is for request loops
        # and event loops
        why = "sleeping" if all(p.activity == "sleeping" for p in principal) else "a ready server waiting for requests"
        return "idle", f"{count(principal)} {_common_phrase(principal)}: idle ({why})"
    waiting = [p for p in principal if p.kind != "idle"]
    if all(p.moving is False for p in waiting):
        window = max(p.unchanged_s or 0.0 for p in waiting)
        return "stuck", f"{described(principal)}, stacks unchanged for {window:.1f} s: stuck (waiting, not idle)"
    return "unknown", f"{described(principal)}" + (", stacks moving" if any(p.moving for p in waiting) else "")


def _phrase(p: ProcessStacks) -> str:
    return p.activity + (f" ({p.detail})" if p.detail else "")


def _common_phrase(procs: Sequence[ProcessStacks]) -> str:
    phrases = sorted({_phrase(p) for p in procs})
    if len(phrases) == 1:
        return phrases[0]
    activities = sorted({p.activity for p in procs})
    return activities[0] if len(activities) == 1 else ", ".join(phrases)


def _groups(procs: Sequence[ProcessStacks], ranks: dict[int, int]) -> str:
    """Processes grouped by what they do: "ranks 0-2,4-7 in broadcast, rank 3 in all_reduce"."""
    by_phrase: dict[str, list[ProcessStacks]] = {}
    for p in procs:
        by_phrase.setdefault(_phrase(p), []).append(p)
    ordered = sorted(by_phrase.items(), key=lambda item: -len(item[1]))
    return ", ".join(f"{_label(group, ranks)} {phrase}" for phrase, group in ordered)


_RANK_GROUP = re.compile(r"((?:[A-Z]+\d+ )*?)TP\d+")


def _label(procs: Sequence[ProcessStacks], ranks: dict[int, int]) -> str:
    numbers = sorted(ranks[p.pid] for p in procs if p.pid in ranks)
    if numbers and len(numbers) == len(procs):
        if len(set(ranks.values())) < len(ranks):
            # TP ranks repeat across pipeline stages or data-parallel replicas (PP0 TP1, PP1 TP1): each group
            # by the prefix its title gives, "PP0 ranks 0-3, PP1 rank 1"
            by_group: dict[str, list[int]] = {}
            for p in procs:
                match = _RANK_GROUP.match(p.role or "")
                by_group.setdefault(match.group(1).strip() if match else "", []).append(ranks[p.pid])
            return ", ".join(f"{group} ".lstrip() + ("rank " if len(n) == 1 else "ranks ") + _ranges(sorted(n))
                             for group, n in sorted(by_group.items()))
        return ("rank " if len(numbers) == 1 else "ranks ") + _ranges(numbers)
    if len(procs) <= 3:
        return ", ".join(p.role or f"pid {p.pid}" for p in procs)
    return f"{len(procs)} processes"


def _ranges(numbers: Sequence[int]) -> str:
    """[0, 1, 2, 4, 5] as "0-2,4-5"."""
    parts: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(f"{start}-{prev}" if prev > start else f"{start}")
        if n is not None:
            start = prev = n
    return ",".join(parts)


# --------------------------------------------------------------------------------------------------------------
# The raw dump, for --stacks
# --------------------------------------------------------------------------------------------------------------

def raw_text(processes: Sequence[ProcessStacks], capture: Capture) -> str:
    """The last sample of every process as text, py-spy's layout: inert and redacted."""
    out: list[str] = []
    for p in processes:
        out.append(f"--- pid {p.pid}" + (f" ({p.role})" if p.role else "") + (f": {p.command}" if p.command else "")
                   + " ---")
        if p.error:
            out.append(f"  {p.error}")
            continue
        for t in p.threads:
            state = "active" if t.active else "idle"
            out.append(f"Thread {t.tid} ({state})" + (f": \"{t.name}\"" if t.name else "")
                       + (f"  [{t.activity}]" if t.activity else ""))
            for f in t.frames:
                where = f"{f.module}:{f.line}" if f.line else (f.module or "")
                out.append(f"    {f.function} ({where})")
    return inert(redact_text("\n".join(out)) or "", multiline=True)
