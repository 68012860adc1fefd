"""The replayed SGLang and vLLM start-ups against servelab's real start-up loop, doctor and lint.

The replay engine is a real process tree (servelab/engines/replay.py): it writes the engine's log lines at
compressed time, parks idle threads, reads a file while "loading", and answers its port as the engine does.
Speeds are chosen so each start-up takes a few seconds; time assertions are loose (2 shared cores).
"""

from __future__ import annotations

import json
import os
import signal
import threading

import psutil
import pytest

from servelab.engines import EngineSpec, get_engine
from servelab.errors import EngineFailed
from servelab.lifecycle.doctor import diagnose
from servelab.lifecycle.launch import LaunchStatus, start_engine
from servelab.lifecycle.ports import free_port
from servelab.lifecycle.probe import http_get
from servelab.lifecycle.readback import read_runtime_config
from servelab.lifecycle.stacks import read_stacks
from servelab.models import resolve_model
from servelab.records import ProcessStacks, StackReport

TIMEOUT_S = 120


def replay(engine: str = "replay-sglang", speed: float = 200, variant: str = "normal", extra=(), **kw) -> EngineSpec:
    return EngineSpec(engine=engine, model="smollm2", options={"speed": str(speed), "variant": variant},
                      extra_args=list(extra), **kw)


def frames_of(proc: ProcessStacks) -> list[list[tuple[str, str]]]:
    """Each thread's Python frames as (function, file), innermost first."""
    return [[(f.function, f.module or "") for f in t.frames if not f.native] for t in proc.threads]


def calls(thread: list[tuple[str, str]], function: str, path: str) -> bool:
    return any(fn.endswith(function) and module.endswith(path) for fn, module in thread)


def schedulers(report: StackReport) -> dict[str, ProcessStacks]:
    return {p.role: p for p in report.processes if p.role and p.role.endswith("scheduler")}


def tree_gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    """The story's 313 s SGLang tp=8 start-up at speed 50 (about 6 s), with doctor run on it while it loads."""
    updates: list[LaunchStatus] = []
    doctor_during_load: dict = {}
    log_dir = tmp_path_factory.mktemp("story")

    def on_update(status: LaunchStatus) -> None:
        updates.append(status)
        if status.phase == "loading weights" and (status.progress or 0) > 0.1 and "thread" not in doctor_during_load:
            log = next(log_dir.glob("*.log"))
            url = f"http://127.0.0.1:{log.stem.rsplit('-', 1)[1]}"
            thread = threading.Thread(target=lambda: doctor_during_load.update(
                result=diagnose(pid=status.pid, log=log, url=url, seconds=1.5)))
            doctor_during_load["thread"] = thread
            thread.start()

    running = start_engine(replay(speed=50), log_dir, on_update=on_update, ready_timeout_s=TIMEOUT_S)
    doctor_during_load["thread"].join(30)
    try:
        yield {"engine": running, "updates": updates, "doctor": doctor_during_load.get("result")}
    finally:
        running.stop()


def test_the_313_s_start_up_is_loading_with_rising_progress_then_ready(story):
    running, updates = story["engine"], story["updates"]
    states = [u.verdict.state for u in updates if u.verdict]
    assert "stalled" not in states and "crashed" not in states
    assert "loading" in states and states[-1] == "ready"
    weights = [u.progress for u in updates if u.phase == "loading weights" and u.progress is not None]
    assert weights == sorted(weights) and len(set(weights)) >= 5 and weights[-1] > 0.9
    assert [p.name for p in running.phases] == ["starting", "arg dump", "distributed init", "loading weights",
                                                "allocating KV cache", "capturing CUDA graphs", "scheduler ready",
                                                "warm-up", "ready"]
    # The replay is scripted to be ready at 313 s / 50 = 6.3 s (6.5 s measured with the 2 cores busy). Up to 3x that
    # (18.8 s) is headroom for a loaded host; later than that, readiness was seen late (the timeout is 120 s).
    story_s = 313 / 50
    assert story_s * 0.8 < running.ready_s < story_s * 3, running.ready_s


def test_the_loading_evidence_looks_like_the_story(story):
    running = story["engine"]
    loading = [s for s in running.evidence if s.phase == "loading weights"]
    assert loading, "no evidence sample during the weight load"
    s = loading[-1]
    assert s.threads >= 100 and s.threads_in_futex >= 100  # idle threads, as the 131 of the story
    # SGLang's tree: the launcher (tokenizer manager, HTTP server), 8 schedulers and the detokenizer
    assert s.processes == 10 and s.port == "closed"  # SGLang's port stays closed while it loads
    assert running.evidence[-1].read_chars > running.evidence[0].read_chars


