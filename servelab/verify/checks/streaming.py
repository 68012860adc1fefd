"""The SSE framing of a chat stream, strictly: what OpenAI clients and benchmark tools rely on, with output that
contains multi-byte UTF-8 characters so that a character split between two events shows."""

from __future__ import annotations

from servelab.verify.checks.common import (chat_body, describe_difference, judge_stream_completion,
                                           judge_stream_end, judge_stream_format, quoted, read_chat_stream,
                                           send_chat, send_stream)
from servelab.verify.checks.registry import CheckContext, CheckFailed, CheckVerdict, Evidence, Findings, check
from servelab.verify.http import StreamReply

# Small models do write "café" back; "é" is two bytes in UTF-8, and many tokenizers split it from "caf".
UTF8_PROMPT = "Write the word café three times."
UTF8_MAX_TOKENS = 24
SSE_FIELDS = ("data", "event", "id", "retry")


@check("stream_framing", "Streamed chat framing: data: events, role delta, one finish_reason, usage chunk, [DONE], "
                         "UTF-8 intact")
async def stream_framing(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    plain = await send_chat(ctx, None, chat_body(ctx.model, UTF8_PROMPT, UTF8_MAX_TOKENS))
    reply = await send_stream(ctx, evidence, chat_body(ctx.model, UTF8_PROMPT, UTF8_MAX_TOKENS, stream=True))
    if not reply.events:
        raise CheckFailed(f"the stream carried no events ({reply.disconnect or reply.content_type})")
    findings = Findings()
    reading = read_chat_stream([event.data for event in reply.events])
    judge_lines(reply, findings)
    cut_off = judge_stream_end(reply, reading, findings)
    judge_stream_format(reply, reading, findings, strict=True)
    if len(reading.ids) > 1:
        findings.warn(f"the chunks carry {len(reading.ids)} different ids; OpenAI repeats one id per stream")
    if not cut_off:
        judge_stream_completion(reading, findings, strict=True)
        judge_utf8_text(reading.text, plain.text, findings)
    return findings.verdict(f"{len(reading.chunks)} chunks, text {quoted(reading.text)}")


def judge_lines(reply: StreamReply, findings: Findings) -> None:
    """Every line of the body is a `data:` field, a comment or a blank separator: what OpenAI sends."""
    other: dict[str, int] = {}
    for line in reply.raw.decode("utf-8", errors="replace").splitlines():
        if not line or line.startswith(":"):
            continue
        name = line.split(":", 1)[0] if ":" in line else line
        if name != "data":
            key = name if name in SSE_FIELDS else "not an SSE field"
            other[key] = other.get(key, 0) + 1
    if "not an SSE field" in other:
        findings.fail(f"{other.pop('not an SSE field')} line(s) are not SSE fields")
    if other:
        shown = ", ".join(f"{count} `{name}:`" for name, count in sorted(other.items()))
        findings.warn(f"lines other than `data:` ({shown}); OpenAI sends data lines only")


def judge_utf8_text(streamed: str, plain: str, findings: Findings) -> None:
    if "\ufffd" in streamed:
        findings.fail(f"U+FFFD at character {streamed.index(chr(0xFFFD))}: a multi-byte character was split "
                      f"between events")
    if streamed != plain:
        # Both at temperature 0 on one server: a difference is a framing fault more often than a sampling one.
        findings.fail("the streamed text differs from the non-streamed answer "
                      + describe_difference(streamed, plain, "stream", "plain"))
    wide = sum(1 for ch in streamed if ord(ch) > 127)
    if wide:
        findings.note(f"{wide} non-ASCII character(s) arrived intact")
    else:
        findings.note("the answer had no non-ASCII character, so split characters were not exercised")
