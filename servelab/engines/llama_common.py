"""What llama.cpp's server is, however it is launched: the native `llama-server` binary and our `xllamacpp`
launcher run the same C++ server code (tools/server), so they share log lines, probe semantics, /props, lint
rules and metric names. Source: shared/research/engines.md §3 (llama.cpp commit 0c1e570).

    srv    load_model: loading model '/m/SmolLM2-135M-Instruct.Q4_1.gguf'
    srv    load_model: initializing, n_slots = 8, n_ctx_slot = 1024, kv_unified = 'false'
    srv  llama_server: model loaded            (xllamacpp: "srv          init: model loaded")
    srv  llama_server: listening on http://127.0.0.1:8080
Older builds (~b6153): `main: model loaded`, `main: server is listening on http://... - starting the main loop`.
The HTTP port opens *before* the model loads and answers 503 {"error":{"message":"Loading model"}} until ready.
"""

from __future__ import annotations

import os
import re
from typing import Any

from servelab.engines.base import EngineAdapter, EngineSpec, PhasePattern
from servelab.engines.common import flag_value, has_flag
from servelab.engines.reasoning_families import LLAMACPP_FORMAT, family_of
from servelab.records import LintFinding

DEFAULT_PARALLEL = 8
DEFAULT_THREADS = 2
DEFAULT_CTX = 8192

LLAMA_SERVER_PHASES = [
    PhasePattern("initializing", re.compile(r"\binit(ializing)? ?\.\.\.|srv\s+\w+: initializing \.\.\.")),
    PhasePattern("loading model", re.compile(r"load_model: loading model '(?P<detail>[^']*)'")),
    PhasePattern("allocating slots", re.compile(r"load_model: initializing, n_slots = (?P<detail>\d+)")),
    PhasePattern("model loaded", re.compile(r"(srv\s+\w+|main): model loaded")),
]
LLAMA_SERVER_READY = re.compile(r"(listening on|server is listening on) http://")
LLAMA_SERVER_FAILURE = re.compile(r"exiting due to model loading error|failed to load model|failed to download "
                                  r"model|couldn't bind HTTP server socket")
# Shown only at -lv 4: fewer layers on the GPU than the model has, e.g. because --fit found VRAM occupied.
_OFFLOADED = re.compile(r"load_tensors: offloaded (?P<n>\d+)/(?P<m>\d+) layers to GPU")

LLAMA_SERVER_METRICS = {
    "prompt_tokens": "llamacpp:prompt_tokens_total",
    "generated_tokens": "llamacpp:tokens_predicted_total",
    "prompt_tok_s": "llamacpp:prompt_tokens_seconds",
    "generated_tok_s": "llamacpp:predicted_tokens_seconds",
    "running": "llamacpp:requests_processing",
    "waiting": "llamacpp:requests_deferred",
    "cached_prompt_tokens": "llamacpp:prompt_tokens_cached_total",
    "busy_slots_per_decode": "llamacpp:n_busy_slots_per_decode",
    "spec_drafted": "llamacpp:spec_decode_num_draft_tokens_total",
    "spec_accepted": "llamacpp:spec_decode_num_accepted_tokens_total",
    "spec_drafts": "llamacpp:spec_decode_num_drafts_total",
}


def offload_finding(line: str) -> LintFinding | None:
    """`load_tensors: offloaded N/M layers to GPU` with N < M: part of the model runs on the CPU."""
    match = _OFFLOADED.search(line)
    if match and int(match["n"]) < int(match["m"]):
        return LintFinding(setting=f"gpu layers {match['n']}/{match['m']}", severity="serious",
                           why="only part of the model is on the GPU: the rest decodes on the CPU")
    return None


