"""verify against real engines that take minutes to install: llama-cpp-python (compiled) and `transformers serve`
(torch). Each must be reported with its real deviations (shared/research/env.md §1, §3). Set up with
`scripts/setup-slow-verify.sh` (separate venvs; .venv stays torch-free), run with `pytest -m slow`."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import free_port

from servelab.models import resolve_model
from servelab.records import CheckResult
from servelab.verify import verify

ROOT = Path(__file__).resolve().parent.parent
LCPP_PYTHON = ROOT / ".venv-lcpp" / "bin" / "python"
TF_SERVE = ROOT / ".venv-tf" / "bin" / "transformers"
TF_MODEL = ROOT / ".venv-tf" / "models" / "smollm2-hf"
# These engines are slow on two busy cores (transformers serve: ~40 tok/s alone), and the suite may share them.
TIMEOUT_S = 240.0

# Minutes on a busy machine (transformers serve generates one request at a time): past pytest's default 300 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def start(command: list[str], log: Path, env: dict[str, str] | None = None,
          ready_path: str = "/v1/models", timeout_s: float = 180.0) -> tuple[subprocess.Popen, str]:
    """Start a server in its own process group; wait until `ready_path` answers 200."""
    port = free_port()
    command = [part.replace("{port}", str(port)) for part in command]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                env=os.environ | (env or {}))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{command[0]} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + ready_path, timeout=2) as reply:
                if reply.status == 200:
                    return proc, url
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"{command[0]} not ready within {timeout_s:g}s: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def by_id(url: str, only: list[str], **kwargs) -> dict[str, CheckResult]:
    result = verify(url, only=only, check_timeout_s=TIMEOUT_S, **kwargs)
    return {c.id: c for c in result.checks if c.reason != "not selected"}


# ---- llama-cpp-python ----------------------------------------------------------------------------------------------


@contextmanager
def lcpp_server(tmp_path: Path, *extra: str) -> Iterator[str]:
    if not (ROOT / ".venv-lcpp" / ".servelab-installed").exists():
        pytest.skip("llama-cpp-python is not set up: scripts/setup-slow-verify.sh lcpp")
    gguf = resolve_model("smollm2").path
    proc, url = start([str(LCPP_PYTHON), "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
                       "--port", "{port}", "--n_threads", "1", "--model_alias", "smollm2", *extra],
                      tmp_path / "llama-cpp-python.log")
    try:
        yield url
    finally:
        stop(proc)


LCPP_CHECKS = ["chat_stream", "stream_framing", "max_tokens", "stop", "usage_count", "determinism", "concurrency",
               "error_context", "openai_sdk"]


def test_llama_cpp_python_with_its_default_interrupt_requests_fails_the_concurrency_check(tmp_path):
    with lcpp_server(tmp_path) as url:
        checks = by_id(url, LCPP_CHECKS)
    concurrency = checks["concurrency"]
    assert concurrency.outcome == "fail"
    assert "ended without a finish_reason" in concurrency.reason
    # It streams no usage even when asked: the story's check warns, the framing check fails.
    assert checks["chat_stream"].outcome == "warn"
    assert "no usage despite stream_options.include_usage" in checks["chat_stream"].reason
    assert checks["stream_framing"].outcome == "fail"
    assert "no usage despite stream_options.include_usage" in checks["stream_framing"].reason
    # One request at a time it is correct.
    for check_id in ("max_tokens", "stop", "determinism", "openai_sdk"):
        assert checks[check_id].outcome == "pass", (check_id, checks[check_id].reason)
    assert checks["usage_count"].outcome == "pass"
    assert "llama-cpp-python /extras/tokenize counts" in checks["usage_count"].reason
    # No /props and no n_ctx in /v1/models: the fallback prompt, refused with a 400 from its default n_ctx 2048.
    assert checks["error_context"].reason.startswith("a 9000-word prompt (context length not published): HTTP 400")


def test_llama_cpp_python_without_interrupt_requests_queues_and_passes_the_concurrency_check(tmp_path):
    with lcpp_server(tmp_path, "--interrupt_requests", "False") as url:
        concurrency = by_id(url, ["concurrency"])["concurrency"]
    assert concurrency.outcome == "pass", concurrency.reason
    assert concurrency.reason.startswith("4 of 4 streams reached a finish_reason")
    assert "the server ran the streams one after another" in concurrency.reason


# ---- transformers serve --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tf_server(tmp_path_factory) -> Iterator[str]:
    if not (TF_SERVE.exists() and (TF_MODEL / "config.json").exists()):
        pytest.skip("transformers serve is not set up: scripts/setup-slow-verify.sh tf")
    proc, url = start([str(TF_SERVE), "serve", str(TF_MODEL), "--host", "127.0.0.1", "--port", "{port}",
                       "--device", "cpu"], tmp_path_factory.mktemp("tf") / "transformers.log",
                      env={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2"}, ready_path="/health")
    try:
        yield url
    finally:
        stop(proc)


TF_CHECKS = ["chat_stream", "stream_framing", "stop", "concurrency", "error_unknown_model", "error_invalid_params",
             "openai_sdk"]


def test_transformers_serve_is_reported_with_its_missing_done_and_usage_placement(tf_server):
    checks = by_id(tf_server, TF_CHECKS)
    stream = checks["chat_stream"]
    assert stream.outcome == "fail"
    assert "the stream ended without `data: [DONE]`" in stream.reason
    assert "usage inside the chunk with finish_reason" in stream.reason
    assert stream.response_excerpt is not None and "[DONE]" not in stream.response_excerpt
    framing = checks["stream_framing"]
    assert framing.outcome == "fail"
    assert "the stream ended without `data: [DONE]`" in framing.reason
    assert "usage inside the chunk with finish_reason, not in a final chunk of its own" in framing.reason
    # Serialised, but every stream completes; the missing [DONE] is the server's way, so only a warning there.
    assert checks["concurrency"].outcome == "warn"
    assert checks["concurrency"].reason.startswith("4 of 4 streams reached a finish_reason")
    assert checks["openai_sdk"].outcome == "pass"  # the SDK reads to the connection's end
    # It ignores `stop` (plain and streamed), and its errors are a FastAPI body for the pinned model and 500s for
    # invalid parameters.
    assert checks["stop"].outcome == "fail"
    assert 'plain: the stop sequence "time" was emitted' in checks["stop"].reason
    assert checks["error_unknown_model"].outcome == "warn"
    assert "HTTP 400 but no OpenAI-style `error` object" in checks["error_unknown_model"].reason
    assert checks["error_invalid_params"].outcome == "fail"
    assert "HTTP 500, a server error where a 4xx belongs" in checks["error_invalid_params"].reason
