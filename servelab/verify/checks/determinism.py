"""Temperature-0 determinism: the same request gives the same text, one after another and side by side.

Sequential repeats on one server have no excuse to differ (a difference means temperature 0 is not greedy).
Concurrent ones may: batching changes the arithmetic on many engines (shared/research/env.md: transformers with
continuous batching gave 4 distinct texts out of 8), so that is reported as a warning with the count."""

from __future__ import annotations

import asyncio
import json

from servelab.verify.checks.common import (ChatAnswer, chat_body, describe_difference, distinct_texts, quoted,
                                           send_chat)
from servelab.verify.checks.registry import CheckContext, CheckVerdict, Evidence, Findings, check
from servelab.verify.http import excerpt

DETERMINISM_PROMPT = "Write a short poem about the sea."
DETERMINISM_MAX_TOKENS = 24
REPEATS = 3


async def sequential_text(ctx: CheckContext, evidence: Evidence) -> str:
    """The temperature-0 answer, from the determinism check when it ran, else asked for now."""
    if "determinism_text" not in ctx.facts:
        assert ctx.model is not None
        answer = await send_chat(ctx, evidence, chat_body(ctx.model, DETERMINISM_PROMPT, DETERMINISM_MAX_TOKENS))
        ctx.facts["determinism_text"] = answer.text
    return ctx.facts["determinism_text"]


@check("determinism", f"Temperature 0 gives the same text over {REPEATS} sequential repeats")
async def determinism(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    body = chat_body(ctx.model, DETERMINISM_PROMPT, DETERMINISM_MAX_TOKENS)
    texts = [(await send_chat(ctx, evidence, body)).text for _ in range(REPEATS)]
    ctx.facts["determinism_text"] = texts[0]
    findings = Findings()
    kinds = distinct_texts(texts)
    if len(kinds) > 1:
        findings.fail(f"{len(kinds)} distinct texts in {REPEATS} repeats; the first two differ "
                      + describe_difference(kinds[0], kinds[1], "one", "another"))
    return findings.verdict(f"{REPEATS} repeats: {quoted(texts[0])}")


@check("determinism_concurrent", "Temperature 0 under concurrency: the same text from simultaneous requests "
                                 "(a warning when not: batching may change it)")
async def determinism_concurrent(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    reference = await sequential_text(ctx, evidence)
    body = chat_body(ctx.model, DETERMINISM_PROMPT, DETERMINISM_MAX_TOKENS)
    evidence.request = body
    answers: list[ChatAnswer] = await asyncio.gather(*(send_chat(ctx, None, body) for _ in range(ctx.concurrency)))
    texts = [a.text for a in answers]
    kinds = distinct_texts(texts)
    evidence.response_excerpt = excerpt(" | ".join(f"{texts.count(k)}× {json.dumps(k, ensure_ascii=False)}"
                                                   for k in kinds))
    differing = sum(1 for t in texts if t != reference)
    findings = Findings()
    headline = f"{ctx.concurrency} simultaneous requests gave {len(kinds)} distinct text(s)"
    if differing:
        odd = next(t for t in texts if t != reference)
        findings.warn(f"{differing} of {ctx.concurrency} differ from the sequential answer "
                      + describe_difference(odd, reference, "concurrent", "sequential")
                      + " (batch composition can change temperature-0 output)")
    else:
        findings.note("all equal to the sequential answer")
    return findings.verdict(headline)