def test_ready_server_with_idle_threads_is_ready_and_lint_is_clean(story):
    running = story["engine"]
    result = running.result()
    assert result.verdict.state == "ready" and result.verdict.evidence["threads_in_futex"] >= 100
    assert [f for f in running.lint() if f.severity == "serious"] == []
    assert running.runtime_config()["disable_cuda_graph"] is False


def test_doctor_on_the_running_replay(story):
    during = story["doctor"]
    assert during is not None and during.engine == "replay-sglang"
    assert during.verdict.state == "loading", during.verdict.reason
    assert during.verdict.evidence["phase"] == "loading weights"
    assert "tqdm counter" in during.verdict.evidence["moving"] or "read bytes" in during.verdict.evidence["moving"]
    running = story["engine"]
    after = diagnose(pid=running.pid, log=running.log_path, url=running.url, seconds=1.0)
    assert after.verdict.state == "ready"
    assert "idle threads are normal" in after.verdict.reason


def test_hang_in_load_is_stalled_within_its_budget_with_the_evidence(tmp_path):
    updates: list[LaunchStatus] = []
    with pytest.raises(EngineFailed) as info:
        start_engine(replay(speed=200, variant="hang-in-load"), tmp_path, on_update=updates.append,
                     ready_timeout_s=TIMEOUT_S)
    verdict = info.value.launch_result.verdict
    assert verdict.state == "stalled"
    budget = 547e9 / 0.5e9 / 200  # the weight budget at this speed: 5.5 s
    assert verdict.evidence["budget_s"] == pytest.approx(budget, abs=0.1)
    assert budget <= verdict.evidence["quiet_s"] < budget + 5
    assert verdict.evidence["phase"] == "loading weights" and 0.3 < verdict.evidence["progress"] < 0.5
    assert "read bytes still for" in verdict.reason and "tqdm counter still for" in verdict.reason
    assert verdict.evidence["stopped_by_servelab"] is True
    assert "stalled" in info.value.message and "--stall-budget" in info.value.hint
    assert tree_gone([updates[-1].pid])
    assert "loading" in [u.verdict.state for u in updates if u.verdict]  # it was loading before it hung


def test_crash_mid_load_names_sigkill_and_the_oom_killer(tmp_path):
    pids: list[int] = []

    def remember(status: LaunchStatus) -> None:
        if not pids:
            pids.extend([status.pid, *[c.pid for c in psutil.Process(status.pid).children()]])

    with pytest.raises(EngineFailed) as info:
        start_engine(replay(speed=200, variant="crash-9-mid-load"), tmp_path, on_update=remember,
                     ready_timeout_s=TIMEOUT_S)
    failure = info.value
    assert "killed by SIGKILL" in failure.message and "OOM" in failure.hint
    assert failure.engine_exit_code == -signal.SIGKILL
    verdict = failure.launch_result.verdict
    assert verdict.state == "crashed" and verdict.evidence["exit_signal"] == "SIGKILL"
    assert verdict.evidence["phase"] == "loading weights"
    assert any("Multi-thread loading shards" in line for line in failure.log_tail)
    assert tree_gone(pids)  # the rank processes went with it


def test_never_bind_is_stalled_after_the_ready_line(tmp_path):
    with pytest.raises(EngineFailed) as info:
        # stacks=False: this one is about the probe; the stall's stacks are tests/test_up_stacks.py's
        start_engine(replay(speed=200, variant="never-bind"), tmp_path, ready_timeout_s=TIMEOUT_S, stacks=False)
    verdict = info.value.launch_result.verdict
    assert verdict.state == "stalled"
    assert "after the ready line" in verdict.reason and "probe still says down" in verdict.reason
    assert verdict.evidence["probe"] == "down"


def test_slow_steady_load_with_a_silent_log_stays_loading(tmp_path):
    """The bar moves only every quarter (longer than the 1.5 s stall budget) while the reads flow."""
    updates: list[LaunchStatus] = []
    with start_engine(replay(speed=60, variant="slow-steady", stall_budget_s=1.5), tmp_path,
                      on_update=updates.append, ready_timeout_s=TIMEOUT_S) as running:
        assert running.result().verdict.state == "ready"
    verdicts = [u.verdict for u in updates if u.verdict]
    assert "stalled" not in [v.state for v in verdicts]
    # The story's case: log and bar silent, yet loading, because the reads (and maybe CPU time) move.
    silent_log = [v for v in verdicts if v.state == "loading" and "read bytes" in v.evidence.get("moving", [])
                  and not {"log lines", "tqdm counter"} & set(v.evidence.get("moving", []))]
    assert silent_log, "never saw a stretch where the log was silent and the reads moved"


