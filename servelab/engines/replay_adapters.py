"""The replay engine as adapters users can launch: `servelab up replay-sglang` / `servelab up replay-vllm`.

Each inherits everything from the real engine's adapter (phases, readiness semantics, lint, config paths,
metrics), so a replay exercises exactly the code that will read a real SGLang or vLLM. Only the launch differs,
and the stall budgets, which shrink with the replay's speed: a replay at --speed 50 runs 50 times faster than the
engine it imitates, so its phases may go 50 times shorter without evidence (never below MIN_BUDGET_S, which is
two evidence samples).

Options (`--option KEY=VALUE`): speed (default 50), variant (normal, hang-in-load, crash-9-mid-load, never-bind,
slow-steady, deadlock-at-init, hang-in-decode). `--model` names the file the replay reads while it "loads weights" (default: the smollm2 GGUF).
`--extra` flags go to the imitated engine's command line (e.g. --disable-cuda-graph) and change the replay;
`--model-path` (SGLang) / `--model` (vLLM) there names the model it serves, and `--reasoning-parser` separates the
thinking of a reasoning model (replay_http.py).
"""

from __future__ import annotations

import sys

from servelab.engines.base import EngineSpec, Launch
from servelab.engines.common import base_url, flag_value
from servelab.engines.replay_script import load_script
from servelab.engines.sglang import SGLang
from servelab.engines.vllm import VLLM
from servelab.errors import UserError
from servelab.models import resolve_model

MIN_BUDGET_S = 2.0
DEFAULT_SPEED = 50.0


class _ReplayMixin:
    script_name: str
    _speed: float = DEFAULT_SPEED

    def require(self, spec: EngineSpec) -> None:
        variant = spec.options.get("variant", "normal")
        from servelab.engines.replay import VARIANTS

        if variant not in VARIANTS:
            raise UserError(f"unknown replay variant '{variant}'", hint=f"one of: {', '.join(VARIANTS)}")

    def build(self, spec: EngineSpec, port: int) -> Launch:
        try:
            self._speed = float(spec.options.get("speed", DEFAULT_SPEED))
        except ValueError:
            raise UserError(f"replay speed must be a number, not '{spec.options['speed']}'") from None
        if self._speed <= 0:
            raise UserError("replay speed must be positive")
        script = load_script(self.script_name)
        model_file = resolve_model(spec.model)
        # tp 1 is the spec's default: then the script's own rank count (tp=8 for the story).
        tp = spec.tp if spec.tp != 1 else int(script.meta.get("tp", "1"))
        command = [sys.executable, "-m", "servelab.engines.replay", "--script", self.script_name,
                   "--speed", f"{self._speed:g}", "--variant", spec.options.get("variant", "normal"),
                   "--tp", str(tp), "--model-file", str(model_file.path), "--host", spec.host,
                   "--port", str(port), *spec.extra_args]
        # The imitated engine's own model flag (`-- --model-path /shared/kimi-k2.5-int4`) names what it serves.
        served = flag_value(spec.extra_args, "--model-path", "--model") or script.meta.get("model", "model")
        # Budgets scale with the imitated checkpoint, not with the small file the replay actually reads.
        return Launch(command=command, env=dict(spec.env), url=base_url(spec, port), model_path=served,
                      served_model=served, extra={"model_size_bytes": script.checkpoint_bytes,
                                                  "model_format": "replay", "speed": self._speed})

    def phase_budget_s(self, phase: str, model_bytes: int | None) -> float:
        return max(MIN_BUDGET_S, super().phase_budget_s(phase, model_bytes) / self._speed)  # type: ignore[misc]

    def after_ready_line_budget_s(self) -> float:
        return max(MIN_BUDGET_S, super().after_ready_line_budget_s() / self._speed)  # type: ignore[misc]

    def version(self) -> str | None:
        script = load_script(self.script_name)
        return f"replay of {script.meta.get('engine')} {script.meta.get('version')} ({self.script_name})"


class ReplaySGLang(_ReplayMixin, SGLang):
    name = "replay-sglang"
    title = "SGLang (replay)"
    script_name = "sglang-tp8"
    cmdline_markers = ("servelab.engines.replay --script sglang",)


class ReplayVLLM(_ReplayMixin, VLLM):
    name = "replay-vllm"
    title = "vLLM (replay)"
    script_name = "vllm-tp8"
    cmdline_markers = ("servelab.engines.replay --script vllm",)
