"""`up`'s stall verdict names what the engine's stacks showed: the replayed SGLang tp=8 hung in its weight load,
read with the real py-spy while servelab's start-up watch goes on.

The replay (servelab/engines/replay.py) is a real process tree whose ranks run stand-ins named as SGLang's own
functions; hang-in-load freezes every one of them in the loader at 40 % of the weights. Speed 200 and a 3 s stall
budget keep each test a few seconds.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from servelab.engines import EngineSpec
from servelab.errors import EngineFailed
from servelab.lifecycle.launch import LaunchStatus, start_engine

pytestmark = pytest.mark.timeout(90)
STALL_BUDGET_S = 3.0


def hung(**kw) -> EngineSpec:
    return EngineSpec(engine="replay-sglang", model="smollm2", options={"speed": "200", "variant": "hang-in-load"},
                      stall_budget_s=STALL_BUDGET_S, **kw)


def test_a_stall_verdict_ends_with_what_the_stacks_showed(tmp_path):
    updates: list[LaunchStatus] = []
    with pytest.raises(EngineFailed) as info:
        start_engine(hung(), tmp_path, on_update=updates.append, ready_timeout_s=60)
    verdict = info.value.launch_result.verdict
    assert verdict.state == "stalled" and verdict.evidence["stopped_by_servelab"] is True
    # The reason is the evidence's, then the stacks' summary: every rank frozen in the loader.
    assert verdict.reason.startswith("nothing moved for 3 s in phase 'loading weights'")
    assert re.search(r"; stacks: 8 of 8 ranks loading weights \(\w*weights_iterator\), stacks unchanged for "
                     r"[\d.]+ s", verdict.reason), verdict.reason
    report = verdict.evidence["stacks"]
    assert report["verdict"] == "loading" and report["samples"] >= 2
    ranks = [p for p in report["processes"] if (p["role"] or "").endswith("scheduler")]
    assert sorted(p["role"] for p in ranks) == [f"TP{n} scheduler" for n in range(8)]
    assert all(p["kind"] == "loading" and p["moving"] is False for p in ranks)
    # The message `up` prints holds a few of the per-process lines, ranks first.
    message = info.value.message
    assert "its processes:\n  TP0 scheduler (pid " in message and "loading weights" in message
    assert "more processes (in the verdict's evidence)" in message
    # The stacks were read off the watch loop: the statuses kept coming while py-spy sampled (three samples a
    # second apart, over 2 s: a watch blocked by them would go silent that long; the UPDATE_EVERY_S cadence is a
    # second, with room for a loaded 2-core host), and the stall was called within its budget. How long the stop
    # then waits depends on whether the half-budget capture was still running, so it is not asserted.
    stalled_at = next(u.elapsed_s for u in updates if u.verdict and u.verdict.state == "stalled")
    during = [u.elapsed_s for u in updates if u.elapsed_s >= stalled_at - 3.0]
    assert max(b - a for a, b in zip(during, during[1:])) < 2.0
    assert STALL_BUDGET_S <= verdict.evidence["quiet_s"] < STALL_BUDGET_S + 3


# The slow tier (CI runs it): two stalled start-ups through the CLI, ~14 s; the default suite judges a stall with
# and without stacks through start_engine (the tests around this one)
@pytest.mark.slow
def test_up_prints_the_stacks_of_a_stall_and_no_stacks_skips_them(tmp_path):
    base = [sys.executable, "-m", "servelab.cli", "up", "replay-sglang", "--option", "variant=hang-in-load",
            "--option", "speed=200", "--stall-budget", str(STALL_BUDGET_S), "--log-dir", str(tmp_path)]
    named = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert named.returncode != 0
    out = named.stdout + named.stderr
    assert "stalled after" in out and "stacks: 8 of 8 ranks loading weights" in out, out[-3000:]
    assert re.search(r"TP\d scheduler \(pid \d+\): loading weights .*stack unchanged for", out)
    skipped = subprocess.run([*base, "--no-stacks"], capture_output=True, text=True, timeout=60)
    assert skipped.returncode == named.returncode
    out = skipped.stdout + skipped.stderr
    assert "stalled after" in out and "stacks:" not in out and "scheduler (pid" not in out


def test_without_stacks_the_stall_stops_at_once_and_names_none(tmp_path):
    updates: list[LaunchStatus] = []
    with pytest.raises(EngineFailed) as info:
        start_engine(hung(), tmp_path, on_update=updates.append, ready_timeout_s=60, stacks=False)
    verdict = info.value.launch_result.verdict
    assert verdict.state == "stalled" and "stacks" not in verdict.evidence and "stacks:" not in verdict.reason
    # Nothing to wait for: the engine was stopped in the same turn of the watch that called the stall.
    assert updates and not [u for u in updates if u.verdict and u.verdict.state == "stalled"]


def test_one_capture_at_a_time_and_never_two_back_to_back(tmp_path):
    """StallStacks against a real process, read with the real py-spy: a request while one is in flight starts
    nothing, nor one right after it ended; once MIN_GAP_S has passed, another starts."""
    import time

    from servelab.lifecycle.stall_stacks import MIN_GAP_S, StallStacks

    sleeper = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait(60)"])
    try:
        time.sleep(0.5)  # let it reach its wait
        stacks = StallStacks(sleeper.pid, None)
        assert stacks.request("half the budget") is True
        assert stacks.in_flight and stacks.request("stall") is False
        stacks.wait(15)
        assert not stacks.in_flight and stacks.report is not None and stacks.reason == "half the budget"
        assert stacks.report.unavailable is None and len(stacks.report.processes) == 1, stacks.report.summary
        assert stacks.request("stall") is False  # too soon after the last
        time.sleep(MIN_GAP_S + 0.1)
        assert stacks.request("stall") is True and stacks.captures == 2
        stacks.wait(15)
        assert stacks.reason == "stall"
        assert StallStacks(sleeper.pid, None, enabled=False).request("stall") is False
    finally:
        sleeper.kill()
        sleeper.wait(10)


def test_one_silence_is_read_once_at_half_its_budget_and_once_at_its_stall():
    """The watch keys a silence on when it began: samples every 1.0-1.03 s (non-integer times, as a loaded host
    gives) through one 120 s silence ask for the stacks once at half the budget and once at the stall, never at
    every sample (now minus a quiet_s rounded to 0.1 s jitters by a tenth)."""
    import random
    from types import SimpleNamespace

    from servelab.lifecycle.launch import _StartupWatch
    from servelab.lifecycle.stall_stacks import StallStacks
    from servelab.records import StackReport, Verdict

    clock = [0.0]
    read_at: list[float] = []

    def reader(pid, adapter):
        read_at.append(clock[0])
        return StackReport(summary="read")

    last_moved, budget = 10.037, 120.0
    watch = SimpleNamespace(stacks=StallStacks(1, None, reader=reader, clock=lambda: clock[0]),
                            judge=SimpleNamespace(last_moved={"log": 3.0, "cpu": last_moved}),
                            _half_budget_for=None, _stall_for=None)
    for name in ("_silent_since", "_stacks_of_this_silence", "_ask_for_stacks"):
        setattr(watch, name, getattr(_StartupWatch, name).__get__(watch))
    rng = random.Random(2)
    t = last_moved
    while t < last_moved + budget + 5:
        t += 1.0 + rng.random() * 0.03
        clock[0] = t
        quiet = t - last_moved
        state = "stalled" if quiet >= budget else "loading"
        asked = watch._ask_for_stacks(Verdict(state=state, reason="quiet", evidence={
            "quiet_s": round(quiet, 1), "budget_s": budget}), t)
        if watch.stacks._thread is not None:
            watch.stacks._thread.join()
    assert len(read_at) == 2, [round(x, 2) for x in read_at]
    assert last_moved + budget / 2 - 0.1 <= read_at[0] < last_moved + budget / 2 + 1.1  # quiet_s is rounded
    assert last_moved + budget <= read_at[1] < last_moved + budget + 1.1
    assert asked.evidence["stacks"]["summary"] == "read"  # the stall's verdict names the stacks of its silence
