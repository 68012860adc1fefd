"""The story's checks: the model list, one chat request, and the same request streamed."""

from __future__ import annotations

import json
from typing import Any

from servelab.verify.checks.common import (CHAT_PROMPT, chat_request, check_content, check_correct_answer,
                                           check_usage, compare_with_chat, FINISH_REASONS, judge_stream_completion,
                                           judge_stream_end, judge_stream_format, quoted, read_chat_answer,
                                           read_chat_stream, reasoning_of, send_stream, StreamReading)
from servelab.verify.checks.registry import CheckContext, CheckFailed, CheckVerdict, Evidence, Findings, check
from servelab.verify.checks.thinking import judge_thinking, read_signals
from servelab.verify.http import (BadResponse, excerpt, excerpt_ends_bytes, one_line, post_stream,
                                  request_json)

# A reasoning model may spend the story's 32 tokens thinking; the request is then repeated once with this budget,
# so the answer path is verified too.
LONGER_BUDGET = 512

# ---- models ------------------------------------------------------------------------------------------------------


def listed_model_ids(body: Any) -> tuple[list[str], bool]:
    """The ids a /v1/models answer lists, and whether it used OpenAI's `data` list (else llama.cpp's older,
    ollama-style `models` list)."""
    if not isinstance(body, dict):
        raise CheckFailed(f"expected an object with a `data` list, got {type(body).__name__}")
    if isinstance(body.get("data"), list):
        ids = [entry.get("id") for entry in body["data"] if isinstance(entry, dict)]
        missing = len(body["data"]) - sum(isinstance(i, str) and i != "" for i in ids)
        if missing:
            raise CheckFailed(f"{missing} of {len(body['data'])} entries in `data` have no string `id`")
        return ids, True
    if isinstance(body.get("models"), list):
        ids = [entry.get("model") or entry.get("name") for entry in body["models"] if isinstance(entry, dict)]
        return [i for i in ids if isinstance(i, str) and i], False
    raise CheckFailed(f"no `data` list in the answer (keys: {', '.join(sorted(body)) or 'none'})")


async def discover_model(ctx: CheckContext) -> str | None:
    """The first listed model, for runs that skip the `models` check but were given no model. None if unknown."""
    try:
        reply = await request_json(ctx.session, "GET", ctx.base_url, "/v1/models")
        ids, _ = listed_model_ids(reply.body)
    except (BadResponse, CheckFailed):
        return None
    return ids[0] if ids else None


