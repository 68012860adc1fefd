"""Anthropic's Messages API (`POST /v1/messages`), as llama.cpp and vLLM serve it: a non-streamed message with
content[0].text, a stop_reason and usage (input_tokens, output_tokens), and the same request streamed as typed
events in Anthropic's order: message_start, then per content block content_block_start, content_block_delta
(text_delta), content_block_stop, then message_delta (the stop_reason and the output usage) and message_stop; `ping`
may come anywhere. Skipped when the server has no such route.

No `x-api-key` or `anthropic-version` header is sent: the engines do not ask for them, and verify's requests carry
only the bearer key."""

from __future__ import annotations

from typing import Any

from servelab.verify.checks.common import CHAT_PROMPT, quoted, send_stream
from servelab.verify.checks.registry import CheckContext, CheckFailed, CheckVerdict, Evidence, Findings, check, skip
from servelab.verify.checks.served import check_token_counts, order_of, read_typed_events, unserved
from servelab.verify.http import excerpt, parse_json, request_raw

MESSAGES_PATH = "/v1/messages"
MESSAGES_MAX_TOKENS = 32
STOP_REASONS = ("end_turn", "max_tokens", "stop_sequence")
USAGE_NAMES = ("input_tokens", "output_tokens")


def messages_request(model: str, *, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": MESSAGES_MAX_TOKENS, "temperature": 0,
                            "messages": [{"role": "user", "content": CHAT_PROMPT}]}
    return body | {"stream": True} if stream else body


@check("messages_api", "POST /v1/messages (Anthropic): text, stop_reason, usage; streamed events in order")
async def messages_api(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    evidence.request = messages_request(ctx.model)
    reply = await request_raw(ctx.session, "POST", ctx.base_url, MESSAGES_PATH, evidence.request)
    evidence.response_excerpt = excerpt(reply.text)
    why_not = unserved(reply, "the Messages API")
    if why_not:
        return skip(why_not)
    findings = Findings()
    text: str | None = None  # the plain answer's, when it is one
    if reply.content_type == "text/event-stream":  # transformers serve streams whatever the request says
        findings.fail("a request without `stream` was answered with an SSE stream, not a message object")
    else:
        text = judge_message(parse_json(reply.text, reply.content_type), findings)
    streamed = await send_stream(ctx, evidence, messages_request(ctx.model, stream=True), MESSAGES_PATH)
    events = read_typed_events(streamed, findings)
    streamed_text = judge_message_events(events, findings)
    answer = f"answer {quoted(text)}; " if text is not None else ""
    return findings.verdict(f"{answer}streamed {quoted(streamed_text)} in {len(events)} events")


def judge_message(body: Any, findings: Findings) -> str:
    if not isinstance(body, dict):
        raise CheckFailed("the message is not a JSON object")
    if body.get("type") == "error":
        raise CheckFailed(f"the server answered 2xx with an error: {quoted(str(body.get('error')), 200)}")
    if body.get("type") != "message":
        findings.fail(f"type is {body.get('type')!r}, expected 'message'")
    if body.get("role") != "assistant":
        findings.fail(f"role is {body.get('role')!r}, expected 'assistant'")
    content = body.get("content")
    first = content[0] if isinstance(content, list) and content and isinstance(content[0], dict) else None
    text = first.get("text") if first is not None and first.get("type") == "text" else None
    if not isinstance(text, str):
        findings.fail("content[0] is not a text block")
        text = ""
    elif not text.strip():
        findings.fail("content[0].text is empty")
    if body.get("stop_reason") not in STOP_REASONS:
        findings.fail(f"stop_reason is {body.get('stop_reason')!r}, expected one of {', '.join(STOP_REASONS)}")
    counts = check_token_counts(body.get("usage"), findings, "the message", USAGE_NAMES)
    if counts is not None:
        cached = body["usage"].get("cache_read_input_tokens")
        findings.note(f"usage {counts['input_tokens']} input + {counts['output_tokens']} output tokens"
                      + (f" ({cached} more input tokens read from the cache)" if cached else ""))
    return text


def judge_message_events(events: list[dict[str, Any]], findings: Findings) -> str:
    """Anthropic's event grammar, checked in one pass; the text the text_delta events carried."""
    for event in events:
        if event["type"] == "error":
            findings.fail(f"the stream carried an error: {quoted(str(event.get('error')), 120)}")
    typed = [event for event in events if event["type"] not in ("ping", "error")]
    types = [event["type"] for event in typed]
    if not types:
        findings.fail("the stream carried no typed events")
        return ""
    if types[0] != "message_start":
        findings.fail(f"the first event is {types[0]}, expected message_start")
    if types[-1] != "message_stop":
        findings.fail(f"the last event is {types[-1]}, expected message_stop")
    open_block: Any = None
    blocks = 0
    text = ""
    for number, event in enumerate(typed[1:-1], 2):
        kind = event["type"]
        if kind == "content_block_start":
            if open_block is not None:
                findings.fail(f"event {number}: content_block_start while block {open_block} is open")
            open_block = event.get("index")
            blocks += 1
        elif kind == "content_block_delta":
            if open_block is None or event.get("index") != open_block:
                findings.fail(f"event {number}: a delta for block {event.get('index')!r} outside it")
            delta = event.get("delta") if isinstance(event.get("delta"), dict) else {}
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                text += delta["text"]
        elif kind == "content_block_stop":
            if open_block is None or event.get("index") != open_block:
                findings.fail(f"event {number}: content_block_stop for block {event.get('index')!r} not open")
            open_block = None
        elif kind == "message_delta":
            if open_block is not None:
                findings.fail(f"event {number}: message_delta while block {open_block} is open")
            if number != len(typed) - 1:
                findings.fail(f"event {number}: message_delta is not the last event before message_stop")
            judge_message_delta(event, findings)
    if "message_delta" not in types:
        findings.fail("no message_delta event (it carries the stop_reason and the output usage)")
    if not blocks:
        findings.fail("no content_block_start event")
    elif not text.strip():
        findings.fail("the text_delta events carried no text")
    if types[0] == "message_start" and not isinstance((typed[0].get("message") or {}).get("usage"), dict):
        findings.warn("message_start carries no message.usage (Anthropic sends the input tokens there)")
    findings.note(f"events: {order_of(types)}")
    return text


def judge_message_delta(event: dict[str, Any], findings: Findings) -> None:
    delta = event.get("delta") if isinstance(event.get("delta"), dict) else {}
    if delta.get("stop_reason") not in STOP_REASONS:
        findings.fail(f"message_delta stop_reason is {delta.get('stop_reason')!r}, expected one of "
                      f"{', '.join(STOP_REASONS)}")
    usage = event.get("usage")
    output = usage.get("output_tokens") if isinstance(usage, dict) else None
    if not isinstance(output, int) or isinstance(output, bool):
        findings.fail(f"message_delta usage.output_tokens is {output!r}, expected an integer")
    else:
        findings.note(f"streamed usage {output} output tokens")
