"""N simultaneous streams must all run to a proper end.

This catches servers that end running streams when a new request arrives: llama-cpp-python's default
`interrupt_requests=True` stops the running stream with [DONE] but no finish_reason as soon as another request
waits (shared/research/env.md §1), so concurrent benchmarks silently measure truncated outputs."""

from __future__ import annotations

import asyncio
import json

from servelab.verify.checks.common import (StreamReading, chat_body, quoted, read_chat_stream, send_stream,
                                           usage_counts)
from servelab.verify.checks.registry import CheckContext, CheckVerdict, Evidence, Findings, check
from servelab.verify.http import BadResponse, StreamReply, one_line

CONCURRENCY_PROMPT = "Write a long story about a robot who learns to paint."
CONCURRENCY_MAX_TOKENS = 32


@check("concurrency", "Simultaneous streams all complete, each with its finish_reason and framing")
async def concurrency(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    body = chat_body(ctx.model, CONCURRENCY_PROMPT, CONCURRENCY_MAX_TOKENS, stream=True)
    evidence.request = body
    outcomes = await asyncio.gather(*(send_stream(ctx, None, body) for _ in range(ctx.concurrency)),
                                    return_exceptions=True)
    findings = Findings()
    replies: list[tuple[int, StreamReply, StreamReading]] = []
    for number, outcome in enumerate(outcomes, 1):
        if isinstance(outcome, BadResponse):
            findings.fail(f"stream {number}: {outcome}")
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            replies.append((number, outcome, read_chat_stream([e.data for e in outcome.events])))
    for number, reply, reading in replies:
        judge_one(number, reply, reading, findings)
    judge_done(replies, findings)
    judge_lengths(replies, findings)
    if replies:
        shortest = min(replies, key=lambda r: len(r[2].text))
        evidence.response_excerpt = (f"stream {shortest[0]} of {ctx.concurrency} (the shortest): "
                                     + one_line(shortest[1].raw.decode("utf-8", errors="replace"), 440))
    complete = sum(1 for _, _, reading in replies if reading.finishes)
    return findings.verdict(f"{complete} of {ctx.concurrency} streams reached a finish_reason"
                            + overlap_note(replies))


def judge_one(number: int, reply: StreamReply, reading: StreamReading, findings: Findings) -> None:
    where = f"stream {number}"
    if reply.disconnect:
        findings.fail(f"{where}: the connection closed early ({reply.disconnect}) after {len(reply.events)} events")
    for error in reading.errors:
        findings.fail(f"{where}: in-band error {error}")
    if reading.not_json:
        findings.fail(f"{where}: {len(reading.not_json)} event(s) are not JSON")
    if not reading.finishes:
        findings.fail(f"{where} ended without a finish_reason after {len(reading.chunks)} chunks, text "
                      f"{quoted(reading.text, 40)}" + (" and [DONE]" if reading.done_seen else ""))
    elif len(reading.finishes) > 1:
        findings.fail(f"{where}: finish_reason arrived {len(reading.finishes)} times")
    elif not reading.text.strip() and not reading.reasoning.strip():
        findings.fail(f"{where}: finished ({reading.finishes[0]}) with no text")


def judge_done(replies: list[tuple[int, StreamReply, StreamReading]], findings: Findings) -> None:
    without = [number for number, _, reading in replies if not reading.done_seen]
    if without and len(without) == len(replies):
        findings.warn("no stream ended with [DONE] (the server never sends it: see chat_stream)")
    elif without:
        findings.fail(f"stream(s) {', '.join(map(str, without))} ended without [DONE] while the others had it")


def judge_lengths(replies: list[tuple[int, StreamReply, StreamReading]], findings: Findings) -> None:
    """The same request N times: a stream that 'stopped' far shorter than the others may have been cut short."""
    tokens = {number: counts[1] for number, _, reading in replies
              if reading.finishes and (counts := usage_counts(reading.usage))}
    finishes = {number: reading.finishes[0] for number, _, reading in replies if reading.finishes}
    if not tokens or "length" not in finishes.values():
        return
    for number, finish in finishes.items():
        if finish == "stop" and number in tokens and tokens[number] < CONCURRENCY_MAX_TOKENS // 2:
            findings.warn(f"stream {number} stopped after {tokens[number]} tokens while another ran to "
                          f"max_tokens {CONCURRENCY_MAX_TOKENS}")


def overlap_note(replies: list[tuple[int, StreamReply, StreamReading]]) -> str:
    """Whether the server generated the streams side by side or one after another (both are correct). Judged by
    when text arrived, not when the response began: a queueing server may send headers and a role chunk at once."""
    spans = sorted(span for _, reply, _ in replies if (span := text_span(reply)) is not None)
    if len(spans) < 2:
        return ""
    overlapped = any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:]))
    return "; the streams ran side by side" if overlapped else "; the server ran the streams one after another"


def text_span(reply: StreamReply) -> tuple[float, float] | None:
    """From the first to the last event that carried text."""
    times = [at for event, at in zip(reply.events, reply.event_times) if carries_text(event.data)]
    return (times[0], times[-1]) if times else None


def carries_text(data: str) -> bool:
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        return False
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    return isinstance(choices, list) and any(
        isinstance(c, dict) and isinstance(c.get("delta"), dict) and bool(c["delta"].get("content")) for c in choices)
