"""Phase patterns on start-up logs of each engine (tests/fixtures/README.md says where each comes from)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.engines import get_engine
from servelab.lifecycle.phases import LogTailer, PhaseTracker

FIXTURES = Path(__file__).parent / "fixtures"


def replay_log(engine: str, fixture: str) -> tuple[PhaseTracker, list[float]]:
    """Feed a fixture through the tailer (\\r and \\n splitting) into the engine's tracker, one line per 0.1 s;
    returns the tracker and every progress value seen."""
    tracker = PhaseTracker(get_engine(engine))
    tailer = LogTailer(FIXTURES / fixture)
    progress: list[float] = []
    lines = tailer.read_lines() + tailer.flush()
    for i, line in enumerate(lines):
        tracker.feed(line, 0.1 * (i + 1))
        if tracker.current.progress is not None and (not progress or progress[-1] != tracker.current.progress):
            progress.append(tracker.current.progress)
    tailer.close()
    return tracker, progress


def test_sglang_tp8_phases_ranks_and_tqdm():
    tracker, progress = replay_log("sglang", "sglang_0.5.10.post1_tp8_startup.log")
    names = [p.name for p in tracker.phases]
    assert names == ["starting", "arg dump", "distributed init", "loading weights", "allocating KV cache",
                     "capturing CUDA graphs", "scheduler ready", "warm-up"]
    by_name = {p.name: p for p in tracker.phases}
    # Rank lines repeat ("Load weight end" from TP6 after TP0's KV line) without moving the phase back.
    assert by_name["loading weights"].progress == 1.0
    assert by_name["loading weights"].detail == "252.61 s"
    assert progress[:4] == [0.0, pytest.approx(1 / 64), pytest.approx(26 / 64), 1.0]  # a rank line on the bar
    assert by_name["capturing CUDA graphs"].progress == 1.0 and by_name["capturing CUDA graphs"].detail == "bs=1"
    assert tracker.ready_line_s is not None
    assert not tracker.ready  # the line is recorded; only the probe makes it ready


def test_sglang_heartbeats_are_our_probes_and_warmup_polls_only():
    adapter = get_engine("sglang")
    assert adapter.heartbeat_lines.search('[2026-11-29 14:04:59] INFO:     127.0.0.1:41234 - "GET /health '
                                          'HTTP/1.1" 503 Service Unavailable')
    assert adapter.heartbeat_lines.search('INFO:     127.0.0.1:41234 - "GET /model_info HTTP/1.1" 200 OK')
    assert not adapter.heartbeat_lines.search('INFO:     127.0.0.1:41240 - "POST /generate HTTP/1.1" 200 OK')


def test_vllm_eager_phases_without_graph_capture():
    tracker, progress = replay_log("vllm", "vllm_0.33.0_tp8_eager_startup.log")
    names = [p.name for p in tracker.phases]
    assert names == ["starting", "arg dump", "engine config", "distributed init", "loading weights",
                     "allocating KV cache", "engine ready", "starting HTTP server"]
    assert progress == [0.0, 0.5, 1.0]
    assert tracker.ready_line_s is not None  # "Application startup complete."
    adapter = get_engine("vllm")
    text = (FIXTURES / "vllm_0.33.0_tp8_eager_startup.log").read_text()
    assert {adapter.lint_log_line(line).setting for line in text.splitlines() if adapter.lint_log_line(line)} == {
        "--enforce-eager"}


def test_llama_server_phases():
    tracker, _ = replay_log("llama-server", "llama_server_0c1e570_startup.log")
    assert [p.name for p in tracker.phases] == ["starting", "initializing", "loading model", "allocating slots",
                                                "model loaded"]
    assert tracker.phases[3].detail == "1"
    assert tracker.ready_line_s is not None


def test_tgi_phases_and_its_ten_second_heartbeat():
    tracker, _ = replay_log("tgi", "tgi_3.3.6_startup.log")
    assert [p.name for p in tracker.phases] == ["starting", "arg dump", "downloading", "loading shards",
                                                "shards ready", "warm-up"]
    assert tracker.phases[4].detail == "22.628s"
    assert tracker.ready_line_s is not None
    assert get_engine("tgi").heartbeat_lines.search("INFO shard-manager: text_generation_launcher: Waiting for "
                                                    "shard to be ready... rank=0")


def test_llama_cpp_python_phases():
    tracker, _ = replay_log("llama-cpp-python", "llama_cpp_python_0.3.36_startup.log")
    assert [p.name for p in tracker.phases] == ["starting", "loading model", "allocating context", "chat format",
                                                "starting HTTP server"]
    assert tracker.ready_line_s is not None


def test_transformers_serve_phases_on_its_real_log():
    tracker, progress = replay_log("transformers-serve", "transformers_serve_5.24.0_startup.log")
    assert [p.name for p in tracker.phases] == ["starting", "loading weights", "starting HTTP server"]
    assert progress == [0.0, 1.0]  # "Loading weights: 0/272" then 272/272 on one \r-rewritten line
    assert tracker.phases[1].detail == ".venv-tf/models/smollm2-hf"
    assert tracker.ready_line_s is not None


def test_a_bar_is_read_before_its_line_ends_but_never_misread(tmp_path):
    """tqdm ends its line only at the next update: a slow bar's newest count sits in the unterminated piece."""
    log = tmp_path / "e.log"
    tracker = PhaseTracker(get_engine("sglang"))
    tailer = LogTailer(log)
    log.write_bytes(b"[t TP0] Load weight begin. avail mem=1 GB\n\rMulti-thread loading shards:  41% Completed "
                    b"| 26/64 [01:43<02:31,  3.98s/it]")
    for line in tailer.read_lines():
        tracker.feed(line, 1.0)
    assert tracker.current.progress is None  # not complete as a line yet
    tracker.feed_partial(tailer.pending(), 1.1)
    assert tracker.current.progress == pytest.approx(26 / 64)
    with open(log, "ab") as fh:
        fh.write(b"\rMulti-thread loading shards:  42% Completed | 27/6")  # cut mid-write
    tailer.read_lines()
    tracker.feed_partial(tailer.pending(), 1.2)
    assert tracker.current.progress == pytest.approx(26 / 64)  # "27/6" is not read as 100 %
    tailer.close()


