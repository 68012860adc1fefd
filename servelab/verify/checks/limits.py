"""Generation limits the server must honour: max_tokens and stop sequences."""

from __future__ import annotations

import re

from servelab.verify.checks.common import (chat_body, describe_difference, quoted, read_chat_stream,
                                           send_chat, send_stream, usage_counts)
from servelab.verify.checks.registry import CheckContext, CheckVerdict, Evidence, Findings, check, skip

# A prompt a model answers at length, so that the limit, not the model, ends the answer.
LONG_PROMPT = "Write a long story about a robot who learns to paint."
LIMIT_MAX_TOKENS = 8
STOP_BASE_TOKENS = 24


@check("max_tokens", "max_tokens is honoured: finish_reason length, completion_tokens == max_tokens")
async def max_tokens_honoured(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    findings = Findings()
    answer = await send_chat(ctx, evidence, chat_body(ctx.model, LONG_PROMPT, LIMIT_MAX_TOKENS))
    judge_limit(answer.finish_reason, answer.usage, "plain", findings)

    stream = await send_stream(ctx, None, chat_body(ctx.model, LONG_PROMPT, LIMIT_MAX_TOKENS, stream=True))
    reading = read_chat_stream([event.data for event in stream.events])
    finish = reading.finishes[-1] if reading.finishes else None
    if reading.usage is None:
        if finish != "length":
            findings.fail(f"streamed: finish_reason is {finish!r}, expected 'length'")
        findings.note("streamed: no usage to count")
    else:
        judge_limit(finish, reading.usage, "streamed", findings)
    return findings.verdict(f"max_tokens {LIMIT_MAX_TOKENS}: {quoted(answer.text)}")


def judge_limit(finish_reason: object, usage: object, where: str, findings: Findings) -> None:
    counts = usage_counts(usage)
    completion = counts[1] if counts else None
    if completion is None:
        findings.fail(f"{where}: no integer usage.completion_tokens to compare with max_tokens")
    elif completion > LIMIT_MAX_TOKENS:
        findings.fail(f"{where}: {completion} completion tokens, more than max_tokens {LIMIT_MAX_TOKENS}")
    if finish_reason == "length":
        if completion is not None and completion < LIMIT_MAX_TOKENS:
            findings.fail(f"{where}: finish_reason 'length' after {completion} tokens, below max_tokens "
                          f"{LIMIT_MAX_TOKENS}")
    elif finish_reason == "stop" and completion is not None and completion < LIMIT_MAX_TOKENS:
        findings.warn(f"{where}: the model stopped by itself after {completion} tokens, before the limit")
    else:
        findings.fail(f"{where}: finish_reason is {finish_reason!r}, expected 'length'")


# ---- stop --------------------------------------------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z]{4,}")


def pick_stop(text: str) -> str | None:
    """A word from the middle of `text` (not its first two words), so that stopping there leaves some text."""
    words = list(_WORD.finditer(text))
    for match in words[2:]:
        if match.start() >= 8:
            return match.group()
    return None


@check("stop", "Stop sequences end the answer and are not emitted, plain and streamed")
async def stop_sequences(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    base = await send_chat(ctx, evidence, chat_body(ctx.model, LONG_PROMPT, STOP_BASE_TOKENS))
    stop = pick_stop(base.text)
    if stop is None:
        return skip(f"the unstopped answer has no word to stop at: {quoted(base.text)}")
    expected = base.text[:base.text.find(stop)]
    findings = Findings()
    stopped = await send_chat(ctx, evidence, chat_body(ctx.model, LONG_PROMPT, STOP_BASE_TOKENS, stop=[stop]))
    judge_stopped(stopped.text, stopped.finish_reason, stop, expected, "plain", findings)

    stream = await send_stream(ctx, None, chat_body(ctx.model, LONG_PROMPT, STOP_BASE_TOKENS, stream=True,
                                                    stop=[stop]))
    reading = read_chat_stream([event.data for event in stream.events])
    judge_stopped(reading.text, reading.finishes[-1] if reading.finishes else None, stop, expected, "streamed",
                  findings)
    return findings.verdict(f"stop {quoted(stop)}: {quoted(stopped.text)}")


def judge_stopped(text: str, finish_reason: object, stop: str, expected: str, where: str,
                  findings: Findings) -> None:
    if stop in text:
        findings.fail(f"{where}: the stop sequence {quoted(stop)} was emitted at character {text.find(stop)}")
    elif text != expected:
        leaked = next((stop[:k] for k in range(len(stop) - 1, 0, -1) if text.endswith(stop[:k])), "")
        if leaked and text[:-len(leaked)] == expected:
            findings.fail(f"{where}: the start of the stop sequence, {quoted(leaked)}, was emitted")
        elif len(text) > len(expected) + len(stop):
            findings.fail(f"{where}: the answer ran past where the stop sequence was due "
                          + describe_difference(text, expected, "got", "expected"))
        else:
            # Temperature-0 text may vary a little between requests; that is the determinism checks' business.
            findings.warn(f"{where}: the answer is not the unstopped answer cut at the stop sequence "
                          + describe_difference(text, expected, "got", "expected"))
    if finish_reason != "stop":
        findings.fail(f"{where}: finish_reason is {finish_reason!r}, expected 'stop'")


