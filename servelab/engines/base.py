"""What every engine adapter knows, behind one small interface.

An adapter turns an EngineSpec into a command line, names the log lines that mark its start-up phases, says what
its readiness probe's answers mean while it starts, lints its configuration, and names its Prometheus metrics.
Adding an engine is one new module in `servelab/engines/` plus one line in the registry (`engines/__init__.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from servelab.records import LintFinding


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


@dataclass(frozen=True)
class PhasePattern:
    """A log line that starts a phase. `progress` patterns must have named groups `n` and `total`."""

    phase: str
    regex: re.Pattern[str]
    progress: bool = False


ProbeState = Literal["down", "loading", "ready", "unknown"]


@dataclass
class Launch:
    """What an adapter hands to the supervisor: the exact command, its environment additions, and the URL."""

    command: list[str]
    env: dict[str, str]
    url: str
    model_path: str | None = None
    served_model: str | None = None  # the `model` value requests must carry
    extra: dict[str, Any] = field(default_factory=dict)


class EngineAdapter:
    """Base class: subclasses fill in the class attributes and override what differs."""

    name: ClassVar[str]
    title: ClassVar[str]
    # Ordered phase patterns, matched against every log line (split on \n and \r).
    phases: ClassVar[list[PhasePattern]] = []
    # The line that means "ready" when the engine prints one.
    ready_line: ClassVar[re.Pattern[str] | None] = None
    # The readiness probe path (GET); its meaning during start-up is `probe_state`.
    probe_path: ClassVar[str] = "/health"
    # Extra request fields that make the server report a running token count on every chunk. Empty when the
    # engine would reject unknown fields (transformers serve answers 422).
    stream_extras: ClassVar[dict[str, Any]] = {}
    # Whether requests may carry `ignore_eos` (fixed output length). Engines that reject unknown fields must say no.
    accepts_ignore_eos: ClassVar[bool] = False
    # How to recognise this engine behind a URL: GET this path; `fingerprint` judges the JSON answer.
    fingerprint_path: ClassVar[str | None] = None
    # Prometheus metric names by meaning (ttft, itl, running, waiting, kv_usage, spec_drafted, spec_accepted, ...).
    metric_names: ClassVar[dict[str, str]] = {}
    # Where an engine that is running can be asked what it was started with.
    config_paths: ClassVar[list[str]] = []

    def launch(self, spec: EngineSpec, port: int) -> Launch:  # pragma: no cover - abstract
        raise NotImplementedError

    def probe_state(self, status: int | None, body: str) -> ProbeState:
        """Meaning of one answer of the readiness probe. `status` is None when the connection was refused."""
        if status is None:
            return "down"
        if status == 200:
            return "ready"
        if status == 503:
            return "loading"
        return "unknown"

    def fingerprint(self, body: Any) -> bool:
        return False

    def lint(self, spec: EngineSpec, command: list[str], runtime_config: dict[str, Any] | None = None
             ) -> list[LintFinding]:
        return []

    def version(self) -> str | None:
        return None
