"""The tree's verdict from its processes as summarize.py names them: the rules that tell a load, a start and a
deadlock apart when some ranks sit in a collective (servelab/lifecycle/stacks/summarize.py verdict()).

The processes are ProcessStacks as process_stacks() makes them from py-spy's dumps; what a real dump of each looks
like is tested in test_stacks.py with the real py-spy on real processes.
"""

from __future__ import annotations

from servelab.lifecycle.stacks.summarize import verdict
from servelab.records import ProcessStacks


def rank(pid: int, kind: str, activity: str, detail: str | None = None, *, moving: bool,
         unchanged_s: float = 0.0) -> ProcessStacks:
    return ProcessStacks(pid=pid, role=f"TP{pid} scheduler", kind=kind, activity=activity, detail=detail,
                         moving=moving, unchanged_s=None if moving else unchanged_s, samples=3)


def loader(pid: int, *, moving: bool = True) -> ProcessStacks:
    return rank(pid, "loading", "loading weights", "safetensors", moving=moving, unchanged_s=3.0)


def in_collective(pid: int, name: str = "all_reduce") -> ProcessStacks:
    return rank(pid, "collective", f"in {name}", "torch.distributed", moving=False, unchanged_s=3.0)


RANKS = {p: p for p in range(8)}


def test_a_rank_that_finished_loading_waits_in_a_collective_for_the_ranks_still_loading():
    """SGLang's get_available_gpu_memory(distributed=True) all-reduces once a rank has loaded: rank 3 is there,
    the others still read their weights."""
    procs = [loader(0), loader(1), loader(2), in_collective(3)]
    state, summary = verdict(procs, RANKS)
    assert state == "loading", summary
    assert summary == ("3 of 4 ranks loading weights (safetensors), stacks moving; rank 3 in all_reduce "
                       "(torch.distributed), waiting for the ranks still loading: loading, not hung")


def test_the_same_with_loaders_on_a_slow_disk_is_loading_not_a_deadlock():
    procs = [loader(0, moving=False), loader(1, moving=False), in_collective(2), in_collective(3)]
    state, summary = verdict(procs, RANKS)
    assert state == "loading", summary
    assert summary.startswith("2 of 4 ranks loading weights (safetensors), stacks unchanged for 3.0 s; ranks 2-3 "
                              "in all_reduce (torch.distributed), waiting for the ranks still loading")
    assert summary.endswith(": loading, or waiting on storage")


def test_ranks_in_the_rendezvous_while_one_still_starts_are_not_a_deadlock():
    procs = [rank(0, "busy", "running import_module", moving=True), in_collective(1, "barrier"),
             in_collective(2, "barrier"), in_collective(3, "barrier")]
    state, summary = verdict(procs, RANKS)
    assert state == "busy", summary
    assert "deadlock" not in summary
    assert summary == ("rank 0 running import_module, stacks moving; ranks 1-3 in barrier (torch.distributed), "
                       "waiting for them: not hung")


def test_ranks_that_disagree_with_nothing_moving_are_still_a_likely_deadlock():
    procs = [in_collective(0, "broadcast"), in_collective(1, "broadcast"), in_collective(2, "broadcast"),
             in_collective(3)]
    state, summary = verdict(procs, RANKS)
    assert state == "deadlock" and summary.endswith("a likely deadlock"), summary
    # a rank outside any collective whose stack did not move either: still a deadlock
    procs = [in_collective(0), in_collective(1), in_collective(2),
             rank(3, "waiting", "waiting in recv", moving=False, unchanged_s=3.0)]
    state, summary = verdict(procs, RANKS)
    assert state == "deadlock" and "ranks disagree on the collective" in summary, summary


