"""llama.cpp's native server, run from the `xllamacpp` wheel through our launcher (the embedded default).

Log lines and probe semantics: shared/research/engines.md §3 (llama-server, commit 0c1e570) and the xllamacpp
build's own output, e.g.
    0.00.006.361 I srv    load_model: loading model '/path/SmolLM2-135M-Instruct.Q4_1.gguf'
    0.00.995.280 I srv    load_model: initializing, n_slots = 8, n_ctx_slot = 1024, kv_unified = 'false'
    0.00.999.125 I srv          init: model loaded
    0.00.999.131 I srv          init: listening on http://127.0.0.1:18003
The HTTP port opens *before* the model loads and answers 503 {"error":{"message":"Loading model"}} until ready.
"""

from __future__ import annotations

import os
import re
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from servelab.engines.base import EngineAdapter, EngineSpec, Launch, PhasePattern
from servelab.models import resolve_model
from servelab.records import LintFinding

DEFAULT_PARALLEL = 8
DEFAULT_THREADS = 2
DEFAULT_CTX = 8192


def _flag_value(command: list[str], *names: str) -> str | None:
    for i, arg in enumerate(command):
        for name in names:
            if arg == name and i + 1 < len(command):
                return command[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


class LlamaCppEmbedded(EngineAdapter):
    name = "llamacpp"
    title = "llama.cpp server (xllamacpp)"
    phases = [
        PhasePattern("initializing", re.compile(r"\binit(ializing)? ?\.\.\.|srv\s+\w+: initializing \.\.\.")),
        PhasePattern("loading model", re.compile(r"load_model: loading model '(?P<detail>[^']*)'")),
        PhasePattern("allocating slots", re.compile(r"load_model: initializing, n_slots = (?P<detail>\d+)")),
        PhasePattern("model loaded", re.compile(r"srv\s+\w+: model loaded")),
    ]
    ready_line = re.compile(r"(listening on|server is listening on) http://")
    probe_path = "/health"
    # `timings_per_token` makes every chunk carry `timings.predicted_n`, the server's running count of generated
    # tokens: exact per-event token counts without a client tokenizer.
    stream_extras = {"timings_per_token": True}
    accepts_ignore_eos = True
    fingerprint_path = "/props"
    metric_names = {
        "prompt_tokens": "llamacpp:prompt_tokens_total",
        "generated_tokens": "llamacpp:tokens_predicted_total",
        "running": "llamacpp:requests_processing",
        "waiting": "llamacpp:requests_deferred",
        "spec_drafted": "llamacpp:spec_decode_num_draft_tokens_total",
        "spec_accepted": "llamacpp:spec_decode_num_accepted_tokens_total",
        "spec_drafts": "llamacpp:spec_decode_num_drafts_total",
    }
    config_paths = ["/props", "/v1/models", "/slots"]

    def launch(self, spec: EngineSpec, port: int) -> Launch:
        model = resolve_model(spec.model)
        parallel = spec.parallel or DEFAULT_PARALLEL
        threads = spec.threads or DEFAULT_THREADS
        command = [
            sys.executable, "-m", "servelab.engines.llamacpp_server",
            "--model", str(model.path),
            "--host", spec.host,
            "--port", str(port),
            "--parallel", str(parallel),
            "--threads", str(threads),
            "--ctx-size", str(spec.ctx_size or DEFAULT_CTX),
            "--alias", model.served_name,
            *spec.extra_args,
        ]
        return Launch(command=command, env=dict(spec.env), url=f"http://{_url_host(spec.host)}:{port}",
                      model_path=str(model.path), served_model=model.served_name,
                      extra={"model_size_bytes": model.size_bytes, "model_format": model.format})

    def fingerprint(self, body: Any) -> bool:
        # llama-server's /props: {"default_generation_settings": ..., "total_slots": N, "build_info": ...}
        return isinstance(body, dict) and "default_generation_settings" in body and "total_slots" in body

    def probe_state(self, status: int | None, body: str) -> str:
        if status == 503 and "Loading model" in body:
            return "loading"
        return super().probe_state(status, body)

    def lint(self, spec: EngineSpec, command: list[str], runtime_config: dict[str, Any] | None = None
             ) -> list[LintFinding]:
        findings: list[LintFinding] = []
        slots = _flag_value(command, "--parallel", "-np")
        if runtime_config and isinstance(runtime_config.get("total_slots"), int):
            slots = str(runtime_config["total_slots"])  # what the server says beats what we asked for
        if slots is not None and slots.isdigit() and int(slots) == 1:
            findings.append(LintFinding(
                setting="parallel=1", severity="serious",
                why="one slot: concurrent requests queue behind each other, so throughput under load and "
                    "peak tok/s measure a serialized server"))
        if "--no-cont-batching" in command or "-nocb" in command:
            findings.append(LintFinding(
                setting="no-cont-batching", severity="serious",
                why="continuous batching is off: new requests wait for the running batch to finish"))
        threads = _flag_value(command, "--threads", "-t")
        cores = os.cpu_count() or 1
        if threads is not None and threads.isdigit() and int(threads) > cores:
            findings.append(LintFinding(
                setting=f"threads={threads}", severity="warn",
                why=f"more compute threads than the {cores} logical CPUs: they contend and decode slows down"))
        return findings

    def version(self) -> str | None:
        try:
            return f"xllamacpp {version('xllamacpp')}"
        except PackageNotFoundError:
            return None


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host
