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

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, create_model, field_validator,
                      model_validator)

from servelab.bench.args import BenchArgs
from servelab.bench.runner import BenchOptions
from servelab.bench.steady import SteadyRule
from servelab.bench.workload import Workload
from servelab.engines import REGISTRY, EngineSpec
from servelab.experiment.contention import ContentionPolicy

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses",
             "messages": "/v1/messages"}  # streamed: protocol/dialects/
_VALID_STEPS: set[str] = set()  # steps (with the settings they were checked under) already found valid


def from_experiment_dir(path: str, info: ValidationInfo) -> str:
    """A file an experiment names, found from the experiment file's directory when it is relative (as a compose
    file's paths are), so `servelab run some/dir/exp.yaml` works from anywhere."""
    from pathlib import Path

    base = (info.context or {}).get("base_dir")
    if base is None or Path(path).expanduser().is_absolute():
        return path
    return str(Path(base) / Path(path).expanduser())


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

    @field_validator("dataset")
    @classmethod
    def _from_the_experiments_directory(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else from_experiment_dir(value, info)

    def workload(self, output):
        from pathlib import Path

        from servelab.bench.workloads.multi import build_multi_workload

        args = BenchArgs(mode="multiturn", users=self.users, think_time=self.think_time, history=self.history,
                         conversations=self.conversations, endpoint="chat",
                         dataset=Path(self.dataset) if self.dataset else None)
        if self.dataset is None:
            args.turns, args.input_tokens, args.prefix_tokens = self.turns, str(self.input_tokens), self.prefix_tokens
        return build_multi_workload(args, output)


# A step's options are `servelab bench`'s (BenchArgs' fields, `-` or `_` alike), but for these: the mode is the
# step's `mode`, the model is the cell's, and a key stays in the environment, not in a file.
STEP_NOT_OPTIONS = ("mode", "model", "api_key")
STEP_KEYS = ("name", "trace", *(f.name for f in dataclasses.fields(BenchArgs) if f.name not in STEP_NOT_OPTIONS))


class BenchStep(BaseModel):
    """One bench step of a trial: `mode` (any of `servelab bench --mode`) and that mode's options, named as
    `servelab bench` names them (`slo`, `rate`, `max_rate`, `requests`, `duration`, `dataset`, …; `trace` is the
    replay's trace file). `name` tells two steps apart in results (default: the mode). A bare word is a step
    without options: `single`, `sweep` (the experiment's own single-stream and sweep settings), or any mode."""

    model_config = ConfigDict(extra="allow")

    mode: str
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _bare_word(cls, data: Any) -> Any:
        return {"mode": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _known_options(self) -> BenchStep:
        from servelab.bench.options import MODES

        if self.mode not in MODES:
            raise ValueError(f"unknown mode '{self.mode}' (modes: {', '.join(MODES)})")
        for key in self.options:
            if key.replace("-", "_") not in STEP_KEYS:
                raise ValueError(f"unknown option '{key}' of a {self.mode} step (misspelt?); a step takes "
                                 f"`servelab bench`'s options: {', '.join(k for k in STEP_KEYS if k != 'name')}")
        if "trace" in self.options and self.mode != "replay":
            raise ValueError(f"`trace` is the replay's trace file; a {self.mode} step takes `dataset`")
        return self

    @model_validator(mode="after")
    def _files_from_the_experiments_directory(self, info: ValidationInfo) -> BenchStep:
        for key in ("trace", "dataset"):
            value = (self.model_extra or {}).get(key)
            if isinstance(value, str):
                self.model_extra[key] = from_experiment_dir(value, info)
        return self

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    @property
    def step_name(self) -> str:
        return self.name or self.mode

    @property
    def plain(self) -> bool:
        """A bare `single` or `sweep`: the experiment's own settings, exactly as without `steps`."""
        return self.mode in ("single", "sweep") and not self.options

    def tag_family(self) -> str:
        """Which level tags this step's levels take (single, c<N>, r<R>, u<N>, trace): a trial's records say their
        level's tag, not their step, so two steps of a trial may not share a family."""
        opts = {k.replace("-", "_"): v for k, v in self.options.items()}
        if self.mode == "single":
            return "single"
        if self.mode == "replay":
            return "trace"
        if self.mode == "multiturn":
            return "r<rate>" if opts.get("rate") is not None else "u<users>"
        if self.mode in ("sweep", "concurrency") or (self.mode == "slo-search"
                                                     and opts.get("search") == "concurrency"):
            return "c<concurrency>"
        if self.mode in ("rate", "rate-sweep", "slo-search"):
            return "r<rate>"
        return f"{self.mode}'s"  # a mode of its own tags (burst: b<N>)

    def bench_args(self, settings: BenchSettings, model: str | None) -> BenchArgs:
        """The step as `servelab bench` would have been given it, the experiment's shared settings (max_tokens,
        endpoint, warm-up, error gate, steady-state rule, workers) filling what the step does not say."""
        from pathlib import Path

        from pydantic import TypeAdapter, ValidationError

        from servelab.bench.args import as_command_text

        opts = {k.replace("-", "_"): v for k, v in self.options.items()}
        if "trace" in opts:
            opts["dataset"] = opts.pop("trace")
        opts = as_command_text(opts)  # rate 4, [1, 2, 4], slo {ttft_p99_ms: 500}: as on the command line
        if isinstance(opts.get("dataset"), str):
            opts["dataset"] = Path(opts["dataset"])
        defaults: dict[str, Any] = {
            "max_tokens": settings.max_tokens, "ignore_eos": settings.ignore_eos,
            "endpoint": None if self.mode == "replay" else settings.endpoint,
            "warmup": settings.warmup, "max_error_rate": settings.max_error_rate,
            "workers": None if settings.workers is None else str(settings.workers), "ray": settings.ray}
        if self.mode == "single":
            defaults["requests"] = settings.single_requests
        else:
            defaults["min_requests"] = settings.min_requests
        if self.mode == "sweep":
            defaults["max_concurrency"] = settings.max_concurrency
        try:
            return TypeAdapter(BenchArgs).validate_python({**defaults, **opts, "mode": self.mode, "model": model})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{self.step_name} step: {where}: {first['msg']}") from None

    def bench_options(self, settings: BenchSettings, model: str | None) -> BenchOptions:
        """The step's BenchOptions, built by `servelab bench`'s own rules (bench/options.py)."""
        from servelab.bench.options import build_options
        from servelab.errors import UserError

        opts = build_options(self.bench_args(settings, model))
        if self.mode == "slo-search" and not opts.plan.slos:
            raise UserError("an slo-search step needs latency targets", hint="e.g. slo: ttft_p99_ms=500,itl_p99_ms=50")
        if "duration" not in {k.replace("-", "_") for k in self.options}:
            opts.level_duration_s = settings.level_duration_s
        opts.steady = dataclasses.replace(opts.steady, latency_multiple=settings.latency_multiple)
        opts.workload = _with_temperature(opts.workload, settings.temperature)
        return opts


def _with_temperature(workload, temperature: float):
    """The workload sampling at `temperature` (the experiment's; `servelab bench` has no such option)."""
    if not temperature or not dataclasses.is_dataclass(workload):
        return workload
    names = {f.name for f in dataclasses.fields(workload)}
    if "temperature" in names:
        return dataclasses.replace(workload, temperature=temperature)
    if "output" in names and dataclasses.is_dataclass(workload.output):
        return dataclasses.replace(workload, output=dataclasses.replace(workload.output, temperature=temperature))
    return workload


class BenchSettings(Strict):
    """The bench steps of every cell: by default single-stream, then a concurrency sweep (`steps` says otherwise).
    Defaults are `servelab bench`'s."""

    single_requests: int = Field(8, ge=1)
    # Before each bench of a trial: auto (the bench's highest concurrency at once, capped by the server's slots,
    # then one alone: bench/warmup.py), or N requests one at a time (0: none).
    warmup: Annotated[int, Field(ge=0)] | Literal["auto"] = "auto"
    max_tokens: int = Field(128, ge=1)
    temperature: float = Field(0.0, ge=0)
    ignore_eos: bool = True
    endpoint: Literal["chat", "completions", "responses", "messages"] = "chat"
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
    # A trial's bench steps in order (BenchStep): e.g. [single, {mode: slo-search, slo: "ttft_p99_ms=500"},
    # {mode: replay, trace: FILE}]. None: single, then the sweep (or the multiturn level in its place); with
    # `sweep: false`, single alone.
    steps: list[BenchStep] | None = Field(None, min_length=1)

    @field_validator("steps")
    @classmethod
    def _steps_apart(cls, steps: list[BenchStep] | None, info: ValidationInfo) -> list[BenchStep] | None:
        """Step names unique, no two steps whose levels share tags, and each step's options valid as `servelab
        bench` would judge them (checked here, so a bad option is an error of the file, before anything runs)."""
        from types import SimpleNamespace

        from servelab.errors import UserError

        names: dict[str, int] = {}
        families: dict[str, int] = {}
        shared = [name for name in cls.model_fields if name != "steps"]
        # The settings the steps are checked under (the fields before `steps`); one that failed to validate has
        # its own error, so the steps' options are not built without it.
        settings = SimpleNamespace(**info.data) if all(n in info.data for n in shared) else None
        for i, step in enumerate(steps or []):
            if step.step_name in names:
                raise ValueError(f"steps {names[step.step_name] + 1} and {i + 1} are both named "
                                 f"'{step.step_name}': give one a `name`")
            names[step.step_name] = i
            family = step.tag_family()
            if family in families:
                raise ValueError(f"steps {families[family] + 1} and {i + 1} ({steps[families[family]].mode}, "
                                 f"{step.mode}) both run levels tagged {family}: a trial's records could not be told "
                                 f"apart; run them in different experiments")
            families[family] = i
            if settings is None or step.plain or (step.mode == "multiturn" and not step.options
                                                  and settings.multiturn is not None):
                continue
            key = json.dumps([step.model_dump(mode="json"), {n: info.data[n] for n in shared}], sort_keys=True,
                             default=str)
            if key in _VALID_STEPS:
                continue
            try:
                step.bench_options(settings, None)  # type: ignore[arg-type]
            except UserError as exc:
                raise ValueError(f"step {i + 1} ({step.step_name}): {exc.message}"
                                 + (f" ({exc.hint})" if exc.hint else "")) from None
            _VALID_STEPS.add(key)
        return steps

    def step_options(self, model: str | None) -> list[tuple[str, BenchOptions]]:
        """A trial's bench steps, in order, as (name, options)."""
        single, sweep = self.options(model)
        if self.steps is None:
            if sweep is None:
                return [("single", single)]
            return [("single", single), ("multiturn" if self.multiturn is not None else "sweep", sweep)]
        out: list[tuple[str, BenchOptions]] = []
        for step in self.steps:
            if step.mode == "single" and step.plain:
                out.append((step.step_name, single))
            elif step.mode == "sweep" and step.plain:
                plain_sweep = self.model_copy(update={"multiturn": None, "sweep": True}).options(model)[1]
                out.append((step.step_name, plain_sweep))  # type: ignore[arg-type]
            elif step.mode == "multiturn" and not step.options and self.multiturn is not None:
                out.append((step.step_name, self.model_copy(update={"sweep": True}).options(model)[1]))
            else:
                out.append((step.step_name, step.bench_options(self, model)))
        return out

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


def _where(value: str | None) -> str | None:
    if value is not None:
        from servelab.remote.placement import RayPlacement, parse_on

        try:
            where = parse_on(value)
        except Exception as exc:  # UserError: its message names what is wrong
            raise ValueError(str(exc)) from None
        # A Ray placement as Ray spells it (`ray: gpu = 8` is `ray:GPU=8`): one placement, one cell key and one
        # ran_on however it was written. An ssh:// URL is kept as written, so that the keys of cells written
        # before Ray placements existed stay what they were.
        if isinstance(where, RayPlacement):
            return str(where)
    return value


# Where a cell runs: ssh://[user@]host[:port], or a Ray node by resources, ray:GPU=8[,CPU=4…]
# (servelab/remote/); None for here. Not Ray itself: the file is checked where Ray is not installed.
OnWhere = Annotated[Optional[str], AfterValidator(_where)]


class Cell(EngineSpec):
    """One configuration to measure: launch `engine` with `model` (EngineSpec's fields), or measure `url`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    engine: str | None = None  # type: ignore[assignment]  # optional here: a URL cell has no engine
    model: str | None = None  # type: ignore[assignment]  # a URL cell: the model id to request (default: the first)
    url: str | None = None
    # ssh://[user@]host[:port] or ray:GPU=8…: the cell runs on that host, or on a Ray node that has those
    # resources, held for the cell's trials (servelab/remote/cell.py), as `--on` does; None: the
    # experiment's `on`, else here. A `url` is then as that host sees it. (`host` is EngineSpec's: the interface
    # the engine binds.)
    on: OnWhere = None
    # With `on:`: an interpreter there that has servelab (default `servelab` on its PATH), and the root of its job
    # directories (default ~/.servelab/remote), as --remote-python and --remote-dir; None: the experiment's.
    # How the cell is reached, not what it measures: outside its cell key.
    remote_python: str | None = Field(None, min_length=1)
    remote_dir: str | None = Field(None, min_length=1)
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


# Where a cell runs and how it is reached there: not sent to the far side, which runs the cell where it is
REACHED_BY = {"on", "remote_python", "remote_dir"}


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
    # Empty the server's prefix cache before each trial where the engine has an endpoint for it (bench/cache_reset.py),
    # so one trial's prompts (and the shared system prompt) are not cached for the next; each trial records it.
    cache_reset: bool = True
    # The reference every cell is compared to: a cell's name or a key of `baselines`. Default: the first cell.
    baseline: str | None = None
    # Literal figures from elsewhere (no records, so no confidence interval), e.g. {vllm: {single.decode_tok_s: 82.5}}
    baselines: dict[str, dict[str, float]] = Field(default_factory=dict)
    # Where cells run unless they say otherwise: ssh://[user@]host[:port], ray:GPU=8…, or None for here.
    on: OnWhere = None
    remote_python: str | None = Field(None, min_length=1)  # every remote cell's, unless it names its own
    remote_dir: str | None = Field(None, min_length=1)
    cells: list[Cell] = Field(min_length=1)


    def host_of(self, cell: Cell) -> str | None:
        return cell.on or self.on

    def reached_by(self, cell: Cell) -> tuple[str | None, str | None]:
        """(remote_python, remote_dir) for a cell run elsewhere: its own, else the experiment's."""
        return cell.remote_python or self.remote_python, cell.remote_dir or self.remote_dir

    def one_cell_there(self, cell: Cell) -> dict[str, Any]:
        """The experiment file the far side runs for `cell`: this one with that cell alone, run where it is."""
        doc = self.model_dump(mode="json", exclude={"cells", *REACHED_BY, "baseline", "baselines"})
        doc["cells"] = [cell.model_dump(mode="json", exclude=REACHED_BY, exclude_none=True)]
        return doc

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
        for cell in self.cells:
            given = [name for name in ("remote_python", "remote_dir") if getattr(cell, name) is not None]
            if given and self.host_of(cell) is None:
                raise ValueError(f"cell '{cell.name}' sets {given[0]} but runs here: it applies to a cell with "
                                 f"`on:` (its own or the experiment's)")
        return self

    def bench_for(self, cell: Cell) -> BenchSettings:
        return BenchSettings.model_validate({**self.bench.model_dump(), **cell.bench.model_dump(exclude_none=True)})

    def verify_for(self, cell: Cell) -> VerifySettings:
        return VerifySettings.model_validate({**self.verify.model_dump(),
                                              **cell.verify.model_dump(exclude_none=True)})

    def cell_key(self, cell: Cell) -> str:
        """What makes a cell's result what it is: its definition and the settings it was measured with. A change
        to any of them is a different cell (run again on resume); the same definition is the same cell."""
        bench = self.bench_for(cell).model_dump()
        if bench["steps"] is None:  # the default steps keep the keys of files written before steps existed
            del bench["steps"]
        doc = {"cell": cell.model_dump(exclude={"bench", "verify", *REACHED_BY}), "bench": bench,
               "verify": self.verify_for(cell).model_dump(), "ready_timeout_s": self.ready_timeout_s}
        if self.trials > 1:  # one trial keeps the keys of files written before trials existed
            doc["trials"] = self.trials
        if not self.cache_reset:  # on, the default, keeps the keys of files written before it existed
            doc["cache_reset"] = False
        if self.host_of(cell) is not None:  # here, the default, keeps the keys of files written before `on`
            doc["on"] = self.host_of(cell)
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
