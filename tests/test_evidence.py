"""Evidence readers on real processes, and the verdict rules on hand-made samples (pure)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from servelab.engines import get_engine
from servelab.lifecycle.diagnose import OOM_HINT, StartupJudge, crashed_verdict
from servelab.lifecycle.evidence import EvidenceSampler, LogCounters, port_state, thread_states
from servelab.records import EvidenceSample

PY = sys.executable


def start(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    return proc


def test_thread_states_count_futex_waits_of_a_real_process():
    proc = start("import threading, time\ne = threading.Event()\n"
                 "[threading.Thread(target=e.wait, daemon=True).start() for _ in range(20)]\n"
                 "print('up', flush=True); time.sleep(60)")
    try:
        states, futex = thread_states(proc.pid)
        assert sum(states.values()) == 21
        assert states["S"] >= 20
        assert futex >= 20
    finally:
        proc.kill()
        proc.wait()


def test_sampler_sees_reads_cpu_and_children(tmp_path):
    data = tmp_path / "weights.bin"
    data.write_bytes(b"\0" * (4 << 20))
    code = (f"import os, subprocess, time\nchild = subprocess.Popen(['sleep', '60'])\nfd = os.open({str(data)!r}, "
            f"os.O_RDONLY)\nprint('up', flush=True)\nwhile True:\n    os.pread(fd, 1 << 20, 0)\n    time.sleep(0.002)")
    proc = start(code)
    sampler = EvidenceSampler(proc.pid, log_path=data)
    try:
        first = sampler.sample(0.0, LogCounters(lines=3, phase="loading weights", progress=0.5), probe="down")
        time.sleep(0.5)
        second = sampler.sample(0.5, LogCounters(lines=3), probe="down")
    finally:
        proc.kill()
        proc.wait()
        sampler.close()
    assert first.processes == 2 and first.threads >= 2
    assert first.log_bytes == 4 << 20 and first.log_lines == 3 and first.phase == "loading weights"
    assert second.read_chars - first.read_chars > 1 << 20
    assert second.cpu_s >= first.cpu_s and second.rss_bytes > 0
    assert first.gpu_memory_bytes is None  # no NVML here: unknown, not zero


def test_port_state():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert port_state("127.0.0.1", port) == "closed"  # bound, not listening: vLLM's early socket
        s.listen()
        assert port_state("127.0.0.1", port) == "open"


# --------------------------------------------------------------------------------------------------------------
# The verdict rules
# --------------------------------------------------------------------------------------------------------------

def sample(t: float, **kw) -> EvidenceSample:
    base = dict(t_s=t, phase="loading weights", log_lines=10, cpu_s=5.0, read_bytes=0, read_chars=10**9,
                rss_bytes=2 * 10**9, threads=131, thread_states={"S": 131}, threads_in_futex=128, processes=8,
                gpu_memory_bytes=None, gpu_util_percent=0.0, probe="down")
    base.update(kw)
    return EvidenceSample(**base)


def judge(budget: float | None = None, model_bytes: int = 547 * 10**9) -> StartupJudge:
    return StartupJudge(get_engine("sglang"), model_bytes, budget)


def verdict(j: StartupJudge, now: float, **kw):
    args = dict(phase="loading weights", phase_start_s=10.0, progress=None, probe="down", ready_line_s=None)
    args.update(kw)
    return j.verdict(now, **args)


def test_the_story_load_is_loading_not_hung():
    """131 threads in futex waits, 0 % GPU, a log silent for minutes: reads climb, so it is loading."""
    j = judge()
    for i in range(300):  # five minutes, one sample a second, log and tqdm silent throughout
        j.observe(sample(float(i), read_chars=10**9 + i * 2 * 10**9, cpu_s=5.0 + 0.02 * i))
    v = verdict(j, 299.0)
    assert v.state == "loading"
    assert v.evidence["moving"] == ["read bytes"]
    assert v.evidence["threads_in_futex"] == 128 and v.evidence["gpu_util_percent"] == 0.0
    assert "idle threads are normal" in v.reason


def test_a_moving_tqdm_counter_alone_is_progress():
    j = judge(budget=30.0)
    for i in range(100):
        j.observe(sample(float(i), progress=i // 20 / 64))  # one shard every 20 s, nothing else moves
    assert verdict(j, 99.0).state == "loading"


def test_nothing_moving_for_the_budget_is_a_stall_that_names_its_evidence():
    j = judge(budget=60.0)
    for i in range(0, 70):
        j.observe(sample(float(i), progress=0.4))
    v = verdict(j, 69.0, progress=0.4)
    assert v.state == "stalled"
    assert "nothing moved for 69 s in phase 'loading weights' (budget 60 s)" in v.reason
    for words in ("log lines", "tqdm counter", "read bytes", "CPU time"):
        assert f"{words} still for" in v.reason
    assert v.evidence["moving"] == [] and v.evidence["budget_s"] == 60.0
    assert verdict(j, 50.0, progress=0.4).state == "loading"  # within the budget: not yet


def test_the_weight_budget_comes_from_the_checkpoint_size():
    j = judge(model_bytes=547 * 10**9)
    for i in range(0, 1000, 10):
        j.observe(sample(float(i)))
    assert verdict(j, 990.0).state == "loading"  # 547 GB / 0.5 GB/s = 1094 s
    j.observe(sample(1200.0))
    assert verdict(j, 1200.0).state == "stalled"
    assert verdict(j, 1200.0, phase="capturing CUDA graphs").state == "stalled"  # 900 s budget there


def test_probe_traffic_is_not_progress():
    """A hung llama-server still answers our 20 probes a second: a little CPU and a few bytes are not progress."""
    j = judge(budget=20.0)
    for i in range(30):
        j.observe(sample(float(i), cpu_s=5.0 + 0.02 * i, read_chars=10**9 + 2000 * i))
    assert verdict(j, 29.0).state == "stalled"


def test_after_the_ready_line_the_port_must_follow():
    j = judge()
    for i in range(70):
        j.observe(sample(float(i), phase="warm-up"))
    v = verdict(j, 69.0, phase="warm-up", ready_line_s=5.0)
    assert v.state == "stalled" and "after the ready line (at 5.0 s) the probe still says down" in v.reason


def test_starting_before_any_recognised_line():
    j = judge()
    j.observe(sample(0.5, phase="starting", log_lines=0))
    assert verdict(j, 0.5, phase="starting", phase_start_s=0.0).state == "starting"


def test_crashed_names_the_signal_and_the_oom_killer():
    v = crashed_verdict(-9, "loading weights", ["Multi-thread loading shards:  40% Completed | 26/64"],
                        "Rank 3 scheduler died during initialization (exit code: -9)")
    assert v.state == "crashed"
    assert v.reason.startswith("killed by SIGKILL during start-up (phase 'loading weights')")
    assert v.evidence["hint"] == OOM_HINT and v.evidence["exit_signal"] == "SIGKILL"
    assert "Rank 3 scheduler died" in v.reason
    plain = crashed_verdict(1, "loading model", [])
    assert plain.reason.startswith("exit code 1") and "hint" not in plain.evidence


@pytest.mark.parametrize("field", ["gpu_memory_bytes"])
def test_gpu_memory_growth_is_progress(field):
    j = judge(budget=30.0)
    for i in range(60):
        j.observe(sample(float(i), **{field: i * 2**30}))
    v = verdict(j, 59.0)
    assert v.state == "loading" and "GPU memory" in v.evidence["moving"]


def test_gpu_reader_sums_the_trees_memory_through_nvml(monkeypatch):
    """No GPU here: NVML's shape stands in (as in the provenance test), to check what is read and summed."""
    from types import SimpleNamespace

    from servelab.host.gpus import Nvml

    class FakeNvml:
        @staticmethod
        def nvmlInit():
            pass

        @staticmethod
        def nvmlShutdown():
            pass

        @staticmethod
        def nvmlDeviceGetCount():
            return 2

        @staticmethod
        def nvmlDeviceGetHandleByIndex(i):
            return i

        @staticmethod
        def nvmlDeviceGetComputeRunningProcesses(handle):
            return [SimpleNamespace(pid=100 + handle, usedGpuMemory=2**30 * (handle + 1)),
                    SimpleNamespace(pid=999, usedGpuMemory=2**34)]  # someone else's process: not ours

        @staticmethod
        def nvmlDeviceGetUtilizationRates(handle):
            return SimpleNamespace(gpu=[0, 37][handle])

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml)
    reader = Nvml()
    assert reader.available
    assert reader.memory_of({100, 101}) == (3 * 2**30, 37.0)
    reader.close()
    assert reader.memory_of({100}) == (None, None)
