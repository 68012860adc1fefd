"""Run the registered checks against one server, each under its own deadline, and collect a VerifyResult.

The order of events: validate the arguments, probe that the server accepts connections (a UserError if not, so
the CLI prints one line and exits 2), then run the checks in registry order. A check that fails, hangs past its
deadline or meets a broken server becomes a failed CheckResult and the run goes on; only bugs propagate.
"""

from __future__ import annotations

import asyncio
import time

from servelab.errors import UserError
from servelab.records import CheckResult, VerifyResult
from servelab.redaction import redact_text
from servelab.verify.checks import CHECKS, Check, CheckContext, CheckFailed, CheckVerdict, Evidence, discover_model
from servelab.verify.checks.registry import DEFAULT_CONCURRENCY
from servelab.net import check_credentials
from servelab.verify.http import BadResponse, ensure_reachable, new_session, normalize_base_url
from servelab.verify.transport import FLIGHTS, Flight, Overflow

STALLS_TO_STOP = 2  # checks in a row that reach their deadline with the server silent: the rest are skipped


def select_checks(only: list[str] | None, skip: list[str] | None) -> dict[str, str | None]:
    """For each registered check id, None if it runs, else why not. Unknown ids are a UserError."""
    known = [c.id for c in CHECKS]
    for name in (only or []) + (skip or []):
        if name not in known:
            raise UserError(f"unknown check '{name}'", hint=f"known checks: {', '.join(known)}")
    why_not: dict[str, str | None] = {}
    for check_id in known:
        if only and check_id not in only:
            why_not[check_id] = "not selected"
        elif skip and check_id in skip:
            why_not[check_id] = "skipped on request"
        else:
            why_not[check_id] = None
    return why_not


def stall_kind(flights: set[Flight], timeout_s: float) -> str | None:
    """At a deadline: "first-byte" when no request in flight had a byte of its answer, "idle" when every one had
    made no progress (its head, a complete event of a stream) for the last half of the deadline, else None."""
    if not flights:
        return None
    if all(f.first_byte_at is None for f in flights):
        return "first-byte"
    now = time.perf_counter()
    if all(now - (f.progress_at or f.first_byte_at or f.sent_at) >= timeout_s / 2 for f in flights):
        return "idle"
    return None


async def run_one(check: Check, ctx: CheckContext, timeout_s: float) -> CheckResult:
    evidence = Evidence()
    started = time.perf_counter()
    flights: set[Flight] = set()
    token = FLIGHTS.set(flights)
    ctx.stall = None
    try:
        async with asyncio.timeout(timeout_s):
            verdict = await check.run(ctx, evidence)
    except TimeoutError:
        ctx.stall = stall_kind(flights, timeout_s)
        verdict = CheckVerdict("fail", f"timed out after {timeout_s:g}s")
    except BadResponse as exc:
        verdict = CheckVerdict("fail", str(exc))
        evidence.response_excerpt = evidence.response_excerpt or exc.excerpt
        if isinstance(exc, Overflow) and ctx.hostile is None:
            ctx.hostile = str(exc)
    except CheckFailed as exc:
        verdict = CheckVerdict("fail", str(exc))
    finally:
        FLIGHTS.reset(token)
    # A server may echo the key it was sent (a 401 body): it never reaches the record or the terminal.
    secrets = (ctx.api_key,) if ctx.api_key else ()
    return CheckResult(id=check.id, title=check.title, outcome=verdict.outcome,
                       reason=redact_text(verdict.reason, secrets) or verdict.reason, request=evidence.request,
                       response_excerpt=redact_text(evidence.response_excerpt, secrets),
                       duration_ms=round((time.perf_counter() - started) * 1000, 1))


async def run_checks(url: str, model: str | None = None, only: list[str] | None = None,
                     skip: list[str] | None = None, check_timeout_s: float = 30.0, api_key: str | None = None,
                     concurrency: int = DEFAULT_CONCURRENCY) -> VerifyResult:
    """Verify the OpenAI-compatible server at `url` (with or without a trailing /v1).

    `model` defaults to the first one the server lists. `only` / `skip` take check ids (see `CHECKS`); checks not
    run appear with outcome "skip". `api_key` is sent as `Authorization: Bearer …` and recorded nowhere.
    `concurrency` is how many simultaneous requests the concurrency checks send. Raises UserError for bad
    arguments or a server that cannot be connected to.
    """
    if check_timeout_s <= 0:
        raise UserError(f"check timeout must be positive, got {check_timeout_s:g}s")
    if concurrency < 2:
        raise UserError(f"concurrency must be at least 2, got {concurrency}")
    base_url = normalize_base_url(url)
    check_credentials(base_url, api_key)
    why_not = select_checks(only, skip)
    await ensure_reachable(base_url)

    async with new_session(api_key) as session:
        ctx = CheckContext(session=session, base_url=base_url, model=model, api_key=api_key,
                           concurrency=concurrency, check_timeout_s=check_timeout_s)
        if ctx.model is None and why_not["models"] is not None:
            # The models check would have picked the model; do the same quietly, within the same deadline.
            flights: set[Flight] = set()
            token = FLIGHTS.set(flights)
            try:
                async with asyncio.timeout(check_timeout_s):
                    ctx.model = await discover_model(ctx)
            except TimeoutError:
                # the checks that need a model are then skipped, saying so
                ctx.stall = stall_kind(flights, check_timeout_s)
            finally:
                FLIGHTS.reset(token)
        stalls = [ctx.stall] if ctx.stall else []  # the deadlines reached in a row with the server silent
        stopped: str | None = None
        for check in CHECKS:
            reason = why_not[check.id]
            if reason is None and stopped is not None:
                reason = stopped
            if reason is None and check.needs_model and ctx.model is None:
                reason = "no model to ask for: none was given and none could be listed"
            if reason is not None:
                result = CheckResult(id=check.id, title=check.title, outcome="skip", reason=reason)
            else:
                result = await run_one(check, ctx, check_timeout_s)
                stalls = stalls + [ctx.stall] if ctx.stall else []
                if len(stalls) >= STALLS_TO_STOP:
                    stopped = stopped_reason(stalls, check_timeout_s)
            ctx.results[check.id] = result
    return VerifyResult(url=base_url, model=ctx.model, checks=list(ctx.results.values()))


def stopped_reason(stalls: list[str | None], timeout_s: float) -> str:
    if all(kind == "first-byte" for kind in stalls):
        what = f"reached the first-byte deadline of {timeout_s:g} s"
    else:
        what = f"reached the deadline of {timeout_s:g} s with the server silent (no byte, or no progress " \
               f"for {timeout_s / 2:g} s)"
    return f"the server stopped answering: {len(stalls)} requests in a row {what}"


def verify(url: str, model: str | None = None, only: list[str] | None = None, skip: list[str] | None = None,
           check_timeout_s: float = 30.0, api_key: str | None = None,
           concurrency: int = DEFAULT_CONCURRENCY) -> VerifyResult:
    """`run_checks` for callers without an event loop (the CLI). Not callable from inside a running loop."""
    return asyncio.run(run_checks(url, model=model, only=only, skip=skip, check_timeout_s=check_timeout_s,
                                  api_key=api_key, concurrency=concurrency))
