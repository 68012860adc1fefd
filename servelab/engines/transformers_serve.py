"""Hugging Face `transformers serve`. Source: shared/research/engines.md §6 (transformers 5.24.0), and a real
start-up log (tests/fixtures/transformers_serve_5.24.0_startup.log):

    [transformers] Loading .venv-tf/models/smollm2-hf
    \\rLoading weights:   0%|          | 0/272 [00:00<?, ?it/s]\\rLoading weights: 100%|██████████| 272/272 [...]
    INFO:     Started server process [13927]
    INFO:     Uvicorn running on http://127.0.0.1:18777 (Press CTRL+C to quit)

With a model on the command line it loads before uvicorn starts (port closed while loading). Without
`--continuous-batching` requests run one after another on a single inference thread. Unknown request fields are
answered with HTTP 422, so no `ignore_eos` and no stream extras. Torch-based: it lives in a venv of its own
(scripts/setup-slow-engines.sh builds .venv-tf), reached with `--executable .venv-tf/bin/python`.
"""

from __future__ import annotations

import re
from typing import Any

from servelab.engines.base import EngineAdapter, EngineSpec, Launch, PhasePattern
from servelab.engines.stack_signature import StackSignature
from servelab.engines.common import (
    PROBE_ACCESS_LINE,
    TQDM_COUNT,
    UVICORN_RUNNING,
    UVICORN_STARTUP,
    base_url,
    has_flag,
    hub_or_path,
    python_for,
    require_python_module,
)
from servelab.engines.lint import finding, merge
from servelab.records import LintFinding

INSTALL = ("pip install torch==2.13.0 'transformers[serving]' in a venv of its own "
           "(scripts/setup-slow-engines.sh builds .venv-tf)")

TRANSFORMERS_PHASES = [
    PhasePattern("loading weights", re.compile(r"\bLoading (?P<detail>\S+)$")),
    PhasePattern("loading weights", re.compile(r"Loading weights:" + TQDM_COUNT), progress=True),
    PhasePattern("starting HTTP server", re.compile(UVICORN_STARTUP)),
]


class TransformersServe(EngineAdapter):
    name = "transformers-serve"
    title = "transformers serve"
    install_hint = INSTALL
    phases = TRANSFORMERS_PHASES
    weight_phases = frozenset({"loading weights"})
    ready_line = re.compile(UVICORN_RUNNING)
    heartbeat_lines = re.compile(PROBE_ACCESS_LINE)
    failure_lines = re.compile(r"Traceback \(most recent call last\)|Error: ")
    cmdline_markers = ("transformers serve", "transformers.cli.transformers serve")
    # ---- stack signatures (lifecycle/stacks/), read from transformers 5.24 (transformers/cli/serving/,
    # generation/continuous_batching/continuous_api.py): requests run on cli/serving/utils.py InferenceThread._run
    # (waiting on its queue when idle, inside generate when busy), or with continuous batching on
    # ContinuousBatchingManager._run_generation_loop: _generation_step runs a batch, and _generation_loop_body
    # waits on _wake_up_loop when there is none. Models load in cli/serving/model_manager.py.
    stack_signatures = (
        StackSignature("running a batch", "busy", modules=(r"transformers/generation/continuous_batching/",),
                       functions=(r"\w*\._generation_step",), detail="continuous batching"),
        StackSignature("generating", "busy", modules=(r"transformers/generation/utils\.py$",),
                       functions=(r"GenerationMixin\.\w+",)),
        StackSignature("loading weights", "loading", modules=(r"transformers/cli/serving/model_manager\.py$",),
                       functions=(r"ModelManager\.load\w*", r"ModelManager\._load\w*"), detail="transformers"),
        StackSignature("idle in the batching loop", "idle", modules=(r"transformers/generation/continuous_batching/",),
                       functions=(r"\w*\._generation_loop_body", r"\w*\._run_generation_loop"),
                       detail="continuous batching"),
        StackSignature("inference thread idle", "idle", modules=(r"transformers/cli/serving/utils\.py$",),
                       functions=("InferenceThread._run",)),
    )
    probe_path = "/health"
    stream_extras: dict[str, Any] = {}  # stream_options is ignored with a warning; usage always rides the last chunk
    accepts_ignore_eos = False  # HTTP 422 "Unexpected fields in the request"
    accepts_min_tokens = False  # likewise: not an OpenAI field
    fingerprint_path = None  # /health is {"status":"ok"} like many servers: not a fingerprint
    metric_names: dict[str, str] = {}  # no /metrics
    config_paths = ["/v1/models"]

    def require(self, spec: EngineSpec) -> None:
        require_python_module(spec, "transformers", self.title, INSTALL)
        require_python_module(spec, "fastapi", self.title + " (the [serving] extra)", INSTALL)

    def build(self, spec: EngineSpec, port: int) -> Launch:
        model, size, fmt = hub_or_path(spec.model)
        # The module, not the `transformers` script: only the interpreter's path is needed to reach another venv.
        command = [python_for(spec), "-m", "transformers.cli.transformers", "serve", model, "--host", spec.host,
                   "--port", str(port)]
        if spec.parallel and spec.parallel > 1:
            command.append("--continuous-batching")  # the only way this server runs requests concurrently
        command += spec.extra_args
        env = dict(spec.env)
        if spec.threads:
            env.setdefault("OMP_NUM_THREADS", str(spec.threads))
        return Launch(command=command, env=env, url=base_url(spec, port), model_path=model,
                      served_model=model,  # the id in /v1/models is the argument as given
                      extra={"model_size_bytes": size, "model_format": fmt})

    def lint(self, spec: EngineSpec, command: list[str], runtime_config: dict[str, Any] | None = None
             ) -> list[LintFinding]:
        found: list[LintFinding] = []
        if not has_flag(command, "--continuous-batching"):
            found.append(finding("no --continuous-batching", "serious",
                                 "requests run one after another on a single inference thread: concurrency only "
                                 "queues"))
        if not has_flag(command, "--compile"):
            found.append(finding("no --compile", "info", "torch.compile is off (the default)"))
        return merge(found)

    def version(self) -> str | None:
        return None  # lives in another venv: provenance records the interpreter in the command line