def test_disable_cuda_graph_is_flagged_before_any_benchmark(tmp_path):
    with start_engine(replay(speed=200, extra=["--disable-cuda-graph"]), tmp_path,
                      ready_timeout_s=TIMEOUT_S) as running:
        assert "capturing CUDA graphs" not in [p.name for p in running.phases]  # it really skipped capture
        findings = running.lint()  # what `up` and `run` print and record before benchmarking
        cuda = [f for f in findings if f.setting == "--disable-cuda-graph"]
        assert cuda and cuda[0].severity == "serious"
        assert "command line and /server_info" in cuda[0].why
        # The same verdict from the server's own config alone (a flag SGLang set by itself, say).
        config = read_runtime_config(running.url, running.adapter)
        assert config["disable_cuda_graph"] is True
        assert config["internal_states"][0]["memory_usage"]["graph"] == 0.0
        alone = get_engine("sglang").lint(EngineSpec(engine="sglang", model="m"), ["python"], config)
        assert {f.setting for f in alone if f.severity == "serious"} == {"--disable-cuda-graph"}


def test_vllm_replay_binds_early_and_reports_its_version(tmp_path):
    updates: list[LaunchStatus] = []
    with start_engine(replay("replay-vllm", speed=100), tmp_path, on_update=updates.append,
                      ready_timeout_s=TIMEOUT_S) as running:
        names = [p.name for p in running.phases]
        assert names[-3:] == ["engine ready", "starting HTTP server", "ready"]
        assert "compiling" in names and "capturing CUDA graphs" in names
        assert {u.probe for u in updates if u.phase == "loading weights"} == {"down"}  # bound, not listening
        status, body = http_get(running.url, "/version", 5)
        assert status == 200 and get_engine("vllm").fingerprint(json.loads(body))
        assert json.loads(body) == {"version": "0.33.0"}
        # Its tree as vLLM's: the engine core and one worker per rank, each in its busy loop waiting for work.
        report = read_stacks(running.pid, running.adapter, samples=1)
        roles = {p.role for p in report.processes}
        assert {"DP0 engine core", *(f"TP{n} worker" for n in range(8))} <= roles, roles
        workers = [p for p in report.processes if p.role and p.role.endswith("worker")]
        assert all(any(calls(t, "WorkerProc.worker_busy_loop", "vllm/v1/executor/multiproc_executor.py")
                       for t in frames_of(p)) for p in workers)
        core = next(p for p in report.processes if p.role == "DP0 engine core")
        assert any(calls(t, "EngineCoreProc.run_busy_loop", "vllm/v1/engine/core.py") for t in frames_of(core))


def test_ctrl_c_during_the_load_leaves_no_process(tmp_path):
    seen: list[int] = []

    def interrupt(status: LaunchStatus) -> None:
        if status.phase == "loading weights":
            seen.extend([status.pid, *[c.pid for c in psutil.Process(status.pid).children(recursive=True)]])
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        start_engine(replay(speed=50), tmp_path, on_update=interrupt, ready_timeout_s=TIMEOUT_S)
    assert len(seen) == 10  # the launcher, its 8 schedulers and the detokenizer
    assert tree_gone(seen)
    assert not any(p.pid in seen for p in psutil.process_iter() if p.status() != psutil.STATUS_ZOMBIE)
    assert os.getpid() not in seen


