"""The replay engine's HTTP side: the readiness and config endpoints answered the way the real engine answers them
during start-up (shared/research/engines.md §1.2, §2.3).

SGLang: the port is closed until the schedulers are ready; /health and /health_generate answer 503 until the
warm-up request has returned, then 200; /server_info (and the deprecated /get_server_info) return the ServerArgs
fields, `internal_states` with `memory_usage.graph` (0 when no CUDA graph was captured) and the version.
vLLM: the socket is bound early but not listening (connects are refused); once up, /health is 200 and /version
answers {"version": ...}. Both list the model at /v1/models. Nothing here generates text.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class ReplayState:
    engine: str  # "sglang" or "vllm"
    version: str
    model: str
    server_args: dict[str, Any]
    health: int = 503  # what /health answers once the port listens
    graphs_captured: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def routes(self, path: str) -> tuple[int, Any]:
        path = path.split("?", 1)[0]
        models = {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": self.engine,
                                              "root": self.model}]}
        if self.engine == "sglang":
            if path in ("/health", "/health_generate"):
                return self.health, {} if self.health == 200 else {"error": "server is starting"}
            if path in ("/server_info", "/get_server_info"):
                return 200, self.sglang_server_info()
            if path in ("/model_info", "/get_model_info"):
                return 200, {"model_path": self.model, "tokenizer_path": self.model, "is_generation": True}
            if path == "/ping":
                return 200, {}
            if path == "/v1/models":
                return 200, models
        else:
            if path in ("/health", "/ping"):
                return self.health, {}
            if path == "/version":
                return 200, {"version": self.version}
            if path == "/v1/models":
                return 200, models
        return 404, {"detail": "Not Found"}

    def sglang_server_info(self) -> dict[str, Any]:
        graph_gb = 3.21 if self.graphs_captured else 0.0
        state = {**self.server_args, "last_gen_throughput": 0.0, "effective_max_running_requests_per_dp": 2048,
                 "memory_usage": {"weight": 68.41, "kvcache": 52.1, "token_capacity": 812345, "graph": graph_gb}}
        return {**self.server_args, "max_total_num_tokens": 812345, "max_req_input_len": 163834,
                "internal_states": [state], "version": self.version}


def _handler(state: ReplayState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            status, body = state.routes(self.path)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the replayed log is the engine's log; our probes would only add noise to it

    return Handler


class ReplayHTTP:
    """Bind, listen and serve in separate steps, as the real engines do them at different moments."""

    def __init__(self, host: str, port: int, state: ReplayState):
        self.server = ThreadingHTTPServer((host, port), _handler(state), bind_and_activate=False)
        self.server.daemon_threads = True
        self._bound = self._listening = False

    def bind(self) -> None:
        if not self._bound:
            self.server.server_bind()
            self._bound = True

    def listen(self) -> None:
        if self._listening:
            return
        self.bind()
        self.server.server_activate()
        self._listening = True
        threading.Thread(target=self.server.serve_forever, name="replay-http", daemon=True).start()
