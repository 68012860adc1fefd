"""What an experiment file declares: cells (an engine to launch, or the URL of a server already running), the
bench and verify settings they share (a cell may override them), and the baseline to compare against.

Every model forbids unknown keys, so a misspelt setting is an error naming the field instead of being ignored.
A cell's launch fields are exactly EngineSpec's (a cell *is* an EngineSpec plus a name), so an engine setting
added to EngineSpec is accepted in experiment files without touching this module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from servelab.bench.runner import BenchOptions
from servelab.bench.steady import SteadyRule
from servelab.bench.workload import Workload
from servelab.engines import REGISTRY, EngineSpec
from servelab.experiment.contention import ContentionPolicy

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MultiturnSettings(Strict):
    """A multi-turn level instead of the concurrency sweep (issue 16; `bench --mode multiturn`): `users` users, each
    through synthetic conversations of `turns` user turns of `input_tokens` tokens after a shared system prompt of
    `prefix_tokens`, or the conversations of `dataset` (ShareGPT .json or JSONL .jsonl)."""

    users: int = Field(4, ge=1, le=10_000)
    turns: int = Field(6, ge=1, le=10_000)
    input_tokens: str | int = 64
    prefix_tokens: int = Field(128, ge=0)
    think_time: str | None = None
    conversations: int | None = Field(None, ge=1)
    dataset: str | None = None
    history: Literal["server", "dataset"] = "server"

    def workload(self, output):
        from pathlib import Path

        from servelab.bench.options import BenchArgs
        from servelab.bench.workloads.multi import build_multi_workload

        args = BenchArgs(mode="multiturn", users=self.users, think_time=self.think_time, history=self.history,
                         conversations=self.conversations, endpoint="chat",
                         dataset=Path(self.dataset) if self.dataset else None)
        if self.dataset is None:
            args.turns, args.input_tokens, args.prefix_tokens = self.turns, str(self.input_tokens), self.prefix_tokens
        return build_multi_workload(args, output)


class BenchSettings(Strict):
    """The bench steps of every cell: single-stream, then a concurrency sweep. Defaults are `servelab bench`'s."""

    single_requests: int = Field(8, ge=1)
    # Before each bench of a trial: auto (the bench's highest concurrency at once, capped by the server's slots,
    # then one alone: bench/warmup.py), or N requests one at a time (0: none).
    warmup: Annotated[int, Field(ge=0)] | Literal["auto"] = "auto"
    max_tokens: int = Field(128, ge=1)
    temperature: float = Field(0.0, ge=0)
    ignore_eos: bool = True
    endpoint: Literal["chat", "completions"] = "chat"
    level_duration_s: float = Field(10.0, gt=0)
    max_concurrency: int = Field(32, ge=1)
    sweep: bool = True  # False: single-stream only
    # The error gate (bench/failures.py error_gate; docs/metrics.md#errors): a cell fails when a level's share of
    # failed requests is above this; None: only when every request of a level failed.
    max_error_rate: float | None = Field(None, ge=0, le=1)
    # The steady-state rule of the sweep's levels (docs/metrics.md#steady-state): N completed requests in the
    # window, a window of at least K x their E2E p50.
    min_requests: int = Field(10, ge=1)
    latency_multiple: float = Field(3.0, ge=0)
    # A multi-turn level in place of the sweep (issue 16): conversations whose history grows turn by turn.
    multiturn: MultiturnSettings | None = None
    # The sweep sent from worker processes (issue 15; docs/metrics.md#clocks): a number, or "auto"; with `ray`
    # ("auto" or a Ray cluster's address) as Ray actors. None: the bench process sends, as before.
    workers: int | Literal["auto"] | None = Field(None)
    ray: str | None = None

    def options(self, model: str | None) -> tuple[BenchOptions, BenchOptions | None]:
        from servelab.bench.options import check_ray
        from servelab.bench.workers import parse_workers

        workload = Workload(endpoint=ENDPOINTS[self.endpoint], max_tokens=self.max_tokens,
                            temperature=self.temperature, ignore_eos=self.ignore_eos)
        warmup = None if self.warmup == "auto" else self.warmup
        single = BenchOptions(mode="single", model=model, workload=workload, single_requests=self.single_requests,
                              warmup=warmup, max_error_rate=self.max_error_rate)
        steady = SteadyRule(min_completed=self.min_requests, latency_multiple=self.latency_multiple)
        sweep = BenchOptions(mode="sweep", model=model, workload=workload, warmup=warmup,
                             level_duration_s=self.level_duration_s, max_concurrency=self.max_concurrency,
                             max_error_rate=self.max_error_rate, steady=steady,
                             workers=parse_workers(self.workers), ray=check_ray(self.ray, self.workers))
        if self.multiturn is not None:
            from servelab.bench.plans import LoadPlan
            from servelab.bench.workloads import OutputSpec

            output = OutputSpec(max_tokens=self.max_tokens, ignore_eos=self.ignore_eos, temperature=self.temperature)
            sweep = dataclasses.replace(sweep, mode="multiturn", workload=self.multiturn.workload(output),
                                        plan=LoadPlan(concurrency=self.multiturn.users))
        return single, sweep if self.sweep else None


class VerifySettings(Strict):
    enabled: bool = True
    only: list[str] | None = None  # check ids; None: every registered check
    skip: list[str] = Field(default_factory=list)
    check_timeout_s: float = Field(30.0, gt=0)


