"""Emptying the server's prefix cache before each trial (bench/cache_reset.py): for real against the embedded
llama.cpp engine (a second identical request after the erase finds fewer cached prompt tokens than before it), against
the replay engine's SGLang and vLLM endpoints in their real formats, and through an experiment whose trials each
record it."""

from __future__ import annotations

import io
import shutil
import json
import os
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rich.console import Console

from conftest import embedded_argv, free_port, running_engine
from servelab.bench.cache_reset import reset_prefix_cache
from servelab.engines import REGISTRY
from servelab.engines.replay_http import ReplayHTTP, ReplayState
from servelab.experiment.load import parse_experiment
from servelab.experiment.runner import ExperimentOptions, run_experiment


def chat(url: str, model: str, system: str, user: str) -> tuple[int, int, int]:
    """(usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens, timings.cache_n) of one short request."""
    body = {"model": model, "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        doc = json.loads(resp.read())
    usage = doc["usage"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], doc["timings"]["cache_n"]


# ---- what each engine declares ----

def test_each_engine_declares_the_reset_its_source_has() -> None:
    kinds = {name: adapter.cache_reset for name, adapter in REGISTRY.items()}
    assert kinds["sglang"] == kinds["replay-sglang"] == "sglang-flush"
    assert kinds["vllm"] == kinds["replay-vllm"] == "vllm-reset"
    assert kinds["llamacpp"] == kinds["llama-server"] == "llamacpp-slots"
    for none_known in ("tgi", "transformers-serve", "llama-cpp-python", "command"):
        assert kinds[none_known] is None


def test_an_engine_without_an_endpoint_says_so_without_calling_it() -> None:
    line = reset_prefix_cache("http://127.0.0.1:9", "tgi").line  # port 9: nothing listens, nothing is asked
    assert line == "not reset: no endpoint known to reset text-generation-inference's prefix cache"


def test_an_unreachable_server_is_one_line_never_an_exception() -> None:
    result = reset_prefix_cache(f"http://127.0.0.1:{free_port()}", "sglang")
    assert not result.done and result.line.startswith("not reset: cannot reach http://127.0.0.1:")
    assert "refused" in result.line.lower()


# ---- the real llama.cpp server (xllamacpp) ----

@pytest.mark.engine
def test_a_slot_erase_empties_what_an_identical_request_finds_cached(embedded_server) -> None:
    url, model = embedded_server["url"], embedded_server["model"]
    system = "You review reports on cache resets between trials, line by line. " * 6  # unlike any other test's
    prompt, _, _ = chat(url, model, system, "Say hi.")
    _, cached_before, cache_n_before = chat(url, model, system, "Say hi.")
    assert cached_before == cache_n_before >= prompt - 2  # the whole prompt but the token it must evaluate again
    result = reset_prefix_cache(url, "llamacpp")
    assert result.done, result.line
    assert result.line.startswith("reset: llama.cpp erased 8 slots (") and "--cache-ram" in result.line
    _, cached_after, cache_n_after = chat(url, model, system, "Say hi.")
    assert cached_after == cache_n_after < cached_before // 4, (cached_before, cached_after)


@contextmanager
def llama_server(*flags: str) -> Iterator[str]:
    """Our launcher of the embedded engine with one slot (so a second prompt moves the first off its slot)."""
    argv = embedded_argv("--ctx-size", "2048", *flags, parallel=1)
    argv[argv.index("--alias") + 1] = "smol"
    with running_engine(argv, None) as url:
        yield url


@pytest.mark.engine
@pytest.mark.parametrize("cache_ram, survives", [(None, True), ("0", False)])
def test_the_host_memory_prompt_cache_outlives_a_slot_erase(cache_ram: str | None, survives: bool) -> None:
    """What the reset line warns of, measured: a prompt that moved off its slot is kept in llama.cpp's host-memory
    prompt cache (--cache-ram, on by default), which no endpoint clears; with --cache-ram 0 the erase is all."""
    first, other = "You answer questions about lighthouses. " * 12, "You answer questions about rivers. " * 12
    with llama_server(*(["--cache-ram", cache_ram] if cache_ram is not None else [])) as url:
        prompt, _, _ = chat(url, "smol", first, "Hello?")
        chat(url, "smol", other, "Hello?")  # the one slot moves on: the first prompt is saved to host memory
        assert reset_prefix_cache(url, "llamacpp").done
        _, cached, _ = chat(url, "smol", first, "Hello?")
    assert (cached >= prompt - 2) if survives else (cached < prompt // 4), (prompt, cached)


@pytest.mark.engine
def test_without_a_slot_save_path_the_line_says_how_to_allow_the_erase() -> None:
    with llama_server("--slot-save-path", "") as url:
        result = reset_prefix_cache(url, "llamacpp")
    assert not result.done
    assert result.line == ("not reset: llama.cpp answered 501 to a slot erase: slot actions need the server "
                           "started with --slot-save-path DIR")


# ---- SGLang and vLLM, as the replay engine answers for them ----

@contextmanager
def replay(engine: str, **state: object) -> Iterator[tuple[str, ReplayState]]:
    st = ReplayState(engine=engine, version="0.33.0" if engine == "vllm" else "0.5.10.post1", model="org/m",
                     server_args={"disable_cuda_graph": False}, health=200, **state)
    http = ReplayHTTP("127.0.0.1", 0, st)
    http.listen()
    try:
        yield f"http://127.0.0.1:{http.port}", st
    finally:
        http.close()


def test_sglang_flushes_its_radix_cache() -> None:
    with replay("sglang") as (url, st):
        result = reset_prefix_cache(url, "sglang")
        detected = reset_prefix_cache(url)  # a URL alone: the engine recognised by its /server_info
    assert result.done and result.line == "reset: SGLang radix cache flushed (POST /flush_cache)"
    assert detected == result
    assert st.controls == ["POST /flush_cache", "POST /flush_cache"]


def test_vllm_resets_only_in_dev_mode_and_says_so_when_it_is_off() -> None:
    with replay("vllm", dev_mode=False) as (url, st):
        off = reset_prefix_cache(url, "vllm")
        assert st.controls == []
    assert not off.done
    assert off.line == ("not reset: vLLM answered 404 to POST /reset_prefix_cache: it serves it only when started "
                        "with VLLM_SERVER_DEV_MODE=1")
    with replay("vllm", dev_mode=True) as (url, st):
        on = reset_prefix_cache(url)  # recognised as vLLM by /version
    assert on.done and on.line == "reset: vLLM prefix cache reset (POST /reset_prefix_cache)"
    assert st.controls == ["POST /reset_prefix_cache"]


def test_the_replay_reads_vllms_dev_mode_from_its_environment(monkeypatch) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    assert ReplayState(engine="vllm", version="x", model="m", server_args={}).dev_mode
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "0")
    assert not ReplayState(engine="vllm", version="x", model="m", server_args={}).dev_mode


def test_the_replay_profiles_as_sglang_and_vllm_do(tmp_path: Path) -> None:
    def call(url: str, path: str, body: bytes | None = b"") -> tuple[int, bytes]:
        req = urllib.request.Request(url + path, data=body, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    with replay("sglang") as (url, st):
        assert call(url, "/stop_profile") == (500, b"Internal Server Error")  # not in progress
        assert call(url, "/start_profile", json.dumps({"output_dir": str(tmp_path / "sg")}).encode()) == \
            (200, b"Start profiling.\n")
        assert call(url, "/start_profile") == (500, b"Internal Server Error")  # already in progress
        assert call(url, "/stop_profile") == (200, b"Stop profiling. This will take some time.\n")
    assert [p.name.endswith("-TP-0.trace.json.gz") for p in (tmp_path / "sg").iterdir()] == [True]
    with replay("vllm", profiler_dir=None) as (url, _):
        assert call(url, "/start_profile", b"{}")[0] == 404  # mounted only with VLLM_TORCH_PROFILER_DIR
    with replay("vllm", profiler_dir=str(tmp_path / "vl")) as (url, st):
        assert call(url, "/start_profile") == (200, b"") and call(url, "/stop_profile") == (200, b"")
    assert st.controls == ["POST /start_profile", "POST /stop_profile"]
    assert len(list((tmp_path / "vl").iterdir())) == 1


def test_the_api_key_and_no_proxy_go_with_every_call(monkeypatch) -> None:
    """The reset carries the key as the bench does, and an http_proxy in the environment does not take it away."""
    seen: list[tuple[str, str | None]] = []

    class SGLangFlush(BaseHTTPRequestHandler):  # SGLang's answers to /server_info and /flush_cache, key required
        def answer(self) -> None:
            seen.append((self.path, self.headers.get("Authorization")))
            if self.headers.get("Authorization") != "Bearer k3y":
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = b"Cache flushed.\n"
            if self.path.startswith("/server_info"):
                body = json.dumps({"disable_radix_cache": False, "internal_states": [{}], "version": "0.5.10"}
                                  ).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), SGLangFlush)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # a proxy that is not there
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert reset_prefix_cache(url, "sglang", api_key="k3y").done
        assert reset_prefix_cache(url, api_key="k3y").done  # recognised with the key too
        assert not reset_prefix_cache(url, "sglang").done  # 401 without it
    finally:
        server.shutdown()
        server.server_close()
    assert ("/flush_cache", "Bearer k3y") in seen and ("/flush_cache", None) in seen