# ---------------------------------------------------------------------------------------------------------------
# SGLang 0.5.23's capture lines (`Capture target verify CUDA graph begin.`, `Capture Frozen-KV MTP draft cuda graph
# begin.`, ...): the capture phase starts at them, and its 900 s budget applies to a capture that is quiet longer
# than the 300 s the phase before it gets.
# ---------------------------------------------------------------------------------------------------------------

def script_lines(name: str, ranks: int | None = None) -> list[tuple[float, str]]:
    """A replay script as the (script second, line) pairs the real replay writes: one copy per rank, tqdm bars
    as their frames, `?graph` steps kept (graphs on); of the placeholders only {rank} and {server_args} matter."""
    from servelab.engines.replay_script import load_script, tqdm_line

    script = load_script(name)
    n_ranks = ranks or int(script.meta.get("tp", "1"))
    out: list[tuple[float, str]] = []
    for step in script.steps:
        if step.condition == "nograph":
            continue
        if step.text is not None:
            for rank in range(n_ranks if step.ranks else 1):
                text = step.text.replace("{rank}", str(rank))
                out.append((step.t, text.replace("{server_args}", "ServerArgs(model_path='m', tp_size=8)")))
        elif step.directive == "tqdm":
            total = int(step.args.get("total", script.shards))
            until = float(step.args["until"])
            for n in range(total + 1):
                t = step.t + (until - step.t) * n / total
                desc = step.args["desc"].replace("{bs}", str(512 - n)).replace("{mem}", "13.00")
                out.append((t, tqdm_line(desc, n, total, t - step.t, step.args.get("style", "bar"))))
    return out


