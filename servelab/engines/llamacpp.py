"""llama.cpp's native server, run from the `xllamacpp` wheel through our launcher (the embedded default).

The server itself is llama.cpp's (engines/llama_common.py has its log lines, probe, lint and metrics); this module
only says how to launch it. The xllamacpp build logs, e.g.
    0.00.006.361 I srv    load_model: loading model '/path/SmolLM2-135M-Instruct.Q4_1.gguf'
    0.00.995.280 I srv    load_model: initializing, n_slots = 8, n_ctx_slot = 1024, kv_unified = 'false'
    0.00.999.125 I srv          init: model loaded
    0.00.999.131 I srv          init: listening on http://127.0.0.1:18003
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

from servelab.engines.base import EngineSpec, Launch
from servelab.engines.common import base_url, require_python_module
from servelab.engines.llama_common import DEFAULT_CTX, DEFAULT_PARALLEL, DEFAULT_THREADS, LlamaCppFamily
from servelab.engines.stack_signature import StackSignature
from servelab.models import resolve_model


class LlamaCppEmbedded(LlamaCppFamily):
    name = "llamacpp"
    title = "llama.cpp server (xllamacpp)"
    install_hint = "pip install xllamacpp"
    cmdline_markers = ("servelab.engines.llamacpp_server",)
    # ---- stack signatures (lifecycle/stacks/), read from servelab's launcher (engines/llamacpp_server.py) with
    # xllamacpp 2026.10: its Python main thread loads the model inside xlc.Server(...) (native frames
    # xllamacpp::Server::Server, waiting on the load's future), then waits on an Event while llama.cpp's native
    # threads serve. py-spy lists only Python threads, so idle and busy look alike in the stacks: the process's
    # CPU time during the capture tells them apart (native_work).
    stack_signatures = (
        StackSignature("loading the model", "loading", native=True, functions=(r"xllamacpp::Server::Server",),
                       detail="llama.cpp, xllamacpp Server start-up"),
        StackSignature("serving from native threads", "idle", modules=(r"(^|/)threading\.py$",),
                       functions=("Event.wait",), within=(r"servelab/engines/llamacpp_server\.py$",),
                       native_work=True),
    )

    def require(self, spec: EngineSpec) -> None:
        require_python_module(spec, "xllamacpp", self.title, self.install_hint)

    def build(self, spec: EngineSpec, port: int) -> Launch:
        model = resolve_model(spec.model)
        command = [
            spec.executable or sys.executable, "-m", "servelab.engines.llamacpp_server",
            "--model", str(model.path),
            "--host", spec.host,
            "--port", str(port),
            "--parallel", str(spec.parallel or DEFAULT_PARALLEL),
            "--threads", str(spec.threads or DEFAULT_THREADS),
            "--ctx-size", str(spec.ctx_size or DEFAULT_CTX),
            "--alias", model.served_name,
            *spec.extra_args,
        ]
        return Launch(command=command, env=dict(spec.env), url=base_url(spec, port), model_path=str(model.path),
                      served_model=model.served_name,
                      extra={"model_size_bytes": model.size_bytes, "model_format": model.format})

    def version(self) -> str | None:
        try:
            return f"xllamacpp {version('xllamacpp')}"
        except PackageNotFoundError:
            return None