@pytest.mark.parametrize("busy_answers, done", [(2, True), (5, False)])
def test_a_busy_sglang_is_asked_again_before_the_trial_says_not_reset(monkeypatch, busy_answers: int,
                                                                       done: bool) -> None:
    """SGLang answers 400 (same text) while requests run or wait: a level's cancelled streams can still be leaving."""
    import servelab.bench.cache_reset as cache_reset

    monkeypatch.setattr(cache_reset, "BUSY_WAIT_S", 0.05)
    text = (b"Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
            b"requests, the operation will not be performed.)\n")
    calls: list[str] = []

    class BusySGLang(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            calls.append(self.path)
            self.send_response(400 if len(calls) <= busy_answers else 200)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), BusySGLang)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = reset_prefix_cache(f"http://127.0.0.1:{server.server_address[1]}", "sglang")
    finally:
        server.shutdown()
        server.server_close()
    assert result.done is done and len(calls) == min(busy_answers + 1, cache_reset.BUSY_TRIES)
    if not done:
        assert result.line == ("not reset: SGLang refused POST /flush_cache (400) 3 times, 0.05 s apart: it flushes "
                               "only when no request is running or waiting")


# ---- an experiment's trials ----

def _two_trials(url: str, *extra: str) -> str:
    return ("name: resets\ntrials: 2\nbench: {single_requests: 2, max_tokens: 4, warmup: 0, sweep: false}\n"
            "verify: {enabled: false}\ncontention: {reruns: 0}\n" + "".join(extra)
            + f"cells:\n  - {{name: here, url: {url}}}\n")