class LlamaCppFamily(EngineAdapter):
    """llama.cpp's server: the parts that do not depend on how the process is launched."""

    phases = LLAMA_SERVER_PHASES
    weight_phases = frozenset({"loading model"})
    ready_line = LLAMA_SERVER_READY
    failure_lines = LLAMA_SERVER_FAILURE
    probe_path = "/health"
    tokenize_api = "llama.cpp"  # /tokenize, and /apply-template for the chat template
    reasoning_kind = "llamacpp"
    # tools/server `POST /slots/{id}?action=erase`, each slot of `GET /slots`; 501 unless --slot-save-path is set
    cache_reset = "llamacpp-slots"
    # `timings_per_token` makes every chunk carry `timings.predicted_n`, the server's running count of generated
    # tokens: exact per-event token counts without a client tokenizer.
    stream_extras = {"timings_per_token": True}
    accepts_ignore_eos = True
    # tools/server/server-task.cpp params_from_json_cmpl reads no minimum length (only n_predict/max_tokens,
    # ignore_eos, t_max_predict_ms); an unknown `min_tokens` would be silently ignored
    accepts_min_tokens = False
    # /v1/responses is converted to a chat request and read by the same params_from_json_cmpl: ignore_eos is honoured
    # there (measured: an answer of exactly max_output_tokens)
    dialect_fields = {"responses": frozenset({"ignore_eos"})}
    fingerprint_path = "/props"
    metric_names = LLAMA_SERVER_METRICS
    config_paths = ["/props", "/v1/models", "/slots"]

    def fingerprint(self, body: Any) -> bool:
        # llama-server's /props: {"default_generation_settings": ..., "total_slots": N, "build_info": ...}
        return isinstance(body, dict) and "default_generation_settings" in body and "total_slots" in body

    def slots(self, body: Any) -> int | None:
        slots = body.get("total_slots") if isinstance(body, dict) else None  # = --parallel
        return slots if isinstance(slots, int) and not isinstance(slots, bool) and slots > 0 else None

    def probe_state(self, status: int | None, body: str) -> str:
        if status == 503 and "Loading model" in body:
            return "loading"
        return super().probe_state(status, body)

    def lint(self, spec: EngineSpec, command: list[str], runtime_config: dict[str, Any] | None = None
             ) -> list[LintFinding]:
        findings: list[LintFinding] = []
        slots = flag_value(command, "--parallel", "-np")
        if runtime_config and isinstance(runtime_config.get("total_slots"), int):
            slots = str(runtime_config["total_slots"])  # what the server says beats what we asked for
        if slots is not None and slots.isdigit() and int(slots) == 1:
            findings.append(LintFinding(
                setting="parallel=1", severity="serious",
                why="one slot: concurrent requests queue behind each other, so throughput under load and "
                    "peak tok/s measure a serialized server"))
        if has_flag(command, "--no-cont-batching", "-nocb"):
            findings.append(LintFinding(
                setting="no-cont-batching", severity="serious",
                why="continuous batching is off: new requests wait for the running batch to finish"))
        reasoning = reasoning_format_finding(spec, command, runtime_config)
        if reasoning is not None:
            findings.append(reasoning)
        threads = flag_value(command, "--threads", "-t")
        cores = os.cpu_count() or 1
        if threads is not None and threads.isdigit() and int(threads) > cores:
            findings.append(LintFinding(
                setting=f"threads={threads}", severity="warn",
                why=f"more compute threads than the {cores} logical CPUs: they contend and decode slows down"))
        return findings

    def lint_log_line(self, line: str) -> LintFinding | None:
        return offload_finding(line)


def reasoning_format_finding(spec: EngineSpec, command: list[str], runtime_config: dict[str, Any] | None
                             ) -> LintFinding | None:
    """A known reasoning family (engines/reasoning_families.py) with `--reasoning-format none` (or env
    LLAMA_ARG_THINK=none): its thoughts stay in message.content. llama.cpp extracts them by default (`auto`), so
    only turning that off is flagged; `deepseek-legacy` keeps `<think>` in content too (a warning)."""
    fmt = flag_value(command, "--reasoning-format") or spec.env.get("LLAMA_ARG_THINK")
    if fmt not in ("none", "deepseek-legacy"):
        return None
    config = runtime_config or {}
    family = family_of(config.get("model_path"), flag_value(command, "--model", "-m"),
                       flag_value(command, "--alias", "-a"), flag_value(command, "--hf-repo", "-hf"), spec.model)
    if family is None:
        return None
    if fmt == "deepseek-legacy":
        return LintFinding(setting="--reasoning-format deepseek-legacy", severity="warn",
                           why=f"{family.name} is a reasoning model: deepseek-legacy keeps <think> tags in content "
                               f"(and fills reasoning_content too); use --reasoning-format {LLAMACPP_FORMAT}")
    severity = "serious" if family.thinks_by_default else "warn"
    return LintFinding(setting="--reasoning-format none", severity=severity,
                       why=f"{family.name} is a reasoning model and --reasoning-format none leaves its thinking in "
                           f"content, so TTFO and answer-token figures count thinking as answer; use "
                           f"--reasoning-format {LLAMACPP_FORMAT} (or leave the default, auto)")