def test_ranks_whose_tp_numbers_repeat_across_pipeline_stages_are_labelled_by_their_stage():
    """vLLM's VLLM::Worker_PP0_TP1 and VLLM::Worker_PP1_TP1 are both TP rank 1: the summary names the stage."""
    procs = [ProcessStacks(pid=10 + i, role=f"PP{pp} TP{tp} worker", kind="collective",
                           activity="in all_reduce" if (pp, tp) == (1, 1) else "in broadcast",
                           detail="torch.distributed", moving=False, unchanged_s=2.0, samples=3)
             for i, (pp, tp) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)])]
    ranks = {10: 0, 11: 1, 12: 0, 13: 1}
    state, summary = verdict(procs, ranks)
    assert state == "deadlock", summary
    assert summary.startswith("PP0 ranks 0-1, PP1 rank 0 in broadcast (torch.distributed), PP1 rank 1 in "
                              "all_reduce (torch.distributed): ranks disagree"), summary


def test_a_role_read_from_the_command_line_is_inert():
    from servelab.lifecycle.stacks.capture import Dump
    from servelab.lifecycle.stacks.summarize import process_stacks
    from servelab.records import StackFrame, ThreadStack

    thread = ThreadStack(tid=1, name="MainThread", active=False,
                         frames=[StackFrame(function="wait", module="threading.py", line=320)])
    proc, _, _ = process_stacks(7, ["sglang::\x1b]0;owned\x07\x1b[2J"], [Dump(7, 0.0, threads=[thread])], ())
    assert "\x1b" not in (proc.role or "") and "\x07" not in proc.line
    assert proc.role.startswith("\\x1b]0;owned")


# --------------------------------------------------------------------------------------------------------------
# A process named from all its samples (summarize.py process_stacks)
# --------------------------------------------------------------------------------------------------------------

SCHEDULER = "sglang/srt/managers/scheduler.py"


def scheduler_sample(t_s: float, *inner: str):
    """One dump of an SGLang TP rank's main thread: `inner` frames (innermost first) under event_loop_overlap."""
    from servelab.lifecycle.stacks.capture import Dump
    from servelab.records import StackFrame, ThreadStack

    frames = [StackFrame(function=f, module=SCHEDULER, line=100 + i) for i, f in enumerate(inner)]
    frames.append(StackFrame(function="Scheduler.event_loop_overlap", module=SCHEDULER, line=900 + len(inner)))
    return Dump(3, t_s, threads=[ThreadStack(tid=30, name="MainThread", active=True, frames=frames)])


def scheduler(*samples):
    from servelab.engines import get_engine
    from servelab.lifecycle.stacks.summarize import process_stacks

    proc, _, _ = process_stacks(3, ["sglang::scheduler_TP3"], list(samples), get_engine("sglang").stack_signatures)
    return proc


def test_a_scheduler_that_loops_without_sleeping_is_idle_whichever_sample_comes_last():
    """sleep_on_idle=False: the loop is caught in recv_requests, then in the loop itself between two polls."""
    proc = scheduler(scheduler_sample(0.0, "Scheduler.recv_requests"),
                     scheduler_sample(0.5, "Scheduler.get_next_batch_to_run"),
                     scheduler_sample(1.0))
    assert proc.kind == "idle" and proc.activity == "idle in the request loop", proc.line
    assert proc.moving is True  # it loops


def test_a_scheduler_caught_running_a_batch_in_any_sample_is_busy():
    proc = scheduler(scheduler_sample(0.0, "Scheduler.run_batch"), scheduler_sample(0.5, "Scheduler.recv_requests"),
                     scheduler_sample(1.0, "Scheduler.recv_requests"))
    assert proc.kind == "busy" and proc.activity == "running a batch", proc.line
    proc = scheduler(scheduler_sample(0.0, "Scheduler.recv_requests"), scheduler_sample(0.5, "Scheduler.run_batch"))
    assert proc.kind == "busy", proc.line


def test_a_plain_sleeper_is_idle_sleeping_not_a_ready_server():
    sleeper = ProcessStacks(pid=5, kind="idle", activity="sleeping", moving=False, unchanged_s=1.0, samples=3)
    state, summary = verdict([sleeper], {})
    assert (state, summary) == ("idle", "pid 5 sleeping: idle (sleeping)")
    loop = ProcessStacks(pid=6, kind="idle", activity="idle in the event loop", detail="uvicorn", moving=False,
                         samples=3)
    assert verdict([loop], {})[1].endswith("idle (a ready server waiting for requests)")
