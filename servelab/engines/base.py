"""What every engine adapter knows, behind one small interface.

An adapter turns an EngineSpec into a command line, names the log lines that mark its start-up phases, says what
its readiness probe's answers mean while it starts, lints its configuration, and names its Prometheus metrics.
Adding an engine is one new module in `servelab/engines/` plus one line in the registry (`engines/__init__.py`):
its help line, its prompt counter, its tokenize endpoint and its reasoning advice all come from the adapter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, Field

from servelab.engines.stack_signature import StackSignature
from servelab.protocol.tokenize import TokenizeAPI
from servelab.records import LintFinding

if TYPE_CHECKING:
    from servelab.protocol.dialects.dialect import Dialect


class EngineSpec(BaseModel):
    """How to launch one engine: the same shape for every engine (and, later, for every experiment cell)."""

    engine: str
    model: str  # a known name ("smollm2") or a path
    host: str = "127.0.0.1"  # loopback unless the user asks otherwise
    port: int | None = None  # None: pick a free port
    parallel: int | None = None  # concurrent sequences / slots, where the engine has the notion
    threads: int | None = None  # CPU threads, where the engine has the notion
    tp: int = 1
    ctx_size: int | None = None
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    # The interpreter (Python engines) or binary (llama-server, TGI) to run; None: this Python, or the binary on
    # PATH. Lets an engine live in a venv of its own (torch engines must never enter servelab's).
    executable: str | None = None
    # Engine-specific settings that are not flags of the engine itself, e.g. the `command` engine's url and probe
    # path, or the replay engine's speed and variant. Values are strings, as typed on a command line.
    options: dict[str, str] = Field(default_factory=dict)
    # Seconds without any evidence of progress after which start-up is declared stalled, whatever the phase.
    # None: the adapter's per-phase budgets.
    stall_budget_s: float | None = None


@dataclass(frozen=True)
class PhasePattern:
    """A log line that starts a phase. `progress` patterns must have named groups `n` and `total`."""

    phase: str
    regex: re.Pattern[str]
    progress: bool = False


ProbeState = Literal["down", "loading", "ready", "unknown"]
# Whose way of separating a model's thinking from its answer the engine follows: the fix a verdict suggests
# (engines/reasoning_families.py) is written per kind.
ReasoningKind = Literal["sglang", "vllm", "llamacpp"]
# How an engine empties its prefix cache on request (bench/cache_reset.py does the calls): SGLang `POST /flush_cache`,
# vLLM `POST /reset_prefix_cache` (served only with VLLM_SERVER_DEV_MODE=1), llama.cpp's server an erase of each
# slot (`POST /slots/{id}?action=erase` for every id of `GET /slots`; served only with --slot-save-path).
CacheReset = Literal["sglang-flush", "vllm-reset", "llamacpp-slots"]
# Whose profiler endpoints the engine serves (bench/profiler.py): SGLang `/start_profile` (output_dir in the body) and
# `/stop_profile`; vLLM the same paths, mounted only with VLLM_TORCH_PROFILER_DIR (its traces go there).
ProfilerKind = Literal["sglang", "vllm"]


@dataclass
class Launch:
    """What an adapter hands to the supervisor: the exact command, its environment additions, and the URL."""

    command: list[str]
    env: dict[str, str]
    url: str
    model_path: str | None = None
    served_model: str | None = None  # the `model` value requests must carry
    extra: dict[str, Any] = field(default_factory=dict)


# Per-phase stall budgets (seconds without any evidence of progress). Generous on purpose: a false "stalled" that
# stops a healthy 20-minute load costs more than a real hang noticed a few minutes late. Engines' own bounded waits
# show what their authors consider normal (shared/research/engines.md §0.6): SGLang warm-up 600 s, vLLM engine
# start 600 s, SGLang watchdog 300 s.
DEFAULT_PHASE_BUDGET_S = 300.0
STARTING_BUDGET_S = 180.0  # interpreter start and imports before the first recognised line (torch imports are slow)
# Weight loading is I/O-bound: budget = checkpoint bytes / a conservative 0.5 GB/s, never less than this.
WEIGHT_LOAD_BYTES_PER_S = 0.5e9
WEIGHT_LOAD_MIN_BUDGET_S = 120.0
# After the log says "ready" the port must answer soon; a server that never binds is stuck, not slow.
AFTER_READY_LINE_BUDGET_S = 60.0


class EngineAdapter:
    """Base class: subclasses fill in the class attributes and override what differs."""

    name: ClassVar[str]
    title: ClassVar[str]
    # How to install the engine, for the error when it is missing.
    install_hint: ClassVar[str] = ""
    # Ordered phase patterns, matched against every log line (split on \n and \r).
    phases: ClassVar[list[PhasePattern]] = []
    # Phases that read weights: their stall budget scales with the model's size.
    weight_phases: ClassVar[frozenset[str]] = frozenset()
    # Fixed stall budgets (seconds) for other phases, where they differ from DEFAULT_PHASE_BUDGET_S.
    phase_budgets_s: ClassVar[dict[str, float]] = {}
    # The line that means "ready" when the engine prints one.
    ready_line: ClassVar[re.Pattern[str] | None] = None
    # Lines that repeat on a timer whatever the engine is doing (TGI's "Waiting for shard to be ready" every 10 s,
    # HTTP access lines of our own probes): they prove the process is alive, not that start-up advances.
    heartbeat_lines: ClassVar[re.Pattern[str] | None] = None
    # Lines in which the engine explains its own failure (a rank that died, a load error): quoted in a verdict.
    failure_lines: ClassVar[re.Pattern[str] | None] = None
    # Substrings of a process command line that identify this engine (for `doctor --pid`).
    cmdline_markers: ClassVar[tuple[str, ...]] = ()
    # The readiness probe path (GET); its meaning during start-up is `probe_state`.
    probe_path: ClassVar[str] = "/health"
    # Extra request fields that make the server report a running token count on every chunk, merged into the
    # request body by the bench client. Empty when the engine would reject unknown fields (transformers serve
    # answers 422).
    stream_extras: ClassVar[dict[str, Any]] = {}
    # Whether requests may carry `ignore_eos` (fixed output length). Engines that reject unknown fields must say no.
    accepts_ignore_eos: ClassVar[bool] = False
    # Whether requests may carry OpenAI-style `min_tokens` (at least that many generated tokens) and the engine
    # honours it. Engines that ignore unknown fields (llama.cpp) must say no, or a request would look honoured.
    accepts_min_tokens: ClassVar[bool] = False
    # Of those two, the ones the engine reads on an endpoint whose request it parses with a model of its own, not
    # chat's, by dialect name (protocol/dialects/); a dialect not named here reads what chat reads. Each engine's
    # ResponsesRequest is its own model, so by default neither is assumed to reach it on /v1/responses.
    dialect_fields: ClassVar[dict[str, frozenset[str]]] = {"responses": frozenset()}
    # How to recognise this engine behind a URL: GET this path; `fingerprint` judges the JSON answer.
    fingerprint_path: ClassVar[str | None] = None
    # Prometheus metric names by meaning (ttft, itl, running, waiting, kv_usage, spec_drafted, spec_accepted, ...).
    metric_names: ClassVar[dict[str, str]] = {}
    # Where an engine that is running can be asked what it was started with (the first that answers JSON wins).
    config_paths: ClassVar[list[str]] = []
    # The server's token-count endpoint, by family (protocol/tokenize.py); None: it has none. Exact prompt lengths
    # use it where it applies the chat template (llama.cpp, vllm, sglang).
    tokenize_api: ClassVar[TokenizeAPI | None] = None
    # Whether a prompt can be counted by asking for one token and reading usage.prompt_tokens, where no endpoint
    # applies the chat template: an OpenAI-style server reports usage; an arbitrary command may not.
    counts_prompts_by_usage: ClassVar[bool] = True
    # Whose reasoning-parser flags the engine takes; None: none servelab knows how to advise on.
    reasoning_kind: ClassVar[ReasoningKind | None] = None
    # What the engine's own threads look like when idle, loading, running a batch (read from its source, with the
    # version): lifecycle/stacks/ names each process of a running engine by them before the generic signatures.
    stack_signatures: ClassVar[tuple[StackSignature, ...]] = ()
    # How the engine empties its prefix cache between trials, read from its source; None: no endpoint known (the
    # trial then records that it was not reset, and why).
    cache_reset: ClassVar[CacheReset | None] = None
    # Whose torch-profiler endpoints the engine serves (`bench --profile-level`); None: none known.
    profiler: ClassVar[ProfilerKind | None] = None

    # ---- launching ----
    @classmethod
    def sends_field(cls, field: Literal["ignore_eos", "min_tokens"], dialect: Dialect) -> bool:
        """Whether requests on `dialect`'s endpoint carry `field`: only where the engine honours it (on chat), the
        endpoint carries engine fields at all (not /v1/messages) and the engine's request model there reads it."""
        honoured = cls.accepts_ignore_eos if field == "ignore_eos" else cls.accepts_min_tokens
        reads = cls.dialect_fields.get(dialect.name)
        return honoured and dialect.engine_fields and (reads is None or field in reads)

    def launch(self, spec: EngineSpec, port: int) -> Launch:
        """Check that the engine is installed (UserError saying how to install it if not), then build the launch."""
        self.require(spec)
        return self.build(spec, port)

    def require(self, spec: EngineSpec) -> None:
        """Raise UserError when the engine cannot be run as `spec` asks. Default: nothing to check."""

    def build(self, spec: EngineSpec, port: int) -> Launch:  # pragma: no cover - abstract
        """The exact command line, environment and URL for `spec` on `port`. Pure: checks nothing on the host."""
        raise NotImplementedError

    # ---- start-up ----
    def probe_state(self, status: int | None, body: str) -> ProbeState:
        """Meaning of one answer of the readiness probe. `status` is None when the connection was refused."""
        if status is None:
            return "down"
        if status == 200:
            return "ready"
        if status == 503:
            return "loading"
        return "unknown"

    def phase_budget_s(self, phase: str, model_bytes: int | None) -> float:
        """Seconds a phase may go without any evidence of progress before start-up counts as stalled."""
        if phase in self.weight_phases:
            by_size = (model_bytes or 0) / WEIGHT_LOAD_BYTES_PER_S
            return max(WEIGHT_LOAD_MIN_BUDGET_S, by_size)
        if phase == "starting":
            return self.phase_budgets_s.get(phase, STARTING_BUDGET_S)
        return self.phase_budgets_s.get(phase, DEFAULT_PHASE_BUDGET_S)

    def after_ready_line_budget_s(self) -> float:
        return AFTER_READY_LINE_BUDGET_S

    # ---- recognising and reading back ----
    def fingerprint(self, body: Any) -> bool:
        return False

    def slots(self, body: Any) -> int | None:
        """How many requests the server runs at once, from its fingerprint path's answer; None: it does not say
        (the auto warm-up is then not capped by it, bench/warmup.py)."""
        return None

    def lint(self, spec: EngineSpec, command: list[str], runtime_config: dict[str, Any] | None = None
             ) -> list[LintFinding]:
        """Findings from the command line and, when the engine exposes it, its runtime config."""
        return []

    def lint_log_line(self, line: str) -> LintFinding | None:
        """A finding from one log line the engine wrote (e.g. SGLang's decode line `cuda graph: False`)."""
        return None

    def version(self) -> str | None:
        return None
