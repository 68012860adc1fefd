"""The registry the bench modes live in, and what a mode declares.

A mode is one class, registered with `@mode(name)`; the registry holds one instance of each, in registration order
(the import order in `modes/__init__.py`), and the runner (bench/runner.py) looks the run's mode up here instead of
branching on its name. A mode says what it needs before anything is sent (its validation, the streams and the
requests it plans, its warm-up's concurrency), how it describes its load in the result, which headline figures it
has, and runs its levels, each through the level runner (bench/levels.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from servelab.bench.loads import Target
from servelab.bench.plans import LoadPlan
from servelab.bench.sender import Sender
from servelab.bench.state import BenchOptions, RunState
from servelab.errors import UserError
from servelab.records import BenchResult, Figure


class Mode:
    name: ClassVar[str] = ""  # set by @mode
    # What load the mode offers, in a line (the CLI's --mode help says the same).
    description: ClassVar[str] = ""
    warmup_tag: ClassVar[str] = "warmup"  # the tag of its warm-up requests
    takes_slos: ClassVar[bool] = True  # latency targets (--slo) judge its levels

    def schedule_rates(self, plan: LoadPlan) -> list[float] | None:
        """The request rates its open-loop schedules may run at, to bound them before they are computed
        (bench/options.py check_schedule); not None also means `--max-concurrency` caps its requests in flight.
        None: the mode schedules no requests at a rate."""
        return None

    def validate(self, options: BenchOptions) -> None:
        """Refuse options the mode cannot run with (UserError), before anything is sent."""

    def peak_streams(self, options: BenchOptions) -> int | None:
        """The highest concurrency the plan uses (the auto warm-up's, bench/warmup.py); None: open loop, whose
        requests in flight only its `--max-concurrency` cap bounds, and it has none."""
        return options.plan.max_concurrency or None

    def most_streams(self, options: BenchOptions) -> int | None:
        """The most concurrent streams the bench may run, for --workers auto; None when the options do not say."""
        return options.plan.max_concurrency

    def streams_needed(self, options: BenchOptions) -> tuple[int, str] | None:
        """The most concurrent streams the options fix in advance, with the option that asks for them (the file
        descriptors are checked against it before anything is sent); None when only the levels know."""
        return None

    def planned_requests(self, options: BenchOptions) -> int | None:
        """How many requests the levels build, warm-up aside, when the plan fixes it (None: it depends on time)."""
        return None

    def describe_load(self, options: BenchOptions) -> dict[str, Any] | None:
        """The result's `workload.load_plan`; None: the mode has none (its levels say it all)."""
        return None

    def headline(self, result: BenchResult) -> dict[str, Figure]:
        """The mode's headline figures (bench/headline.py), keyed as baselines name them."""
        return {}

    async def run(self, state: RunState, client: Sender, target: Target) -> None:
        """Run the levels, each through bench/levels.py run_level, after the runner's warm-up."""
        raise NotImplementedError


MODES: dict[str, Mode] = {}

M = TypeVar("M", bound=type[Mode])


def mode(name: str) -> Callable[[M], M]:
    def register(cls: M) -> M:
        if name in MODES:
            raise ValueError(f"duplicate mode {name!r}")
        cls.name = name
        MODES[name] = cls()
        return cls

    return register


def get_mode(name: str) -> Mode:
    try:
        return MODES[name]
    except KeyError:
        raise UserError(f"unknown mode '{name}'", hint=f"use --mode {', '.join(MODES)}") from None
