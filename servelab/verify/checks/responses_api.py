"""OpenAI's Responses API (`POST /v1/responses`): a non-streamed response with output text and usage
(input_tokens, output_tokens), and the same request streamed as typed events: response.created first,
response.output_text.delta events carrying the text, and a terminal response.completed (or response.incomplete, as
OpenAI ends a response cut at max_output_tokens) whose response carries the usage. The event names are those of the
openai SDK's `openai.types.responses` (ResponseCreatedEvent, ResponseTextDeltaEvent, ResponseCompletedEvent, ...).
Skipped when the server has no such route."""

from __future__ import annotations

from typing import Any

from servelab.verify.checks.common import CHAT_PROMPT, quoted, send_stream
from servelab.verify.checks.registry import CheckContext, CheckFailed, CheckVerdict, Evidence, Findings, check, skip
from servelab.verify.checks.served import check_token_counts, order_of, read_typed_events, unserved
from servelab.verify.http import excerpt, parse_json, request_raw

RESPONSES_PATH = "/v1/responses"
RESPONSES_MAX_TOKENS = 32  # OpenAI's floor for max_output_tokens is 16
TERMINAL = ("response.completed", "response.incomplete")
FAILED = ("response.failed", "error")
USAGE_NAMES = ("input_tokens", "output_tokens")


def responses_request(model: str, *, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "input": CHAT_PROMPT, "max_output_tokens": RESPONSES_MAX_TOKENS,
                            "temperature": 0}
    return body | {"stream": True} if stream else body


@check("responses_api", "POST /v1/responses: output text and usage; streamed events in order, ending with usage")
async def responses_api(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    evidence.request = responses_request(ctx.model)
    reply = await request_raw(ctx.session, "POST", ctx.base_url, RESPONSES_PATH, evidence.request)
    evidence.response_excerpt = excerpt(reply.text)
    why_not = unserved(reply, "the Responses API")
    if why_not:
        return skip(why_not)
    findings = Findings()
    text: str | None = None  # the plain answer's, when it is one
    if reply.content_type == "text/event-stream":  # transformers serve streams unless told `stream: false`
        explicit = await request_raw(ctx.session, "POST", ctx.base_url, RESPONSES_PATH,
                                     evidence.request | {"stream": False})
        told = ("with `stream: false` it answers one" if explicit.status == 200 and explicit.content_type ==
                "application/json" else "nor with `stream: false`")
        findings.fail(f"a request without `stream` (OpenAI's default: not streamed) was answered with an SSE "
                      f"stream, not a Response object; {told}")
        if explicit.status == 200 and explicit.content_type == "application/json":
            text = judge_response(parse_json(explicit.text, explicit.content_type), findings, "the response")
    else:
        text = judge_response(parse_json(reply.text, reply.content_type), findings, "the response")
    streamed = await send_stream(ctx, evidence, responses_request(ctx.model, stream=True), RESPONSES_PATH)
    events = read_typed_events(streamed, findings)
    streamed_text = judge_response_events(events, findings)
    answer = f"answer {quoted(text)}; " if text is not None else ""
    return findings.verdict(f"{answer}streamed {quoted(streamed_text)} in {len(events)} events")


def output_text(response: dict[str, Any]) -> str | None:
    """The text of a response's output messages (output[].content[] of type output_text); None without any."""
    pieces = [part.get("text") for item in response.get("output") or [] if isinstance(item, dict)
              and item.get("type") == "message" for part in item.get("content") or []
              if isinstance(part, dict) and part.get("type") == "output_text"]
    texts = [piece for piece in pieces if isinstance(piece, str)]
    return "".join(texts) if texts else None


def judge_response(body: Any, findings: Findings, where: str) -> str:
    """A Response object's text, status and usage."""
    if not isinstance(body, dict):
        raise CheckFailed(f"{where} is not a JSON object")
    if body.get("object") != "response":
        findings.fail(f"{where}: object is {body.get('object')!r}, expected 'response'")
    status = body.get("status")
    if status not in ("completed", "incomplete"):
        findings.fail(f"{where}: status is {status!r}, expected 'completed' (or 'incomplete' at max_output_tokens)")
    text = output_text(body)
    if text is None:
        findings.fail(f"{where} has no output message with output_text content")
        text = ""
    elif not text.strip():
        findings.fail(f"{where}: the output text is empty")
    counts = check_token_counts(body.get("usage"), findings, where, USAGE_NAMES)
    if counts is not None:
        total = body["usage"].get("total_tokens")
        if total is not None and total != counts["input_tokens"] + counts["output_tokens"]:
            findings.fail(f"{where} usage does not add up: input_tokens {counts['input_tokens']} + output_tokens "
                          f"{counts['output_tokens']} != total_tokens {total}")
    return text


def judge_response_events(events: list[dict[str, Any]], findings: Findings) -> str:
    """The order and content of a Responses stream's events; the text its deltas carried."""
    types = [event["type"] for event in events]
    for event in events:
        if event["type"] in FAILED:
            findings.fail(f"the stream carried {event['type']}: {quoted(str(event.get('response') or event), 120)}")
    if not types:
        findings.fail("the stream carried no typed events")
        return ""
    if types[0] != "response.created":
        findings.fail(f"the first event is {types[0]}, expected response.created")
    deltas = [i for i, name in enumerate(types) if name == "response.output_text.delta"]
    text = "".join(event.get("delta") for event in events
                   if event["type"] == "response.output_text.delta" and isinstance(event.get("delta"), str))
    if not deltas:
        findings.fail("no response.output_text.delta event")
    elif not text.strip():
        findings.fail("the output_text deltas carried no text")
    terminal = [i for i, name in enumerate(types) if name in TERMINAL]
    if not terminal:
        findings.fail(f"no {' or '.join(TERMINAL)} event; the stream went {order_of(types)}")
        return text
    if terminal[0] != len(types) - 1:
        findings.fail(f"{len(types) - 1 - terminal[0]} event(s) after {types[terminal[0]]}")
    if deltas and deltas[-1] > terminal[0]:
        findings.fail("output_text deltas after the terminal event")
    done = [event.get("text") for event in events if event["type"] == "response.output_text.done"]
    if done and done[-1] != text:
        findings.fail(f"response.output_text.done says {quoted(str(done[-1]))}, the deltas {quoted(text)}")
    final = events[terminal[0]].get("response")
    if not isinstance(final, dict):
        findings.fail(f"{types[terminal[0]]} carries no response object")
    else:
        counts = check_token_counts(final.get("usage"), findings, types[terminal[0]], USAGE_NAMES)
        if counts is not None:
            findings.note(f"streamed usage {counts['input_tokens']} input + {counts['output_tokens']} output tokens")
    findings.note(f"events: {order_of(types)}")
    return text
