"""The registry the checks live in, the context they share, and how a check states its verdict.

A check is one async function `(ctx, evidence) -> CheckVerdict`, registered with `@check(id, title)`; the runner
runs the registered checks in registration order (the import order in `checks/__init__.py`). A check records the
request body it sends and an excerpt of the answer in `evidence` *as it goes*, so that a check cut off by its deadline
still shows what happened. It fails by returning a fail CheckVerdict or by raising `CheckFailed` /
`http.BadResponse`; any other exception is a bug and propagates. A check returns a skip CheckVerdict when the server
lacks the feature it tests. (A CheckVerdict is one check's outcome; `records.Verdict` is a start-up's state.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from servelab.records import CheckOutcome, CheckResult

DEFAULT_CONCURRENCY = 4


class CheckFailed(Exception):
    """Raised by a check to fail with str(exc) as the reason."""


@dataclass
class Evidence:
    request: dict[str, Any] | None = None  # the body sent (None for a GET); the last or the telling one
    response_excerpt: str | None = None


@dataclass(frozen=True)
class CheckVerdict:
    outcome: CheckOutcome
    reason: str


@dataclass
class CheckContext:
    """What the checks of one run share. The API key is here only for the openai SDK check (which makes its own
    connection); every other request carries it in the session's default headers."""

    session: aiohttp.ClientSession
    base_url: str  # without /v1
    model: str | None
    api_key: str | None = field(default=None, repr=False)
    concurrency: int = DEFAULT_CONCURRENCY  # simultaneous requests in the concurrency checks
    check_timeout_s: float = 30.0  # the runner's deadline per check, for checks that split it among requests
    results: dict[str, CheckResult] = field(default_factory=dict)  # by check id, in run order
    chat_text: str | None = None  # the non-streamed temperature-0 answer from `chat`, for `chat_stream` to match
    # Facts about the server looked up once and shared (e.g. llama.cpp's /props, the tokenizer endpoint found).
    facts: dict[str, Any] = field(default_factory=dict)
    # Set by the runner: why the last check's deadline passed with the server silent ("first-byte", "idle"), and
    # the first bound a response went past (the SDK check, which reads with its own client, is skipped then).
    stall: str | None = None
    hostile: str | None = None


CheckFn = Callable[[CheckContext, Evidence], Awaitable[CheckVerdict]]


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    run: CheckFn
    needs_model: bool = True  # skipped when no model is known (none given, and none could be listed)


CHECKS: list[Check] = []


def check(check_id: str, title: str, *, needs_model: bool = True) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        if any(c.id == check_id for c in CHECKS):
            raise ValueError(f"duplicate check id {check_id!r}")
        CHECKS.append(Check(id=check_id, title=title, run=fn, needs_model=needs_model))
        return fn

    return register


class Findings:
    """Collects a check's fails, warnings and notes, so one run reports every problem rather than the first."""

    def __init__(self) -> None:
        self.fails: list[str] = []
        self.warns: list[str] = []
        self.notes: list[str] = []

    def fail(self, text: str) -> None:
        self.fails.append(text)

    def warn(self, text: str) -> None:
        self.warns.append(text)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def problem(self, text: str, *, strict: bool) -> None:
        """A fail where the check is strict about it, else a warning."""
        (self.fail if strict else self.warn)(text)

    def verdict(self, headline: str | None = None) -> CheckVerdict:
        outcome: CheckOutcome = "fail" if self.fails else "warn" if self.warns else "pass"
        parts = ([headline] if headline else []) + self.fails + self.warns + self.notes
        return CheckVerdict(outcome, "; ".join(parts) or "ok")


def skip(reason: str) -> CheckVerdict:
    return CheckVerdict("skip", reason)
