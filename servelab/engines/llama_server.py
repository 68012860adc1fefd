"""llama.cpp's native `llama-server` binary (a build of ggml-org/llama.cpp, e.g. from the llama-cpp-python sdist:
shared/research/env.md §2). Same server code as the embedded engine; only the launch differs."""

from __future__ import annotations

import subprocess

from servelab.engines.base import EngineSpec, Launch
from servelab.engines.common import base_url, require_binary
from servelab.engines.llama_common import DEFAULT_CTX, DEFAULT_PARALLEL, DEFAULT_THREADS, LlamaCppFamily
from servelab.models import resolve_model

INSTALL = ("build it from llama.cpp (cmake -B build && cmake --build build --target llama-server) and put "
           "build/bin on PATH, or use the embedded engine `llamacpp` (pip install xllamacpp)")


class LlamaServer(LlamaCppFamily):
    name = "llama-server"
    title = "llama.cpp llama-server"
    install_hint = INSTALL
    cmdline_markers = ("llama-server",)
    # /props cannot tell this binary from the embedded build (same server code): `detect` names `llamacpp`.
    fingerprint_path = None

    def require(self, spec: EngineSpec) -> None:
        require_binary(spec, "llama-server", self.title, INSTALL)

    def build(self, spec: EngineSpec, port: int) -> Launch:
        model = resolve_model(spec.model)
        command = [
            spec.executable or "llama-server",
            "-m", str(model.path),
            "--host", spec.host,
            "--port", str(port),
            "-np", str(spec.parallel or DEFAULT_PARALLEL),
            "-t", str(spec.threads or DEFAULT_THREADS),
            "-c", str(spec.ctx_size or DEFAULT_CTX),
            "-a", model.served_name,
            "--metrics",  # off by default in llama-server; the bench reads llamacpp:* counters
            *spec.extra_args,
        ]
        return Launch(command=command, env=dict(spec.env), url=base_url(spec, port), model_path=str(model.path),
                      served_model=model.served_name,
                      extra={"model_size_bytes": model.size_bytes, "model_format": model.format})

    def version(self) -> str | None:
        try:
            done = subprocess.run(["llama-server", "--version"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        text = (done.stdout + done.stderr).strip().splitlines()
        return f"llama-server {text[-1]}" if text else None
