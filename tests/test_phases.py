"""LogTailer (partial lines, \\r, truncation, rotation) and PhaseTracker (timeline from adapter patterns)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from servelab.engines.base import EngineAdapter, PhasePattern
from servelab.engines.llamacpp import LlamaCppEmbedded
from servelab.lifecycle.phases import LogTailer, PhaseTracker

FIXTURES = Path(__file__).parent / "fixtures"


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


# --------------------------------------------------------------------------------------------------------------
# LogTailer
# --------------------------------------------------------------------------------------------------------------

def test_tailer_waits_for_the_end_of_a_partial_line(tmp_path):
    log = tmp_path / "e.log"
    tailer = LogTailer(log)
    assert tailer.read_lines() == []  # not created yet
    log.write_bytes(b"first\nsec")
    assert tailer.read_lines() == ["first"]
    assert tailer.read_lines() == []
    append(log, b"ond\nthird\n")
    assert tailer.read_lines() == ["second", "third"]
    append(log, b"no newline at exit")
    assert tailer.read_lines() == []
    assert tailer.flush() == ["no newline at exit"]


def test_tailer_splits_carriage_returns_and_keeps_split_utf8_intact(tmp_path):
    log = tmp_path / "e.log"
    tailer = LogTailer(log)
    snowman = "☃".encode()
    log.write_bytes(b"bar  10%\rbar  20%\r\nx" + snowman[:1])
    assert tailer.read_lines() == ["bar  10%", "bar  20%"]
    append(log, snowman[1:] + b"\n")
    assert tailer.read_lines() == ["x☃"]  # a multibyte character cut between two reads is decoded whole


def test_tailer_starts_after_an_earlier_run(tmp_path):
    log = tmp_path / "e.log"
    log.write_bytes(b"old run\n")
    tailer = LogTailer(log, start_offset=log.stat().st_size)
    append(log, b"new run\n")
    assert tailer.read_lines() == ["new run"]


def test_tailer_restarts_after_truncation(tmp_path):
    log = tmp_path / "e.log"
    log.write_bytes(b"one\ntwo\nthree\n")
    tailer = LogTailer(log)
    assert tailer.read_lines() == ["one", "two", "three"]
    with open(log, "r+b") as fh:  # truncated in place, as copytruncate rotation does
        fh.truncate(0)
    append(log, b"after\n")
    assert tailer.read_lines() == ["after"]
    assert tailer.restarts == 1
    append(log, b"more\n")
    assert tailer.read_lines() == ["more"]


def test_tailer_follows_rotation_without_losing_the_old_file_end(tmp_path):
    log = tmp_path / "e.log"
    log.write_bytes(b"old 1\n")
    tailer = LogTailer(log)
    assert tailer.read_lines() == ["old 1"]
    append(log, b"old 2\nold partial")  # written after our last read, before the rotation
    os.rename(log, tmp_path / "e.log.1")
    log.write_bytes(b"new 1\n")
    assert tailer.read_lines() == ["old 2", "old partial", "new 1"]
    assert tailer.restarts == 1
    append(log, b"new 2\n")
    assert tailer.read_lines() == ["new 2"]


def test_tailer_does_not_hold_a_runaway_unterminated_line(tmp_path):
    log = tmp_path / "e.log"
    tailer = LogTailer(log, max_line_bytes=100)
    log.write_bytes(b"x" * 250)
    lines = tailer.read_lines()
    assert lines == ["x" * 250]  # emitted although unterminated: a runaway line must not grow memory forever


# --------------------------------------------------------------------------------------------------------------
# PhaseTracker on the real llama.cpp log
# --------------------------------------------------------------------------------------------------------------

def test_llamacpp_patterns_on_a_real_xllamacpp_startup_log():
    lines = (FIXTURES / "llamacpp_xllamacpp_startup.log").read_text().splitlines()
    tracker = PhaseTracker(LlamaCppEmbedded())
    for i, line in enumerate(lines):
        tracker.feed(line, t_s=0.1 * (i + 1))
    assert tracker.ready_line_s is not None  # "listening on http://..." was recognized ...
    assert not tracker.ready  # ... but a log line alone does not make the engine ready
    tracker.mark_ready(5.0)
    phases = tracker.phases
    assert [p.name for p in phases] == ["starting", "initializing", "loading model", "allocating slots",
                                        "model loaded", "ready"]
    by_name = {p.name: p for p in phases}
    assert by_name["loading model"].detail.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert by_name["allocating slots"].detail == "8"
    for earlier, later in zip(phases, phases[1:]):
        assert earlier.start_s <= later.start_s
        assert earlier.end_s == later.start_s  # a phase ends when the next one starts
    assert tracker.last_line.endswith("main loop exited")


def test_a_ready_line_is_recorded_not_trusted():
    tracker = PhaseTracker(LlamaCppEmbedded())
    tracker.feed("0.00.989.830 I srv          init: listening on http://127.0.0.1:18555", 1.0)
    assert tracker.ready_line_s == 1.0
    assert tracker.current.name == "starting"


def test_phases_only_move_forward():
    tracker = PhaseTracker(LlamaCppEmbedded())
    tracker.feed("srv    load_model: loading model '/m/a.gguf'", 1.0)
    tracker.feed("srv          init: model loaded", 2.0)
    # A repeat of an earlier phase (another rank, a retry message) is not a step back.
    assert not tracker.feed("srv    load_model: loading model '/m/a.gguf'", 3.0)
    assert [p.name for p in tracker.phases] == ["starting", "loading model", "model loaded"]
    assert tracker.current.end_s is None
    tracker.close(4.0)
    assert tracker.current.end_s == 4.0


def test_lines_after_ready_update_last_line_only():
    tracker = PhaseTracker(LlamaCppEmbedded())
    tracker.mark_ready(1.0)
    tracker.feed("srv    load_model: loading model '/m/a.gguf'", 2.0)
    tracker.feed("   ", 2.5)
    assert [p.name for p in tracker.phases] == ["starting", "ready"]
    assert tracker.last_line == "srv    load_model: loading model '/m/a.gguf'"


# --------------------------------------------------------------------------------------------------------------
# Progress from \r-rewritten tqdm lines
# --------------------------------------------------------------------------------------------------------------

class ShardLoader(EngineAdapter):
    """A test adapter with the vLLM-style safetensors progress bar."""

    name = "shards"
    title = "shard loader"
    phases = [
        PhasePattern("initializing", re.compile(r"Initializing engine")),
        PhasePattern("loading weights", re.compile(
            r"Loading safetensors checkpoint shards:\s+\d+% Completed \| (?P<n>\d+)/(?P<total>\d+)"), progress=True),
        PhasePattern("warm-up", re.compile(r"Capturing CUDA graphs")),
    ]


def test_tqdm_progress_rises_through_carriage_returns(tmp_path):
    log = tmp_path / "e.log"
    log.write_bytes(b"INFO Initializing engine\n")
    tailer = LogTailer(log)
    tracker = PhaseTracker(ShardLoader())
    seen: list[float] = []
    t = 0.0
    bar = "Loading safetensors checkpoint shards: {pct:3d}% Completed | {n}/4 [00:0{n}<00:03,  1.00s/it]"
    # tqdm writes each update as \r + the whole bar, and ends the bar with \n.
    for n in range(5):
        append(log, ("\r" + bar.format(pct=n * 25, n=n)).encode())
        t += 0.5
        for line in tailer.read_lines():
            tracker.feed(line, t)
        if tracker.current.name == "loading weights":
            seen.append(tracker.current.progress)
    append(log, b"\nINFO Capturing CUDA graphs\n")
    for line in tailer.read_lines():
        tracker.feed(line, t + 0.5)
    # The \r-ended piece is complete only when the next \r arrives, so progress lags one update behind the file.
    assert seen == [0.0, 0.25, 0.5, 0.75]
    names = [p.name for p in tracker.phases]
    assert names == ["starting", "initializing", "loading weights", "warm-up"]  # one phase, however many bars
    assert tracker.phases[2].progress == 1.0
