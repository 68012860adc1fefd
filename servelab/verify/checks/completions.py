"""The legacy text-completions endpoint, /v1/completions, plain and streamed."""

from __future__ import annotations

from typing import Any

from servelab.verify.checks.common import (FINISH_REASONS, check_usage, describe_difference, quoted,
                                           read_chat_stream, send_stream, judge_stream_completion,
                                           judge_stream_end, judge_stream_format)
from servelab.verify.checks.registry import CheckContext, CheckFailed, CheckVerdict, Evidence, Findings, check, skip
from servelab.verify.http import excerpt, parse_json, request_raw, one_line

COMPLETION_PROMPT = "The capital of France is"
COMPLETION_MAX_TOKENS = 16


def completion_body(model: str, *, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": COMPLETION_PROMPT, "max_tokens": COMPLETION_MAX_TOKENS,
                            "temperature": 0}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


@check("completions", "POST /v1/completions returns a text_completion, plain and streamed")
async def completions(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    evidence.request = completion_body(ctx.model)
    reply = await request_raw(ctx.session, "POST", ctx.base_url, "/v1/completions", evidence.request)
    evidence.response_excerpt = excerpt(reply.text)
    if reply.status in (404, 405):
        return skip(f"the server has no /v1/completions (HTTP {reply.status}: {one_line(reply.text) or 'empty'})")
    if not 200 <= reply.status < 300:
        raise CheckFailed(f"HTTP {reply.status} from POST /v1/completions: {one_line(reply.text) or '(empty body)'}")
    body = parse_json(reply.text, reply.content_type)
    findings = Findings()
    text = judge_completion(body, findings)

    stream = await send_stream(ctx, None, completion_body(ctx.model, stream=True), "/v1/completions")
    reading = read_chat_stream([event.data for event in stream.events], expected_object="text_completion")
    if not stream.events:
        findings.fail(f"the streamed request carried no events ({stream.disconnect or stream.content_type})")
    elif not judge_stream_end(stream, reading, findings):
        judge_stream_format(stream, reading, findings, expected_object="text_completion")
        judge_stream_completion(reading, findings)
        if text is not None and reading.text != text:
            findings.fail("streamed text differs from the plain answer "
                          + describe_difference(reading.text, text, "stream", "plain"))
        elif text is not None:
            findings.note("the streamed text equals the plain one")
    return findings.verdict(f"text: {quoted(text or '')}")


def judge_completion(body: Any, findings: Findings) -> str | None:
    """A non-streamed text_completion; returns its text when there is one."""
    if not isinstance(body, dict):
        findings.fail(f"expected a JSON object, got {type(body).__name__}")
        return None
    if body.get("object") != "text_completion":
        findings.fail(f"object is {body.get('object')!r}, expected 'text_completion'")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        findings.fail("no choices[0]")
        return None
    text = choices[0].get("text")
    if not isinstance(text, str):
        findings.fail(f"choices[0].text is {type(text).__name__}, expected a string")
        return None
    if not text.strip():
        findings.fail("choices[0].text is empty")
    finish_reason = choices[0].get("finish_reason")
    if finish_reason not in FINISH_REASONS:
        findings.fail(f"finish_reason is {finish_reason!r}, expected one of {', '.join(FINISH_REASONS)}")
    check_usage(body.get("usage"), findings, "the response")
    return text