@pytest.mark.engine
def test_each_trial_of_an_experiment_records_and_prints_its_reset(tmp_path: Path, embedded_server) -> None:
    printed = io.StringIO()
    result = run_experiment(parse_experiment(_two_trials(embedded_server["url"]), "exp.yaml"),
                            ExperimentOptions(out_root=tmp_path / "on"), Console(file=printed, width=200))
    assert result.status == "complete"
    trials = result.runs[0].trials
    assert [t.index for t in trials] == [0, 1]
    for trial in trials:
        assert trial.cache_reset.startswith("reset: llama.cpp erased 8 slots ("), trial.cache_reset
    lines = [line for line in printed.getvalue().splitlines() if line.startswith("  cache  ")]
    assert lines == [f"  cache  {t.cache_reset}" for t in trials]
    saved = json.loads((Path(result.cells[0].run_dir) / "summary.json").read_text())
    assert [t["cache_reset"] for t in saved["trials"]] == [t.cache_reset for t in trials]

    off = run_experiment(parse_experiment(_two_trials(embedded_server["url"], "cache_reset: false\n"), "exp.yaml"),
                         ExperimentOptions(out_root=tmp_path / "off"), Console(file=io.StringIO(), width=200))
    assert [t.cache_reset for t in off.runs[0].trials] == ["not reset: turned off (cache_reset: false)"] * 2