def test_py_spy_sees_every_rank_in_the_loader_mid_load_and_in_its_request_loop_once_ready(story):
    """The ranks run stand-ins named and laid out as SGLang's own modules (servelab/engines/replay_frames/), so the
    real py-spy reads what a real SGLang tp=8 would show: mid-load, each scheduler's main thread in
    DefaultModelLoader.load_model and its 8 loader threads in the multithread safetensors iterator; once ready,
    each in Scheduler.event_loop_overlap waiting in recv_requests."""
    loading = story["doctor"].stack_report  # doctor read the stacks while the weights loaded
    assert loading is not None and loading.unavailable is None
    ranks = schedulers(loading)
    assert sorted(ranks) == [f"TP{n} scheduler" for n in range(8)]  # from their titles, sglang::scheduler_TP<n>
    assert "detokenizer" in [p.role for p in loading.processes]
    for role, proc in ranks.items():
        threads = frames_of(proc)
        assert any(calls(t, "DefaultModelLoader.load_model", "sglang/srt/model_loader/loader.py")
                   and calls(t, "ModelRunner.load_model", "sglang/srt/model_executor/model_runner.py")
                   and calls(t, "run_scheduler_process", "sglang/srt/managers/scheduler.py") for t in threads), role
        pool = [t for t in proc.threads if (t.name or "").startswith("ThreadPoolExecutor")]
        reading = [t for t in frames_of(proc) if calls(t, "_load_file", "sglang/srt/model_loader/weight_utils.py")]
        # SGLang's 8 loader threads, all in _load_file but one or two caught between two shards
        assert len(pool) == 8 and len(reading) >= 6, (role, len(pool), len(reading))
        assert proc.kind == "loading", (role, proc.line)
    assert loading.verdict == "loading" and loading.summary.startswith("8 of 8 ranks loading weights")
    # the main threads wait on the loader's futures; the loader threads' reads move: a load, not a hang
    assert loading.summary.endswith("stacks moving: loading, not hung"), loading.summary

    running = story["engine"]
    ready = read_stacks(running.pid, running.adapter, samples=2, interval_s=0.5)
    assert ready.verdict == "idle", ready.summary
    for role, proc in schedulers(ready).items():
        assert any(calls(t, "Scheduler.recv_requests", "sglang/srt/managers/scheduler.py")
                   and calls(t, "Scheduler.event_loop_overlap", "sglang/srt/managers/scheduler.py")
                   for t in frames_of(proc)), role
        assert not any(calls(t, "_load_file", "weight_utils.py") for t in frames_of(proc))  # the loader is gone
    assert len(schedulers(ready)) == 8


def test_deadlock_at_init_leaves_rank_3_in_all_reduce_and_the_others_in_broadcast(tmp_path):
    """Each rank's collective sits under SGLang's distributed init (a wait): named by the collective, the ranks
    disagree, and both read_stacks and `servelab doctor --pid` call it a likely deadlock."""
    import subprocess
    import sys
    import time

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "servelab.engines.replay", "--script", "sglang-tp8",
                             "--speed", "50", "--variant", "deadlock-at-init", "--port", str(port),
                             "--model-file", str(resolve_model("smollm2").path)],
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "log").open("w"))
    try:
        time.sleep(9.4 / 50 + 1.0)  # past "Init torch distributed ends" at script second 9.4: nothing comes
        report = read_stacks(proc.pid, get_engine("replay-sglang"), samples=2, interval_s=0.5)
        ranks = schedulers(report)
        assert len(ranks) == 8, report.summary
        for role, p in ranks.items():
            collective = "all_reduce" if role == "TP3 scheduler" else "broadcast"
            assert any(calls(t, collective, "torch/distributed/distributed_c10d.py") for t in frames_of(p)), role
            assert p.moving is False, p.line  # nothing moves
        assert report.verdict == "deadlock", report.summary
        assert report.summary.startswith("ranks 0-2,4-7 in broadcast (torch.distributed), rank 3 in all_reduce "
                                         "(torch.distributed): ranks disagree on the collective"), report.summary
        assert report.summary.endswith("a likely deadlock"), report.summary
        doctor = subprocess.run([sys.executable, "-m", "servelab.cli", "doctor", "--pid", str(proc.pid), "--seconds",
                                 "1.5", "--json"], capture_output=True, text=True, timeout=120)
        d = json.loads(doctor.stdout)
        assert d["engine"] == "replay-sglang", d["engine"]
        assert d["stack_report"]["verdict"] == "deadlock", d["stack_report"]["summary"]
        assert "rank 3 in all_reduce" in d["stack_report"]["summary"]
        assert "ranks disagree on the collective" in d["stack_report"]["summary"]
        # Within its stall budget the counters still say starting or loading; the stacks say it will not move
        # again: the reason says so and doctor exits 1, as for a stall.
        assert d["verdict"]["state"] in ("loading", "stalled"), d["verdict"]
        if d["verdict"]["state"] == "loading":
            assert "; but the stacks: ranks 0-2,4-7 in broadcast" in d["verdict"]["reason"], d["verdict"]["reason"]
            assert d["verdict"]["evidence"]["stacks_verdict"] == "deadlock"
            assert doctor.returncode == 1, doctor.stderr
        assert "Load weight begin" not in (tmp_path / "log").read_text()
    finally:
        proc.terminate()
        proc.wait(10)