def judge_script(name: str, every_s: float = 5.0):
    """Feed a script's lines to the SGLang tracker and judge every `every_s` script seconds on the log alone (the
    strictest case: no CPU, read or memory evidence). Returns the tracker and the (t, verdict) pairs."""
    from servelab.lifecycle.diagnose import StartupJudge
    from servelab.records import EvidenceSample

    adapter = get_engine("sglang")
    tracker = PhaseTracker(adapter)
    judge = StartupJudge(adapter, model_bytes=None)
    lines = script_lines(name)
    verdicts, fed, t = [], 0, 0.0
    end = lines[-1][0]
    while t <= end + every_s:
        while fed < len(lines) and lines[fed][0] <= t:
            tracker.feed(lines[fed][1], lines[fed][0])
            fed += 1
        current = tracker.current
        judge.observe(EvidenceSample(t_s=t, phase=current.name, progress=current.progress, log_lines=fed))
        verdicts.append((t, judge.verdict(t, phase=current.name, phase_start_s=current.start_s,
                                          progress=current.progress, probe="down",
                                          ready_line_s=tracker.ready_line_s)))
        t += every_s
    return tracker, verdicts


@pytest.mark.parametrize("line", [
    "[2026-11-29 14:04:25 TP3] Capture cuda graph begin. This can take up to several minutes. avail mem=17.45 GB",
    "[2026-11-29 14:04:25 TP0] Capture piecewise CUDA graph begin. avail mem=17.45 GB",
    "[2026-11-29 14:04:25 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
    "bs=[1, 2, 4], avail mem=12.41 GB",
    "[2026-11-29 14:04:25 TP1] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2], "
    "avail mem=26.27 GB",
    "[2026-11-29 14:04:25 TP0] Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[512, 1024], "
    "avail mem=13.97 GB",
    "[2026-11-29 14:04:25 TP0] Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1], "
    "avail mem=7.39 GB",
    "[2026-11-29 14:04:25 TP0] Capture draft extend CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1], "
    "avail mem=7.01 GB",
    "[2026-11-29 14:04:25 TP0] Capture draft extend cuda graph begin. This can take up to several minutes. "
    "avail mem=7.01 GB",
    "[2026-11-29 14:04:25 TP0] Capture draft extend CUDA graph begin. step=0, avail mem=7.01 GB",
    "[2026-11-29 14:04:25 TP0] Capture single-CG draft extend begin. This can take several minutes. avail mem=7.0 GB",
    "[2026-11-29 14:04:25 TP0] Capture Frozen-KV MTP draft cuda graph begin.",
    "[2026-11-29 14:04:25 TP0] Capture UNO tree draft CUDA graph begin. avail mem=7.01 GB",
    "[2026-11-29 14:04:25 TP0] Capture target decode NPU graph begin. backend=full, num_tokens_per_req=1, bs=[1]",
])
def test_every_sglang_capture_begin_line_starts_the_capture_phase(line):
    tracker = PhaseTracker(get_engine("sglang"))
    tracker.feed("[2026-11-29 14:04:20 TP0] Memory pool end. avail mem=14.12 GB", 1.0)
    assert tracker.feed(line, 2.0)
    assert tracker.current.name == "capturing CUDA graphs" and tracker.current.start_s == 2.0


@pytest.mark.parametrize("line", [
    "[2026-11-29 14:04:25 TP0] Capture cuda graph bs [1, 2, 4, 8]",
    "[2026-11-29 14:04:25 TP0] Capture target verify CUDA graph end. elapsed=4.56 s, mem usage=0.38 GB",
    "[2026-11-29 14:04:25 TP0] Capture batch needs 8 request slots for 4096 tokens",
])
def test_capture_lines_that_begin_nothing(line):
    tracker = PhaseTracker(get_engine("sglang"))
    tracker.feed("[2026-11-29 14:04:20 TP0] Memory pool end. avail mem=14.12 GB", 1.0)
    assert not tracker.feed(line, 2.0) and tracker.current.name == "allocating KV cache"