# ---- the engine's profiler around one level (bench --profile-level) ----

def _sweep(profile_level: str):
    from servelab.bench.options import BenchArgs, build_options

    opts = build_options(BenchArgs(mode="sweep", max_tokens=2, warmup=0, duration=0.2, min_requests=3,
                                   max_concurrency=2, profile_level=profile_level))
    opts.sweep_levels = [1, 2]
    return opts


def test_sglang_profiles_exactly_the_level_named_and_keeps_its_trace_directory() -> None:
    from servelab.bench.runner import bench

    records: list = []
    with replay("sglang") as (url, st):
        seen: list[tuple[str, int]] = []
        real = st.control

        def spy(method: str, path: str, raw: bytes):  # when each profiler call came, in generation requests so far
            if path.endswith("_profile"):
                seen.append((path, len(st.requests)))
            return real(method, path, raw)

        st.control = spy  # type: ignore[method-assign]
        result = bench(url, _sweep("c2"), on_record=records.append)
        total = len(st.requests)
    c1, c2 = result.levels
    assert "profile" not in c1.load
    profile = c2.load["profile"]
    assert profile["started"] and profile["trace_dir"].startswith(tempfile.gettempdir())
    assert len(profile["said"]) == 2 and profile["said"][0].startswith("profiling c2: POST /start_profile")
    in_c2 = sum(1 for r in records if r.tag == "c2")
    # started after every request before c2 was sent, stopped after c2's last: around that level only
    assert seen == [("/start_profile", total - in_c2), ("/stop_profile", total)]
    traces = list(Path(profile["trace_dir"]).iterdir())
    assert [t.name.endswith("-TP-0.trace.json.gz") for t in traces] == [True]
    shutil.rmtree(profile["trace_dir"])


def test_vllm_without_its_profiler_directory_says_why_and_the_bench_goes_on() -> None:
    from servelab.bench.runner import bench

    with replay("vllm", profiler_dir=None) as (url, st):
        result = bench(url, _sweep("c1"))
    assert [lv.ok > 0 for lv in result.levels] == [True, True]
    assert result.levels[0].load["profile"] == {
        "trace_dir": None, "started": False,
        "said": ["not profiled: vLLM answered 404 to POST /start_profile: it serves it only when started with "
                 "VLLM_TORCH_PROFILER_DIR"]}
    assert st.controls == []


def test_vllms_trace_directory_is_read_from_the_engines_environment(tmp_path: Path) -> None:
    from servelab.bench.profiler import start_profile, stop_profile

    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                              env={**os.environ, "VLLM_TORCH_PROFILER_DIR": str(tmp_path / "traces")})
    try:
        with replay("vllm", profiler_dir=str(tmp_path / "traces")) as (url, st):
            profile = stop_profile(start_profile(url, "vllm", "c4", engine_pids=[engine.pid]))
            unknown = stop_profile(start_profile(url, "vllm", "c4"))  # a server servelab did not launch
    finally:
        engine.kill()
        engine.wait()
    assert profile.record() == {"trace_dir": str(tmp_path / "traces"), "started": True, "said": [
        f"profiling c4: POST /start_profile, traces in {tmp_path / 'traces'}",
        f"POST /stop_profile: the engine writes the traces now to {tmp_path / 'traces'}"]}
    assert unknown.trace_dir is None and "the engine's VLLM_TORCH_PROFILER_DIR" in unknown.lines[0]
    assert st.controls == ["POST /start_profile", "POST /stop_profile"] * 2


@pytest.mark.engine
def test_an_engine_without_a_profiler_endpoint_is_benched_and_says_so(embedded_server) -> None:
    from servelab.bench.options import BenchArgs, build_options
    from servelab.bench.runner import bench

    result = bench(embedded_server["url"], build_options(BenchArgs(mode="single", requests=2, max_tokens=2,
                                                                   warmup=0, profile_level="single")))
    (level,) = result.levels
    assert level.ok == 2
    assert level.load["profile"] == {"trace_dir": None, "started": False,
                                     "said": ["not profiled: no profiler endpoint known for llama.cpp server "
                                              "(xllamacpp)"]}