@check("models", "GET /v1/models lists a model", needs_model=False)
async def models_listed(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    reply = await request_json(ctx.session, "GET", ctx.base_url, "/v1/models")
    evidence.response_excerpt = excerpt(reply.text)
    ids, openai_shape = listed_model_ids(reply.body)
    if not ids:
        raise CheckFailed("the server lists no models")
    findings = Findings()
    if not openai_shape:
        findings.warn("no OpenAI `data` list; ids taken from the llama.cpp-style `models` list")
    if ctx.model is None:
        ctx.model = ids[0]
        findings.note(f"using {ids[0]!r} (the first listed)")
    elif ctx.model not in ids:
        findings.warn(f"{ctx.model!r} is not among the listed models; some servers answer for any name")
    shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    return findings.verdict(f"lists {len(ids)} model{'s' if len(ids) != 1 else ''}: {shown}")


# ---- chat --------------------------------------------------------------------------------------------------------


@check("chat", "POST /v1/chat/completions returns a well-formed chat.completion")
async def chat_completion(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None  # needs_model
    evidence.request = chat_request(ctx.model)
    reply = await request_json(ctx.session, "POST", ctx.base_url, "/v1/chat/completions", evidence.request)
    evidence.response_excerpt = excerpt(reply.text)
    body = reply.body
    if not isinstance(body, dict):
        raise CheckFailed(f"expected a JSON object, got {type(body).__name__}")
    if "error" in body and "choices" not in body:
        raise CheckFailed(f"the server answered 2xx with an error: {one_line(json.dumps(body['error']), 200)}")
    findings = Findings()
    if body.get("object") != "chat.completion":
        findings.fail(f"object is {body.get('object')!r}, expected 'chat.completion'")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        findings.fail("no choices[0]")
        return findings.verdict()
    message = choices[0].get("message")
    if not isinstance(message, dict):
        findings.fail("choices[0] has no message object")
        return findings.verdict()
    if message.get("role") != "assistant":
        findings.fail(f"message.role is {message.get('role')!r}, expected 'assistant'")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        findings.fail(f"message.content is a {type(content).__name__}, expected a string")
        content = None
    text = content or ""
    reasoning = reasoning_of(message)
    finish_reason = choices[0].get("finish_reason")
    if not text.strip() and reasoning.strip():
        await answer_after_thinking(ctx, findings, len(reasoning), finish_reason)
    else:
        check_content(text, reasoning, findings, "message")
        check_correct_answer(text, findings)
    if finish_reason not in FINISH_REASONS:
        findings.fail(f"finish_reason is {finish_reason!r}, expected one of {', '.join(FINISH_REASONS)}")
    check_usage(body.get("usage"), findings, "the response")
    seen = read_signals(prompt=CHAT_PROMPT, text=text, message=message, finish_reason=finish_reason,
                        usage=body.get("usage"), max_tokens=evidence.request["max_tokens"],
                        models=[ctx.model, body.get("model")])
    await judge_thinking(ctx, seen, findings, "message")
    if text:
        ctx.chat_text = text
    return findings.verdict(f"answer: {quoted(text)}")


async def answer_after_thinking(ctx: CheckContext, findings: Findings, reasoning_chars: int,
                                finish_reason: object) -> None:
    """Content empty, reasoning present: the model spent the budget thinking. Say so, and ask once more with
    LONGER_BUDGET tokens so that the answer is verified too (its text is kept for `chat_stream` to match)."""
    assert ctx.model is not None
    spent = "the whole max_tokens=32" if finish_reason == "length" else "the 32-token budget"
    said = f"the model spent {spent} thinking ({reasoning_chars} characters of reasoning, content empty)"
    try:
        reply = await request_json(ctx.session, "POST", ctx.base_url, "/v1/chat/completions",
                                   chat_request(ctx.model) | {"max_tokens": LONGER_BUDGET})
        retry = read_chat_answer(reply.body)
    except (BadResponse, CheckFailed) as exc:
        findings.warn(f"{said}; asked again with max_tokens {LONGER_BUDGET}, which failed: {exc}")
        return
    if not retry.text.strip():
        findings.warn(f"{said}; asked again with max_tokens {LONGER_BUDGET}: still no content "
                      f"({len(retry.reasoning)} characters of reasoning, finish_reason {retry.finish_reason!r})")
        return
    findings.note(f"{said}; asked again with max_tokens {LONGER_BUDGET}: answer {quoted(retry.text)}")
    check_correct_answer(retry.text, findings)
    ctx.facts["chat_text_longer"] = retry.text

# ---- chat_stream -------------------------------------------------------------------------------------------------


@check("chat_stream", "Streamed chat: SSE, [DONE], usage, same text as non-streamed")
async def chat_stream(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None  # needs_model
    evidence.request = chat_request(ctx.model, stream=True)

    def keep_excerpt(raw: bytes) -> None:
        evidence.response_excerpt = excerpt_ends_bytes(raw)

    reply = await post_stream(ctx.session, ctx.base_url, "/v1/chat/completions", evidence.request, keep_excerpt)
    keep_excerpt(reply.raw)
    if not reply.events:
        if reply.disconnect:
            raise CheckFailed(f"connection closed before [DONE], before any event ({reply.disconnect})")
        if reply.content_type != "text/event-stream":
            shown = one_line(reply.raw.decode("utf-8", errors="replace")) or "(empty body)"
            raise BadResponse(f"expected an SSE stream (text/event-stream), got {reply.content_type}: {shown}")
        raise CheckFailed("the stream carried no events")

    findings = Findings()
    reading = read_chat_stream([event.data for event in reply.events])
    cut_off = judge_stream_end(reply, reading, findings)
    judge_stream_format(reply, reading, findings)
    if not cut_off:
        # A stream cut short lacks its finish, usage and the rest of its text as a consequence; listing those
        # would bury the cause.
        longer = None
        if not reading.text.strip() and reading.reasoning.strip():
            longer = await stream_after_thinking(ctx, findings, reading)
        judge_stream_completion(longer or reading, findings)
        compare_with_chat((longer or reading).text, ctx.facts.get("chat_text_longer") if longer else ctx.chat_text,
                          findings)
        reading = longer or reading
    return findings.verdict(f"answer: {quoted(reading.text)}; {len(reading.chunks)} chunks")


async def stream_after_thinking(ctx: CheckContext, findings: Findings, reading: StreamReading
                                ) -> StreamReading | None:
    """The streamed twin of `answer_after_thinking`: the stream carried only reasoning, so it is asked for once
    more with LONGER_BUDGET tokens. The longer stream, when it answered; None (and a warning) otherwise."""
    assert ctx.model is not None
    said = (f"the stream spent its 32 tokens thinking ({len(reading.reasoning)} characters of reasoning deltas, "
            f"no content)")
    try:
        reply = await send_stream(ctx, None, chat_request(ctx.model, stream=True) | {"max_tokens": LONGER_BUDGET})
    except (BadResponse, CheckFailed) as exc:
        findings.warn(f"{said}; asked again with max_tokens {LONGER_BUDGET}, which failed: {exc}")
        return None
    longer = read_chat_stream([event.data for event in reply.events])
    if not longer.text.strip() or reply.disconnect or not longer.done_seen:
        findings.warn(f"{said}; asked again with max_tokens {LONGER_BUDGET}: no complete answer either")
        return None
    findings.note(f"{said}; asked again with max_tokens {LONGER_BUDGET}")
    return longer
