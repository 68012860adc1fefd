"""Issue 21: the live line's "client CPU" is the client's. Under `servelab run` the engine is a child of servelab,
so adding every child made the default run say "client CPU 201% of a core" on two cores: llama.cpp's threads.
The client is this process and its descendants less the engine's trees; the engine's CPU is shown on its own.

Sizes, not timings: a child that spins takes most of a core for the second it is watched, this process sleeps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

from servelab.report.progress import LevelProgress

SPIN = "while True: pass"
# A parent that sleeps and a child of it that spins: the engine's tree (a launcher and its server).
TREE = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'while True: pass']); "
        "time.sleep(120)")


@contextmanager
def spinning(code: str):
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        time.sleep(0.5)  # started (and, for the tree, its child too)
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def watch(progress: LevelProgress, seconds: float = 1.5) -> None:
    progress._sample_cpu()
    time.sleep(seconds)
    progress._sample_cpu()


def test_a_child_registered_as_the_engine_is_the_engines_cpu_not_the_clients() -> None:
    with spinning(SPIN) as engine:
        progress = LevelProgress(engine_pids=[engine.pid])
        watch(progress)
    assert progress.engine_cpu is not None and progress.engine_cpu > 0.3, progress.engine_cpu
    assert progress.cpu is not None and progress.cpu < 0.5 and progress.cpu < progress.engine_cpu / 2, \
        (progress.cpu, progress.engine_cpu)
    line = progress.line()
    assert "client CPU" in line and "engine CPU" in line, line


def test_the_engines_whole_tree_is_the_engines_and_may_be_named_once_the_bench_finds_it() -> None:
    with spinning(TREE) as launcher:
        progress = LevelProgress()
        progress.watch_engine([launcher.pid, os.getpid()])  # the bench's sampler found it; this process never is
        watch(progress)
    assert progress.engine_cpu is not None and progress.engine_cpu > 0.3, progress.engine_cpu
    assert progress.cpu is not None and progress.cpu < 0.5, (progress.cpu, progress.engine_cpu)


def test_a_child_that_is_not_the_engine_is_the_clients_a_worker() -> None:
    with spinning(SPIN):
        progress = LevelProgress()
        watch(progress)
    assert progress.cpu is not None and progress.cpu > 0.3, progress.cpu
    assert progress.engine_cpu is None
    assert "engine CPU" not in progress.line()


def test_bench_names_the_engine_it_found_listening_on_the_urls_port() -> None:
    """`servelab bench URL` did not launch the server: the environment sampler finds its process from the port,
    and the bench passes it on (cli.py: to the live progress's watch_engine)."""
    from pathlib import Path

    from servelab.bench.runner import BenchOptions, bench

    server = subprocess.Popen([sys.executable, str(Path(__file__).parent / "slot_server.py"), "--tokens", "3"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        port = int(server.stdout.readline().split()[1])
        found: list[int] = []
        bench(f"http://127.0.0.1:{port}", BenchOptions(mode="single", single_requests=1, warmup=0, tokenizer="none"),
              on_engine=found.extend)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    assert found == [server.pid]
