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
