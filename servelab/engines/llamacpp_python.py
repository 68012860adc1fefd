"""llama-cpp-python's OpenAI server (`python -m llama_cpp.server`). Source: shared/research/engines.md §4 (0.3.36).

The model loads in `create_app()` before uvicorn starts, so the port is closed while loading; there is no
/health, so readiness is `GET /v1/models` = 200. llama.cpp's own loader lines reach stderr through the Python log
callback (verbose=True by default). Flags are the pydantic field names with underscores (`--n_threads`).
Two defaults make benchmarks wrong: `interrupt_requests=True` ends a running stream as soon as another request
waits, and `n_gpu_layers=0` runs on the CPU. A global lock serves one request at a time whatever the settings.
"""

from __future__ import annotations

import os
import re
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from servelab.engines.base import EngineAdapter, EngineSpec, Launch, PhasePattern
from servelab.engines.common import (
    PROBE_ACCESS_LINE,
    UVICORN_RUNNING,
    UVICORN_STARTUP,
    base_url,
    flag_value,
    host_gpu_count,
    is_true,
    python_for,
    require_python_module,
)
from servelab.engines.lint import finding, merge
from servelab.engines.llama_common import DEFAULT_CTX, DEFAULT_THREADS, offload_finding
from servelab.models import resolve_model
from servelab.records import LintFinding

INSTALL = "pip install 'llama-cpp-python[server]' (compiles llama.cpp: about 4 minutes on 2 cores)"

LLAMACPP_PYTHON_PHASES = [
    PhasePattern("loading model", re.compile(r"llama_model_load|llama_model_loader: loaded meta data|"
                                             r"load_tensors: loading model tensors")),
    PhasePattern("allocating context", re.compile(r"llama_context: constructing llama_context|llama_kv_cache")),
    PhasePattern("chat format", re.compile(r"Model metadata:|Guessed chat format|Using gguf chat template|"
                                           r"Using fallback chat format|Using chat (?:eos|bos)")),
    PhasePattern("starting HTTP server", re.compile(UVICORN_STARTUP)),
]


class LlamaCppPython(EngineAdapter):
    name = "llama-cpp-python"
    tokenize_api = "llama-cpp-python"  # bare text only: prompts are counted by usage
    title = "llama-cpp-python server"
    install_hint = INSTALL
    phases = LLAMACPP_PYTHON_PHASES
    weight_phases = frozenset({"loading model"})
    ready_line = re.compile(UVICORN_RUNNING)
    heartbeat_lines = re.compile(PROBE_ACCESS_LINE)
    failure_lines = re.compile(r"Failed to load model|ValueError: |error loading model")
    cmdline_markers = ("llama_cpp.server",)
    probe_path = "/v1/models"  # no /health: 404. Port closed while loading, 200 once serving
    stream_extras: dict[str, Any] = {}  # it sends no usage in stream mode at all
    accepts_ignore_eos = False  # accepted and silently ignored: output length would not be fixed
    # llama_cpp/server/types.py `min_tokens` on both request types; app.py turns it into a
    # MinTokensLogitsProcessor that masks the model's EOS token until that many tokens are out
    accepts_min_tokens = True
    fingerprint_path = "/v1/models"
    metric_names: dict[str, str] = {}  # no /metrics
    config_paths: list[str] = []  # nothing beyond model ids: the command line is the only config source

    def require(self, spec: EngineSpec) -> None:
        require_python_module(spec, "llama_cpp", self.title, INSTALL)

    def build(self, spec: EngineSpec, port: int) -> Launch:
        model = resolve_model(spec.model)
        command = [python_for(spec), "-m", "llama_cpp.server", "--model", str(model.path), "--host", spec.host,
                   "--port", str(port), "--n_threads", str(spec.threads or DEFAULT_THREADS),
                   "--n_ctx", str(spec.ctx_size or DEFAULT_CTX), "--model_alias", model.served_name,
                   *spec.extra_args]
        return Launch(command=command, env=dict(spec.env), url=base_url(spec, port), model_path=str(model.path),
                      served_model=model.served_name,
                      extra={"model_size_bytes": model.size_bytes, "model_format": model.format})

    def probe_state(self, status: int | None, body: str) -> str:
        if status == 404:
            return "unknown"  # something else answers on this port
        return super().probe_state(status, body)

    def fingerprint(self, body: Any) -> bool:
        data = body.get("data") if isinstance(body, dict) else None
        return bool(data) and isinstance(data[0], dict) and data[0].get("owned_by") == "me" and \
            "permissions" in data[0]

    def lint(self, spec: EngineSpec, command: list[str], runtime_config: dict[str, Any] | None = None
             ) -> list[LintFinding]:
        found: list[LintFinding] = []
        interrupt = flag_value(command, "--interrupt_requests")
        if interrupt is None or is_true(interrupt):
            found.append(finding("interrupt_requests=True", "serious",
                                 "a new request ends the running stream early with [DONE] (the default): "
                                 "concurrent streams are truncated; pass --interrupt_requests False"))
        layers = flag_value(command, "--n_gpu_layers")
        if layers is None or layers.strip() == "0":
            gpus = host_gpu_count()
            found.append(finding("n_gpu_layers=0", "serious" if gpus else "info",
                                 "the model runs on the CPU (the default)" +
                                 (f" although this host has {gpus} GPU(s)" if gpus else "")))
        found.append(finding("one request at a time", "warn",
                             "a global lock serves requests one by one: concurrency only queues"))
        threads = flag_value(command, "--n_threads")
        cores = os.cpu_count() or 1
        if threads is not None and threads.isdigit() and int(threads) > cores:
            found.append(finding(f"n_threads={threads}", "warn",
                                 f"more compute threads than the {cores} logical CPUs"))
        return merge(found)

    def lint_log_line(self, line: str) -> LintFinding | None:
        return offload_finding(line)

    def version(self) -> str | None:
        try:
            return f"llama-cpp-python {version('llama_cpp_python')}"
        except PackageNotFoundError:
            return None