@pytest.mark.parametrize("script,capture_begins_s,quiet_from_s,quiet_until_s", [
    ("sglang-eagle3-tp8", 151.0, 183.6, 563.6),  # prefill graphs, then a target-verify capture silent for 380 s
    ("sglang-mtp-tp2", 70.3, 70.3, 410.3),  # target-verify silent for 340 s, then the Frozen-KV MTP draft
])
def test_a_long_quiet_capture_in_sglang_0_5_23_gets_the_capture_budget(script, capture_begins_s, quiet_from_s,
                                                                       quiet_until_s):
    tracker, verdicts = judge_script(script)
    quiet = [(t, v) for t, v in verdicts if quiet_from_s + 300 < t < quiet_until_s]
    assert quiet, "the script has a quiet stretch longer than the default budget"
    for t, v in quiet:
        assert v.state == "loading", (t, v.reason)
        assert v.evidence["phase"] == "capturing CUDA graphs" and v.evidence["budget_s"] == 900
        assert v.evidence["quiet_s"] >= 300  # the default budget: a stall in any other phase
    assert not [t for t, v in verdicts if v.state == "stalled"]
    names = [p.name for p in tracker.phases]
    assert names == ["starting", "arg dump", "loading weights", "allocating KV cache", "capturing CUDA graphs",
                     "scheduler ready", "warm-up"]
    capture = tracker.phases[4]
    assert capture.start_s == capture_begins_s  # at the begin line, not at the first bar
    assert capture.end_s > quiet_until_s
    assert tracker.ready_line_s is not None


def test_prefill_shape_bar_is_capture_progress():
    tracker = PhaseTracker(get_engine("sglang"))
    tracker.feed("[t TP0] Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[512], avail mem=1 GB",
                 1.0)
    assert tracker.feed("Capturing prefill shape (num_tokens=8192 avail_mem=13.20 GB):  25%|██▌       | 4/16 "
                        "[00:08<00:24,  2.00s/it]", 2.0)
    assert tracker.current.progress == pytest.approx(0.25) and tracker.current.detail == "num_tokens=8192"


def test_sglang_0_5_23_distributed_init_and_flashinfer_autotune_are_phases_with_their_budgets():
    # 0.5.23's wording (distributed/bootstrap.py, model_executor/runner/flashinfer_autotune.py): without these,
    # NCCL init counted as "arg dump" (300 s) and a long autotune as "allocating KV cache" (300 s)
    adapter = get_engine("sglang")
    tracker = PhaseTracker(adapter)
    tracker.feed("[2026-11-29 14:00:01] server_args=ServerArgs(model_path='m', tp_size=8)", 1.0)
    assert tracker.feed("[2026-11-29 14:00:09 TP3] Init parallel begin.", 9.0)
    assert tracker.current.name == "distributed init" and adapter.phase_budgets_s["distributed init"] == 600
    tracker.feed("[2026-11-29 14:00:40 TP0] Load weight begin. avail mem=78.1 GB", 40.0)
    tracker.feed("[2026-11-29 14:05:00 TP0] Memory pool end. avail mem=14.12 GB", 300.0)
    assert tracker.feed("[2026-11-29 14:05:01 TP0] Running FlashInfer autotune with cache: /root/.cache/fi.json",
                        301.0)
    assert tracker.current.name == "autotuning kernels" and adapter.phase_budgets_s["autotuning kernels"] == 900
    assert tracker.feed("[2026-11-29 14:09:00 TP0] Capture target decode CUDA graph begin. bs=[1, 2]", 540.0)
    assert tracker.current.name == "capturing CUDA graphs"