def _overrides(model: type[BaseModel]) -> type[BaseModel]:
    """The same fields, each optional (None: not overridden), with the same constraints."""
    fields: dict[str, Any] = {}
    for name, f in model.model_fields.items():
        inner = Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation
        fields[name] = (Optional[inner], None)  # noqa: UP045
    return create_model(f"{model.__name__}Overrides", __config__=ConfigDict(extra="forbid"), **fields)


BenchOverrides = _overrides(BenchSettings)
VerifyOverrides = _overrides(VerifySettings)


class Cell(EngineSpec):
    """One configuration to measure: launch `engine` with `model` (EngineSpec's fields), or measure `url`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    engine: str | None = None  # type: ignore[assignment]  # optional here: a URL cell has no engine
    model: str | None = None  # type: ignore[assignment]  # a URL cell: the model id to request (default: the first)
    url: str | None = None
    bench: BenchOverrides = Field(default_factory=BenchOverrides)  # type: ignore[valid-type]
    verify: VerifyOverrides = Field(default_factory=VerifyOverrides)  # type: ignore[valid-type]

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, value: str | None) -> str | None:
        if value is not None and value.lower() not in REGISTRY:
            raise ValueError(f"unknown engine '{value}' (known: {', '.join(sorted(REGISTRY))})")
        return value.lower() if value else value

    @model_validator(mode="after")
    def _engine_or_url(self) -> Cell:
        if (self.engine is None) == (self.url is None):
            raise ValueError("a cell needs either `engine` (a server to launch) or `url` (one already running), "
                             "not both")
        if self.engine is not None and not self.model:
            raise ValueError("a cell that launches an engine needs `model`")
        return self

    def spec(self) -> EngineSpec | None:
        if self.engine is None:
            return None
        return EngineSpec(**self.model_dump(include=set(EngineSpec.model_fields)))


class Experiment(Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    bench: BenchSettings = Field(default_factory=BenchSettings)
    verify: VerifySettings = Field(default_factory=VerifySettings)
    ready_timeout_s: float = Field(600.0, gt=0)
    # Each cell is measured this many times, the trials of different cells alternating in `order`
    # (experiment/schedule.py); verdicts need the trials to agree (docs/metrics.md#trials).
    trials: int = Field(1, ge=1, le=100)
    order: Literal["interleaved", "shuffled", "blocked"] = "interleaved"
    # A busy machine: contended trials stopped early and run again once it is quiet, or the experiment stopped
    # with the reason (experiment/contention.py).
    contention: ContentionPolicy = Field(default_factory=ContentionPolicy)
    seed: int = 0  # the shuffled order's seed
    # all-up: every cell's server is started once and kept up while the trials alternate (no reload between
    # trials; needs room for all of them at once). one-at-a-time: a cell's server runs only during its own
    # trials, so interleaving reloads it for every trial (or choose order: blocked). URL cells are always up.
    servers: Literal["one-at-a-time", "all-up"] = "one-at-a-time"
    # The reference every cell is compared to: a cell's name or a key of `baselines`. Default: the first cell.
    baseline: str | None = None
    # Literal figures from elsewhere (no records, so no confidence interval), e.g. {vllm: {single.decode_tok_s: 82.5}}
    baselines: dict[str, dict[str, float]] = Field(default_factory=dict)
    cells: list[Cell] = Field(min_length=1)

    @model_validator(mode="after")
    def _names(self) -> Experiment:
        seen: set[str] = set()
        for cell in self.cells:
            if cell.name in seen:
                raise ValueError(f"two cells are named '{cell.name}': cell names must be unique")
            seen.add(cell.name)
        clash = seen & set(self.baselines)
        if clash:
            raise ValueError(f"'{sorted(clash)[0]}' names both a cell and a literal baseline")
        if self.baseline is not None and self.baseline not in seen | set(self.baselines):
            raise ValueError(f"baseline '{self.baseline}' is neither a cell nor a key of `baselines`")
        return self

    def bench_for(self, cell: Cell) -> BenchSettings:
        return BenchSettings.model_validate({**self.bench.model_dump(), **cell.bench.model_dump(exclude_none=True)})

    def verify_for(self, cell: Cell) -> VerifySettings:
        return VerifySettings.model_validate({**self.verify.model_dump(),
                                              **cell.verify.model_dump(exclude_none=True)})

    def cell_key(self, cell: Cell) -> str:
        """What makes a cell's result what it is: its definition and the settings it was measured with. A change
        to any of them is a different cell (run again on resume); the same definition is the same cell."""
        doc = {"cell": cell.model_dump(exclude={"bench", "verify"}), "bench": self.bench_for(cell).model_dump(),
               "verify": self.verify_for(cell).model_dump(), "ready_timeout_s": self.ready_timeout_s}
        if self.trials > 1:  # one trial keeps the keys of files written before trials existed
            doc["trials"] = self.trials
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def with_bench_overrides(experiment: Experiment, overrides: dict[str, Any]) -> Experiment:
    """The experiment with command-line bench settings (None: not given) applied to every cell, winning over the
    file's settings and over a cell's own overrides."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if not given:
        return experiment
    doc = experiment.model_dump(exclude_none=True)
    doc["bench"] = {**doc.get("bench", {}), **given}
    for cell in doc["cells"]:
        cell["bench"] = {k: v for k, v in cell.get("bench", {}).items() if k not in given}
    return Experiment.model_validate(doc)
