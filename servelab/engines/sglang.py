"""SGLang (`python -m sglang.launch_server`). Source: shared/research/engines.md §1 (sglang 0.5.10.post1).

Every log line carries `[%Y-%m-%d %H:%M:%S{ prefix}]` where the prefix names the rank (` TP3`, ` DP0 TP1`,
` PP1 TP0`); per-rank lines repeat once per rank, tqdm bars come from rank 0 only and rewrite themselves with \\r.
The HTTP port stays closed until every scheduler rank is ready; then /health answers 503 until the warm-up request
returns, and 200 after. `/server_info` returns every ServerArgs field, which is what lint trusts over the command
line (SGLang flips some flags itself, e.g. "Cuda graph is disabled because deepep_mode=`normal`").
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
    is_true,
    python_for,
    require_python_module,
)
from servelab.engines.lint import finding, merge
from servelab.engines.reasoning_families import parser_lint
from servelab.records import LintFinding

INSTALL = "pip install sglang (needs a CUDA GPU and its torch; see docs.sglang.ai)"

SGLANG_PHASES = [
    PhasePattern("arg dump", re.compile(r"server_args=ServerArgs\(")),
    # 0.5.10 says `Init torch distributed begin.`; 0.5.23 `Init parallel begin.` (distributed/bootstrap.py, before
    # init_distributed_environment and the NCCL groups).
    PhasePattern("distributed init", re.compile(r"Init torch distributed begin\.|Init parallel begin\.")),
    PhasePattern("loading weights", re.compile(r"Load weight begin\.")),
    PhasePattern("loading weights", re.compile(
        r"(?:Multi-thread loading shards|Loading safetensors checkpoint shards|Loading pt checkpoint shards|"
        r"Loading safetensors using Fastsafetensor loader):" + TQDM_COUNT), progress=True),
    PhasePattern("loading weights", re.compile(r"Load weight end\. elapsed=(?P<detail>[\d.]+ s)")),
    PhasePattern("allocating KV cache", re.compile(r"Using KV cache dtype|KV Cache is allocated|Memory pool end")),
    # Every graph capture's first line. 0.5.10 says `Capture cuda graph begin.` and `Capture piecewise CUDA graph
    # begin.`; 0.5.23 names what it captures and for whom, in the case each worker uses
    # (model_executor/model_runner_components/cuda_graph_setup.py `Capture {target|draft} {prefill|decode|verify}
    # CUDA graph begin.`, `CPU graph`/`NPU graph`/`XPU graph` on those devices; speculative/eagle_worker_v2.py
    # `Capture draft decode CUDA graph begin.`, `Capture draft extend CUDA graph begin.`;
    # speculative/multi_layer_eagle_draft_extend_cuda_graph_runner.py `Capture single-CG draft extend begin.`;
    # speculative/frozen_kv_mtp_worker_v2.py `Capture Frozen-KV MTP draft cuda graph begin.`;
    # speculative/uno_worker_v2.py `Capture UNO tree draft CUDA graph begin.`).
    # 0.5.23 tunes FlashInfer's kernels before any capture, for minutes on a big MoE
    # (model_executor/runner/flashinfer_autotune.py `Running FlashInfer autotune with cache: …`).
    PhasePattern("autotuning kernels", re.compile(r"Running FlashInfer autotune")),
    PhasePattern("capturing CUDA graphs", re.compile(r"\bCapture (?:[\w-]+ ){1,6}begin\b", re.IGNORECASE)),
    PhasePattern("capturing CUDA graphs", re.compile(r"Capturing batches \((?P<detail>bs=\d+)[^)]*\):" + TQDM_COUNT),
                 progress=True),
    # 0.5.23's prefill graphs (breakable, on by default on CUDA) have a bar of their own, rank 0 only
    # (model_executor/runner/prefill_cuda_graph_runner.py).
    PhasePattern("capturing CUDA graphs", re.compile(r"Capturing prefill shape \((?P<detail>num_tokens=\d+)[^)]*\):"
                                                     + TQDM_COUNT), progress=True),
    PhasePattern("scheduler ready", re.compile(r"max_total_num_tokens=\d+")),
    # The HTTP server starts after the schedulers; its lifespan starts the warm-up request.
    PhasePattern("warm-up", re.compile(r"Started server process|Application startup complete|Uvicorn running on")),
]

SGLANG_METRICS = {
    "ttft": "sglang:time_to_first_token_seconds",
    "itl": "sglang:inter_token_latency_seconds",
    "e2e": "sglang:e2e_request_latency_seconds",
    "running": "sglang:num_running_reqs",
    "waiting": "sglang:num_queue_reqs",
    "kv_usage": "sglang:token_usage",
    "kv_used_tokens": "sglang:num_used_tokens",
    "cache_hit_rate": "sglang:cache_hit_rate",
    "prompt_tokens": "sglang:prompt_tokens_total",
    "generated_tokens": "sglang:generation_tokens_total",
    "gen_throughput": "sglang:gen_throughput",
    "spec_accept_length": "sglang:spec_accept_length",
    "spec_accept_rate": "sglang:spec_accept_rate",
    "cuda_graph_passes": "sglang:cuda_graph_passes_total",
}

_DECODE_WITHOUT_GRAPH = re.compile(r"Decode batch\b.*\bcuda graph: False")

# (flag / ServerArgs field, severity, why). Fields are read back from /server_info with the same names.
_BOOL_RULES: list[tuple[str, str, str]] = [
    ("disable_cuda_graph", "serious",
     "no CUDA graphs for decode: every step pays kernel-launch overhead (the story's 27 tok/s instead of 63.6)"),
    ("disable_radix_cache", "warn", "no prefix caching: shared prompt prefixes are recomputed for every request"),
    ("disable_overlap_schedule", "warn", "the CPU scheduler no longer overlaps the GPU: every step waits for it"),
    ("log_requests", "warn", "every request is logged: logging overhead on the serving path"),
    ("enable_nan_detection", "warn", "NaN checks on every step slow decoding"),
    ("enable_deterministic_inference", "warn", "deterministic kernels are slower than the default ones"),
]


class SGLang(EngineAdapter):
    name = "sglang"
    tokenize_api = "sglang"
    reasoning_kind = "sglang"
    # http_server.py `/flush_cache` (GET or POST): 200 "Cache flushed.", 400 while requests run or wait
    cache_reset = "sglang-flush"
    profiler = "sglang"  # /start_profile (ProfileReqInput: output_dir, ...), /stop_profile
    title = "SGLang"
    install_hint = INSTALL
    phases = SGLANG_PHASES
    weight_phases = frozenset({"loading weights"})
    phase_budgets_s = {
        "distributed init": 600.0,  # NCCL init across 8 GPUs can take minutes on a busy node
        "autotuning kernels": 900.0,  # FlashInfer's autotune runs every candidate kernel at every shape
        "capturing CUDA graphs": 900.0,  # "can take up to several minutes" at large cuda_graph_max_bs
        "warm-up": 1800.0,  # SGLANG_WARMUP_TIMEOUT is 600 s; its doc suggests 1800 s for DeepGEMM JIT
    }
    ready_line = re.compile(r"The server is fired up and ready to roll!")
    heartbeat_lines = re.compile(PROBE_ACCESS_LINE)
    failure_lines = re.compile(r"scheduler died during initialization|Initialization failed\. warmup error|"
                               r"Scheduler hit an exception|watchdog timeout|CUDA out of memory")
    cmdline_markers = ("sglang.launch_server", "sglang::", "sglang serve")
    # ---- stack signatures (lifecycle/stacks/), read from SGLang 0.5.10 (python/sglang/srt/): the scheduler of
    # each TP rank (managers/scheduler.py) loops in event_loop_normal / event_loop_overlap: recv_requests (rank 0
    # polls the tokenizer's zmq socket, then broadcast_pyobj hands the requests to every rank over the CPU group:
    # an idle rank waits there, which is no collective hang), then run_batch. The detokenizer
    # (managers/detokenizer_manager.py) waits in DetokenizerManager.event_loop. Weights load through
    # model_executor/model_runner.py ModelRunner.load_model and model_loader/loader.py DefaultModelLoader; CUDA
    # graphs are captured in model_executor/cuda_graph_runner.py CudaGraphRunner.capture.
    stack_signatures = (
        StackSignature("idle in the request loop", "idle", modules=(r"sglang/srt/managers/scheduler\.py$",),
                       functions=("Scheduler.recv_requests", "recv_requests"), detail="recv_requests"),
        StackSignature("running a batch", "busy", modules=(r"sglang/srt/managers/scheduler\.py$",),
                       functions=("Scheduler.run_batch", "run_batch"), detail="run_batch"),
        StackSignature("capturing CUDA graphs", "busy", modules=(r"sglang/srt/model_executor/cuda_graph_runner\.py$",),
                       functions=("CudaGraphRunner.capture", "CudaGraphRunner.capture_one_batch_size",
                                  r"\w*capture\w*")),
        StackSignature("loading weights", "loading",
                       modules=(r"sglang/srt/model_loader/", r"sglang/srt/model_executor/model_runner\.py$"),
                       functions=("DefaultModelLoader.load_model", "DefaultModelLoader.load_weights_and_postprocess",
                                  r"\w*ModelLoader\.load_model", "ModelRunner.load_model", r"\w*weights_iterator"),
                       detail="{function}"),
        StackSignature("in distributed init ({function})", "waiting",
                       modules=(r"sglang/srt/distributed/parallel_state\.py$",
                                r"sglang/srt/model_executor/model_runner\.py$"),
                       functions=("init_distributed_environment", "initialize_model_parallel",
                                  "ModelRunner.init_torch_distributed")),
        StackSignature("detokenizing", "busy", modules=(r"sglang/srt/managers/detokenizer_manager\.py$",),
                       functions=(r"DetokenizerManager\.handle_\w+", r"DetokenizerManager\._decode\w*")),
        StackSignature("detokenizer idle", "idle", modules=(r"sglang/srt/managers/detokenizer_manager\.py$",),
                       functions=("DetokenizerManager.event_loop",)),
        StackSignature("tokenizing requests", "busy", modules=(r"sglang/srt/managers/tokenizer_manager\.py$",),
                       functions=(r"TokenizerManager\._tokenize\w*", "TokenizerManager.generate_request")),
        StackSignature("in the scheduler loop", "busy", modules=(r"sglang/srt/managers/scheduler\.py$",),
                       functions=("Scheduler.event_loop_normal", "Scheduler.event_loop_overlap",
                                  r"Scheduler\.event_loop_\w+")),
    )
    probe_path = "/health"  # 503 while ServerStatus.Starting (warm-up running), 200 after
    # Usage on every chunk (running completion_tokens), independent of include_usage in SGLang.
    stream_extras = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    accepts_ignore_eos = True
    # The OpenAI endpoints take `min_tokens` (protocol.py ChatCompletionRequest/CompletionRequest) and pass it on
    # as the sampling parameter `min_new_tokens` (serving_chat.py / serving_completions.py _build_sampling_params)
    accepts_min_tokens = True
    # ResponsesRequest (python/sglang/srt/entrypoints/openai/protocol.py) has neither ignore_eos nor min_tokens, and
    # its to_sampling_params builds max_new_tokens, temperature, top_p, penalties and stop only: both stay off there
    dialect_fields = {"responses": frozenset()}
    fingerprint_path = "/server_info"
    metric_names = SGLANG_METRICS
    config_paths = ["/server_info", "/get_server_info"]

    def require(self, spec: EngineSpec) -> None:
        require_python_module(spec, "sglang", self.title, INSTALL)

    def build(self, spec: EngineSpec, port: int) -> Launch:
        model, size, fmt = hub_or_path(spec.model)
        command = [python_for(spec), "-m", "sglang.launch_server", "--model-path", model, "--host", spec.host,
                   "--port", str(port), "--tp-size", str(spec.tp)]
        if spec.parallel:
            command += ["--max-running-requests", str(spec.parallel)]
        if spec.ctx_size:
            command += ["--context-length", str(spec.ctx_size)]
        command += spec.extra_args
        served = flag_value(command, "--served-model-name") or model
        return Launch(command=command, env=dict(spec.env), url=base_url(spec, port), model_path=model,
                      served_model=served, extra={"model_size_bytes": size, "model_format": fmt})

    def fingerprint(self, body: Any) -> bool:
        return isinstance(body, dict) and ("disable_cuda_graph" in body or "internal_states" in body)

    def lint(self, spec: EngineSpec, command: list[str], runtime_config: dict[str, Any] | None = None
             ) -> list[LintFinding]:
        return sglang_lint(command, runtime_config)

    def lint_log_line(self, line: str) -> LintFinding | None:
        if _DECODE_WITHOUT_GRAPH.search(line):
            return finding("cuda graph: False (decode log)", "serious",
                           "decode batches ran without CUDA graphs (--disable-cuda-graph, or batches above "
                           "cuda_graph_max_bs)")
        return None

    def version(self) -> str | None:
        try:
            return f"sglang {version('sglang')}"
        except PackageNotFoundError:
            return None


def sglang_lint(command: list[str], config: dict[str, Any] | None) -> list[LintFinding]:
    """Lint rules on the command line and on /server_info (which wins: SGLang changes some flags itself)."""
    config = config or {}
    found: list[LintFinding] = []
    for field, severity, why in _BOOL_RULES:
        flag = "--" + field.replace("_", "-")
        on_cmdline = has_flag(command, flag)
        on_server = is_true(config.get(field, False))
        if on_cmdline or on_server:
            source = "command line and /server_info" if on_cmdline and on_server else (
                "command line" if on_cmdline else "/server_info")
            found.append(finding(flag, severity, f"{why} [{source}]"))
    log_level = config.get("log_level") or flag_value(command, "--log-level")
    if str(log_level).lower() == "debug":
        found.append(finding("--log-level debug", "warn", "debug logging on every step slows the server"))
    graph_gb = [state.get("memory_usage", {}).get("graph") for state in config.get("internal_states") or []
                if isinstance(state, dict)]
    if any(gb is not None and float(gb) == 0.0 for gb in graph_gb):
        found.append(finding("--disable-cuda-graph", "serious",
                             "no CUDA graph was captured (internal_states[].memory_usage.graph == 0) "
                             "[/server_info]"))
    reasoning = _reasoning_lint(command, config)
    if reasoning is not None:
        found.append(reasoning)
    if not has_flag(command, "--enable-metrics") and not is_true(config.get("enable_metrics", False)):
        found.append(finding("--enable-metrics", "info",
                             "off: no /metrics, so server-side TTFT/ITL histograms cannot be compared"))
    return merge(found)


def _reasoning_lint(command: list[str], config: dict[str, Any]) -> LintFinding | None:
    """A known reasoning family without its parser (engines/reasoning_families.py). The parser is read from
    /server_info when it answers (`reasoning_parser`, null when off), else from the command line."""
    models = [config.get("model_path"), config.get("served_model_name"),
              flag_value(command, "--model-path", "--model"), flag_value(command, "--served-model-name")]
    on_cmdline = flag_value(command, "--reasoning-parser")
    if "reasoning_parser" in config:
        on_server = config.get("reasoning_parser")
        agree = flag_value(command, "--model-path", "--model") is not None and on_cmdline == on_server
        return parser_lint("sglang", models, on_server, "command line and /server_info" if agree else "/server_info")
    return parser_lint("sglang", models, on_cmdline, "command line")
