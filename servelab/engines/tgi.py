"""Hugging Face text-generation-inference (`text-generation-launcher`). Source: shared/research/engines.md §5
(TGI @ db931fcf, v3.3.6-dev0; the project is in maintenance mode).

The Rust launcher downloads weights, starts one Python shard per GPU, then the router, which binds its port only
after shard load *and* warm-up: the port is closed until ready. While shards load, the launcher logs `Waiting for
shard to be ready... rank=N` every 10 s whatever happens, so that line proves nothing about progress. Shard
stderr (tqdm bars) is not shown live at all.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

from servelab.engines.base import EngineAdapter, EngineSpec, Launch, PhasePattern
from servelab.engines.stack_signature import StackSignature
from servelab.engines.common import PROBE_ACCESS_LINE, base_url, flag_value, hub_or_path, require_binary
from servelab.engines.lint import finding, merge
from servelab.records import LintFinding

INSTALL = ("run the ghcr.io/huggingface/text-generation-inference container, or build the launcher, router and "
           "server from the repository (make install)")

TGI_PHASES = [
    PhasePattern("arg dump", re.compile(r"\bArgs \{")),
    PhasePattern("downloading", re.compile(r"Starting check and download process|Download file:|"
                                           r"Files are already present on the host")),
    PhasePattern("downloading", re.compile(r"Download: \[(?P<n>\d+)/(?P<total>\d+)\]"), progress=True),
    PhasePattern("loading shards", re.compile(r"Starting shard rank=\d+|Successfully downloaded weights")),
    PhasePattern("shards ready", re.compile(r"Shard ready in (?P<detail>\S+)")),
    PhasePattern("warm-up", re.compile(r"Starting Webserver|Warming up model|Using backend V3")),
    PhasePattern("warm-up", re.compile(r"Setting max batch total tokens to (?P<detail>\d+)")),
]

TGI_METRICS = {
    "queue": "tgi_request_queue_duration",
    "tpot": "tgi_request_mean_time_per_token_duration",
    "e2e": "tgi_request_duration",
    "inference": "tgi_request_inference_duration",
    "prefill_batch": "tgi_batch_inference_duration",
    "running": "tgi_batch_current_size",
    "waiting": "tgi_queue_size",
    "kv_used_tokens": "tgi_batch_current_max_tokens",
    "kv_max_tokens": "tgi_batch_max_total_tokens",
    "generated_tokens": "tgi_request_generated_tokens",
    "spec_skipped": "tgi_request_skipped_tokens",
}

_GRAPHS_OFF = re.compile(r"Cuda Graphs are disabled|Bitsandbytes doesn't work with cuda graphs|"
                         r"deactivating them")


class TGI(EngineAdapter):
    name = "tgi"
    title = "text-generation-inference"
    install_hint = INSTALL
    phases = TGI_PHASES
    weight_phases = frozenset({"loading shards"})
    phase_budgets_s = {"downloading": 3600.0, "warm-up": 900.0}
    ready_line = re.compile(r"\bConnected\s*$")
    heartbeat_lines = re.compile(r"Waiting for shard to be ready|" + PROBE_ACCESS_LINE)
    failure_lines = re.compile(r"Shard complete standard error output|Shard process was signaled to shutdown|"
                               r"Not enough memory to handle|ShardCannotStart|WebserverFailed|DownloadError")
    cmdline_markers = ("text-generation-launcher", "text-generation-router")
    # ---- stack signatures (lifecycle/stacks/): TGI's launcher and router are Rust (py-spy reads no stacks from
    # them: "not a Python process"); its model shards are Python, read from text-generation-inference 3.x
    # (server/text_generation_server/): server.py serve runs a gRPC asyncio server whose TextGenerationService
    # Prefill/Decode call Model.generate_token and Warmup Model.warmup; models load in models/__init__.py get_model
    # and utils/weights.py. An idle shard is its asyncio event loop waiting (a generic signature).
    stack_signatures = (
        StackSignature("warming up", "busy", modules=(r"text_generation_server/",),
                       functions=(r"\w*\.warmup", "TextGenerationService.Warmup")),
        StackSignature("running a batch", "busy", modules=(r"text_generation_server/",),
                       functions=(r"\w*\.generate_token", "TextGenerationService.Prefill",
                                  "TextGenerationService.Decode"), detail="{function}"),
        StackSignature("loading weights", "loading",
                       modules=(r"text_generation_server/models/__init__\.py$",
                                r"text_generation_server/utils/weights\.py$"),
                       functions=("get_model", r"Weights\.\w+"), detail="{function}"),
    )
    probe_path = "/health"  # port closed until ready; 503 {"error":"unhealthy"} afterwards means unhealthy
    stream_extras: dict[str, Any] = {}  # include_usage only: no running count per chunk
    accepts_ignore_eos = False
    accepts_min_tokens = False  # neither the OpenAI ChatRequest nor GenerateParameters has a minimum length
    fingerprint_path = "/info"
    metric_names = TGI_METRICS
    config_paths = ["/info"]

    def require(self, spec: EngineSpec) -> None:
        require_binary(spec, "text-generation-launcher", self.title, INSTALL)

    def build(self, spec: EngineSpec, port: int) -> Launch:
        model, size, fmt = hub_or_path(spec.model)
        command = [spec.executable or "text-generation-launcher", "--model-id", model, "--hostname", spec.host,
                   "--port", str(port), "--num-shard", str(spec.tp)]
        if spec.parallel:
            command += ["--max-concurrent-requests", str(spec.parallel)]
        if spec.ctx_size:
            command += ["--max-total-tokens", str(spec.ctx_size)]
        command += spec.extra_args
        return Launch(command=command, env=dict(spec.env), url=base_url(spec, port), model_path=model,
                      served_model=model, extra={"model_size_bytes": size, "model_format": fmt})

    def fingerprint(self, body: Any) -> bool:
        return isinstance(body, dict) and "model_id" in body and "max_concurrent_requests" in body

    def lint(self, spec: EngineSpec, command: list[str], runtime_config: dict[str, Any] | None = None
             ) -> list[LintFinding]:
        found: list[LintFinding] = []
        graphs = flag_value(command, "--cuda-graphs")
        if graphs is not None and graphs.strip() == "0" or spec.env.get("CUDA_GRAPHS", "").strip() == "0":
            found.append(finding("--cuda-graphs 0", "serious", "CUDA graphs are off for every batch size"))
        if "--quantize" in command and flag_value(command, "--quantize") in ("bitsandbytes", "bitsandbytes-nf4",
                                                                           "bitsandbytes-fp4", "exl2"):
            found.append(finding("--quantize " + (flag_value(command, "--quantize") or ""), "serious",
                                 "TGI turns CUDA graphs off for bitsandbytes and exl2"))
        limit = (runtime_config or {}).get("max_concurrent_requests") or flag_value(command,
                                                                                  "--max-concurrent-requests")
        if limit is not None and str(limit).isdigit() and int(limit) <= 1:
            found.append(finding(f"max_concurrent_requests={limit}", "serious",
                                 "one request at a time: every other request is refused or queued"))
        return merge(found)

    def lint_log_line(self, line: str) -> LintFinding | None:
        if _GRAPHS_OFF.search(line):
            return finding("--cuda-graphs 0", "serious", "the shards report CUDA graphs disabled [shard log]")
        return None

    def version(self) -> str | None:
        try:
            done = subprocess.run(["text-generation-launcher", "--version"], capture_output=True, text=True,
                                  timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() or None
