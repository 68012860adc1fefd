"""A busy machine during a measurement: a contended level ends its trial early, the trial runs again once the
machine is quiet, and contention that does not pass stops the experiment with the busy process named and a
non-zero exit, keeping what was measured (experiment/contention.py, docs/metrics.md#contended-trials).

The busy machine is real: a process spinning on one of the cores (a CPU hog), not a patched sampler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from servelab.bench.runner import BenchOptions, bench
from servelab.bench.trials import counted_trials
from servelab.calibration import Script, start_calibration_server
from servelab.experiment.contention import ContentionGuard, ContentionPolicy, MachineBusy, needs_rerun
from servelab.experiment.load import parse_experiment
from servelab.experiment.runner import ExperimentOptions, run_experiment
from servelab.records import EnvironmentSummary, Summary, Trial

HOG = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end: pass\n"


def hog(seconds: float) -> subprocess.Popen:
    """A process that keeps one core busy for `seconds` (then exits by itself: a test never leaves it behind)."""
    return subprocess.Popen([sys.executable, "-c", HOG, str(seconds)])


@pytest.fixture(scope="module")
def calibration():
    with start_calibration_server(Script(output_tokens=8, ttft_ms=5, itl_ms=20)) as cal:
        yield cal


def quiet_console() -> Console:
    return Console(file=open(os.devnull, "w"), width=120)


def test_a_level_on_a_busy_machine_ends_the_bench_early_with_the_reason(calibration) -> None:
    busy = hog(60)
    try:
        time.sleep(0.5)
        opts = BenchOptions(mode="sweep", level_duration_s=30.0, sweep_levels=[2], warmup=0,
                            stop_when_contended_s=2.0)
        started = time.monotonic()
        result = bench(calibration.url, opts)
        took = time.monotonic() - started
    finally:
        busy.kill()
        busy.wait()
    # a 30 s level (60 s cap) stopped a few seconds in: the check runs every second once 2 s are contended
    assert took < 12, took
    assert result.contended_stop and "other processes used" in result.contended_stop[0], result.contended_stop
    assert not result.interrupted and result.stop_reason.startswith("stopped: the machine was busy")
    level = result.levels[-1]
    assert level.environment is not None and level.environment.contended
    assert any(w.startswith("stopped early: the machine was busy") for w in level.warnings), level.warnings
    assert level.cancelled >= 1  # the requests in flight when it stopped are kept, as cancelled


def test_a_quiet_machine_runs_the_bench_to_its_end(calibration) -> None:
    # no hog: the same rule lets a short level finish (on a machine that other work keeps busy, this cannot
    # show anything: skipped, visibly)
    opts = BenchOptions(mode="sweep", level_duration_s=1.0, sweep_levels=[1], warmup=0, stop_when_contended_s=2.0)
    result = bench(calibration.url, opts)
    env = result.levels[-1].environment
    if env is not None and env.contended:
        pytest.skip(f"the machine was busy during the level ({'; '.join(env.reasons)})")
    assert not result.contended_stop and not result.interrupted


def _experiment(url: str, trials: int, contention: str) -> str:
    return (f"name: busy\ntrials: {trials}\nbench: {{single_requests: 3, max_tokens: 8, level_duration_s: 20, "
            f"max_concurrency: 1, warmup: 0}}\nverify: {{enabled: false}}\ncontention: {contention}\ncells:\n"
            f"  - {{name: a, url: {url}}}\n  - {{name: b, url: {url}}}\n")


def test_contention_that_does_not_pass_stops_the_experiment_naming_the_process(tmp_path: Path,
                                                                                calibration) -> None:
    busy = hog(90)
    try:
        time.sleep(0.5)
        exp = parse_experiment(_experiment(calibration.url, 3, "{stop_after_s: 2, quiet_s: 1, wait_s: 4}"), "e.yaml")
        started = time.monotonic()
        result = run_experiment(exp, ExperimentOptions(out_root=tmp_path, write_report=False), quiet_console())
        took = time.monotonic() - started
    finally:
        busy.kill()
        busy.wait()
    assert result.status == "contended", result
    # the busy process is named by its pid (the hog's), and how long the wait lasted
    assert f"pid {busy.pid}" in result.stop_reason and "stayed busy" in result.stop_reason, result.stop_reason
    # one trial stopped after ~2 s, a wait of ~4 s: nowhere near the 6 levels × 20 s planned
    assert took < 40, took
    run = next(s for s in result.runs if s.run_id.endswith("/a"))
    assert [t.status for t in run.trials] == ["contended"]
    assert run.trials[0].contention and "other processes used" in run.trials[0].contention[0]
    assert run.status == "interrupted"  # resumes when run again
    # what was measured is kept: the trial's records are in its run directory
    records = Path(tmp_path, run.run_id, "records.jsonl.gz")
    assert records.is_file() and records.stat().st_size > 0


# The slow tier (CI runs it): a hog for 7 s, then the wait and the rerun, ~20 s on two busy cores
@pytest.mark.slow
def test_a_contended_trial_runs_again_once_the_machine_is_quiet(tmp_path: Path, calibration) -> None:
    # the hog spins for the first trial's single level and a little longer, then exits: the trial is stopped,
    # the wait sees the machine quiet, and the round runs again as a trial of its own that pairs with round 0
    busy = hog(7)
    try:
        time.sleep(0.5)
        exp = parse_experiment(_experiment(calibration.url, 2, "{stop_after_s: 2, quiet_s: 1, wait_s: 30}")
                               .replace("level_duration_s: 20", "level_duration_s: 1"), "e.yaml")
        out = Console(record=True, width=200, file=open(os.devnull, "w"))
        result = run_experiment(exp, ExperimentOptions(out_root=tmp_path, write_report=False), out)
    finally:
        busy.kill()
        busy.wait()
    text = out.export_text()
    if result.status == "contended":
        pytest.skip(f"the machine stayed busy after the hog ended: {result.stop_reason}")
    assert result.status == "complete", text
    run = next(s for s in result.runs if s.run_id.endswith("/a"))
    first, *rest = run.trials
    assert first.status == "contended" or first.contended_levels, first
    assert "machine busy: waiting up to 30 s" in text and "runs again" in text, text
    rerun = next(t for t in rest if t.round == 0)
    assert rerun.index >= 2 and rerun.round_index == 0
    counted, left_out = counted_trials(run.trials)
    assert first in left_out and first not in counted


def test_the_cli_exits_1_and_says_why_when_the_machine_stays_busy(tmp_path: Path, calibration) -> None:
    path = tmp_path / "busy.yaml"
    path.write_text(_experiment(calibration.url, 2, "{stop_after_s: 2, quiet_s: 1, wait_s: 2}"))
    busy = hog(60)
    try:
        proc = subprocess.run([str(Path(sys.executable).with_name("servelab")), "run", str(path), "--out", str(tmp_path / "runs"),
                               "--json"], capture_output=True, text=True, timeout=120)
    finally:
        busy.kill()
        busy.wait()
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "stopped early" in proc.stderr or "stayed busy" in proc.stderr, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["status"] == "contended" and f"pid {busy.pid}" in doc["stop_reason"]


def _trial(status: str, reasons: list[str]) -> Trial:
    env = EnvironmentSummary(samples=4, contended=bool(reasons), reasons=reasons)
    level = Summary(tag="single", mode="single", concurrency=1, requests=1, ok=1, failed=0, window_s=1.0,
                    environment=env)
    from servelab.records import BenchResult

    return Trial(index=0, status=status, single=BenchResult(url="http://127.0.0.1:1", model="m", mode="single",
                                                            workload={}, levels=[level]))


def test_only_a_busy_machine_is_worth_a_rerun_not_a_saturated_client() -> None:
    assert needs_rerun(_trial("complete", ["other processes used 0.98 cores on average (stress pid 7: 0.98)"]))
    assert needs_rerun(_trial("contended", []))
    assert not needs_rerun(_trial("complete", ["the client (this servelab process) used 0.95 cores on average: "
                                               "the load generator, not the server, may have set the pace"]))
    assert not needs_rerun(_trial("complete", []))
    # another process on the engine's GPUs: the level measured more than the engine, worth a rerun; a GPU at its
    # power cap is the engine's own load and only said
    from servelab.records import GpuSummary
    gpu_busy, capped = _trial("complete", []), _trial("complete", [])
    gpu_busy.levels[0].gpu = GpuSummary(measured=True, contended=True,
                                        reasons=["pid 4242 held GPU 3 (the engine's) during the level"])
    capped.levels[0].gpu = GpuSummary(measured=True, warnings=["GPU 0 throttled for power or heat for 2.0 s of 10.0 s"])
    assert gpu_busy.contended_levels and needs_rerun(gpu_busy)
    assert not capped.contended_levels and not needs_rerun(capped)


def test_the_guard_stops_when_most_of_the_plan_was_contended_and_never_with_reruns_off(monkeypatch) -> None:
    from servelab.experiment import contention

    monkeypatch.setattr(contention, "wait_for_quiet", lambda *a, **k: contention.Quiet(True, 1.0))
    guard = ContentionGuard(ContentionPolicy(reruns=5), planned=4)
    said: list[str] = []
    assert guard.after_contended("a", 0, [], None, "trial 1/2 of a", said.append)
    assert guard.after_contended("b", 0, [], None, "trial 1/2 of b", said.append)
    with pytest.raises(MachineBusy, match="3 of 4 planned trials were contended"):
        guard.after_contended("a", 1, [], None, "trial 2/2 of a", said.append)
    assert any("rerun 1 of at most 5" in line for line in said)
    # one round contended more often than it may be rerun
    guard = ContentionGuard(ContentionPolicy(reruns=1), planned=100)
    assert guard.after_contended("a", 0, [], None, "trial 1/50 of a", said.append)
    with pytest.raises(MachineBusy, match="contended 2 times"):
        guard.after_contended("a", 0, [], None, "trial 1/50 of a", said.append)
    off = ContentionGuard(ContentionPolicy(reruns=0), planned=2)
    assert not any(off.after_contended("a", i, [], None, "t", said.append) for i in range(5))


# The slow tier (CI runs it): every trial run to its end under a hog, ~14 s on two busy cores
@pytest.mark.slow
def test_reruns_0_runs_every_trial_to_its_end_and_only_leaves_the_contended_out(tmp_path: Path,
                                                                                  calibration) -> None:
    path = tmp_path / "busy.yaml"
    path.write_text(_experiment(calibration.url, 2, "{stop_after_s: 1, quiet_s: 1, wait_s: 1}")
                    .replace("level_duration_s: 20", "level_duration_s: 2"))
    busy = hog(60)
    try:
        proc = subprocess.run([str(Path(sys.executable).with_name("servelab")), "run", str(path), "--out",
                               str(tmp_path / "runs"), "--json", "--reruns", "0"],
                              capture_output=True, text=True, timeout=120)
    finally:
        busy.kill()
        busy.wait()
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    doc = json.loads(proc.stdout)
    assert doc["status"] == "complete"
    for run in doc["runs"]:
        assert [t["status"] for t in run["trials"]] == ["complete", "complete"]  # none stopped early
        assert all(t["round"] is None for t in run["trials"])  # nor run again
        levels = [lv for t in run["trials"] for s in t["steps"] for lv in s["result"]["levels"]]
        assert any(lv["environment"]["contended"] for lv in levels)  # the hog was seen, and said
