"""Validation shared by several checks: requests they send, usage and content rules, reading a chat stream."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from servelab.verify.checks.registry import CheckContext, CheckFailed, Evidence, Findings
from servelab.verify.http import (StreamReply, excerpt, excerpt_ends_bytes, one_line, post_stream,
                                  request_json)

# ---- Shared validation -------------------------------------------------------------------------------------------

CHAT_PROMPT = "What is 2+2? Reply in one word."
FINISH_REASONS = ("stop", "length")
SEPARATE_USAGE = "in a separate final chunk (choices: [])"
_FOUR = re.compile(r"\b(4|four)\b", re.IGNORECASE)


def chat_request(model: str, *, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": CHAT_PROMPT}],
                            "temperature": 0, "max_tokens": 32}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def quoted(text: str, limit: int = 80) -> str:
    return json.dumps(one_line(text, limit), ensure_ascii=False)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_usage(usage: Any, findings: Findings, where: str) -> None:
    if not isinstance(usage, dict):
        findings.fail(f"{where} has no usage object")
        return
    counts = {key: usage.get(key) for key in ("prompt_tokens", "completion_tokens", "total_tokens")}
    bad = [f"{key}={value!r}" for key, value in counts.items() if not is_int(value)]
    if bad:
        findings.fail(f"{where} usage needs integer counts, got {', '.join(bad)}")
    elif counts["prompt_tokens"] + counts["completion_tokens"] != counts["total_tokens"]:
        findings.fail(f"{where} usage does not add up: prompt_tokens {counts['prompt_tokens']} + completion_tokens "
                      f"{counts['completion_tokens']} != total_tokens {counts['total_tokens']}")


def check_content(text: str, reasoning: str, findings: Findings, where: str) -> None:
    """Content must be a non-empty string; an empty one is excused (as a warning) when reasoning ate the budget."""
    if text.strip():
        return
    if reasoning.strip():
        findings.warn(f"{where} content is empty but {len(reasoning)} characters of reasoning arrived: a reasoning "
                      f"model may spend max_tokens=32 before answering")
    else:
        findings.fail(f"{where} content is empty")


def check_correct_answer(text: str, findings: Findings) -> None:
    # A warning only: the check is about the interface, and a 135M model may well get the arithmetic wrong.
    if text.strip() and not _FOUR.search(text):
        findings.warn("the answer is not 4 (a small model may answer wrongly: the check is about the interface)")


def reasoning_of(message: dict[str, Any]) -> str:
    # llama.cpp, SGLang and transformers serve say `reasoning_content`; vLLM >= 0.11 says `reasoning`.
    value = message.get("reasoning_content") or message.get("reasoning")
    return value if isinstance(value, str) else ""


def chat_body(model: str, prompt: str, max_tokens: int, *, stream: bool = False, **extra: Any) -> dict[str, Any]:
    """A temperature-0 chat request with one user message (and, streamed, asking for the usage chunk)."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
                            "max_tokens": max_tokens}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body | extra


@dataclass
class ChatAnswer:
    """The parts of a non-streamed chat.completion that checks judge."""

    text: str
    reasoning: str
    finish_reason: Any
    usage: Any
    message: dict[str, Any]
    body: dict[str, Any]


def read_chat_answer(body: Any) -> ChatAnswer:
    """The first choice of a chat.completion; CheckFailed when there is none to read."""
    if not isinstance(body, dict):
        raise CheckFailed(f"expected a JSON object, got {type(body).__name__}")
    if "error" in body and "choices" not in body:
        raise CheckFailed(f"the server answered 2xx with an error: {one_line(json.dumps(body['error']), 200)}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise CheckFailed("the response has no choices[0]")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise CheckFailed("choices[0] has no message object")
    content = message.get("content")
    return ChatAnswer(text=content if isinstance(content, str) else "", reasoning=reasoning_of(message),
                      finish_reason=choices[0].get("finish_reason"), usage=body.get("usage"), message=message,
                      body=body)


async def send_chat(ctx: CheckContext, evidence: Evidence | None, body: dict[str, Any]) -> ChatAnswer:
    """POST a non-streamed chat request; the body and an excerpt of the answer go into `evidence`, if given."""
    if evidence is not None:
        evidence.request = body
    reply = await request_json(ctx.session, "POST", ctx.base_url, "/v1/chat/completions", body)
    if evidence is not None:
        evidence.response_excerpt = excerpt(reply.text)
    return read_chat_answer(reply.body)


async def send_stream(ctx: CheckContext, evidence: Evidence | None, body: dict[str, Any],
                      path: str = "/v1/chat/completions") -> StreamReply:
    """POST a streamed request and read it to its end, keeping the excerpt current as bytes arrive."""
    def keep_excerpt(raw: bytes) -> None:
        if evidence is not None:
            evidence.response_excerpt = excerpt_ends_bytes(raw)

    if evidence is not None:
        evidence.request = body
    reply = await post_stream(ctx.session, ctx.base_url, path, body, keep_excerpt)
    keep_excerpt(reply.raw)
    return reply


def usage_counts(usage: Any) -> tuple[int, int, int] | None:
    """(prompt, completion, total) when all three are integers, else None."""
    if not isinstance(usage, dict):
        return None
    values = [usage.get(key) for key in ("prompt_tokens", "completion_tokens", "total_tokens")]
    return (values[0], values[1], values[2]) if all(is_int(v) for v in values) else None


def distinct_texts(texts: list[str]) -> list[str]:
    """The different texts among `texts`, in first-seen order."""
    return list(dict.fromkeys(texts))


def first_difference(a: str, b: str) -> int:
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position
    return min(len(a), len(b))


# ---- Reading a chat stream -----------------------------------------------------------------------------------------



@dataclass
class StreamReading:
    """What the events of a chat stream said, gathered in one pass so the judgement below reads as a list."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    done_seen: bool = False
    events_after_done: int = 0
    not_json: list[int] = field(default_factory=list)  # 1-based event numbers
    errors: list[str] = field(default_factory=list)  # in-band {"error": ...} events
    text: str = ""
    reasoning: str = ""
    first_role: Any = None
    saw_delta: bool = False
    indexes: set[int] = field(default_factory=set)
    finishes: list[Any] = field(default_factory=list)
    usage: Any = None
    usage_where: str | None = None
    usage_chunks: int = 0
    usage_last: bool = False  # the (last) usage arrived on the last chunk before [DONE]
    other_objects: set[str] = field(default_factory=set)
    ids: set[str] = field(default_factory=set)  # chunk ids: one per stream, as OpenAI sends
    content_after_finish: int = 0  # chunks that carried text after the finish_reason


def read_chat_stream(datas: list[str], expected_object: str = "chat.completion.chunk") -> StreamReading:
    """One pass over a stream's data fields. Chat chunks carry `delta`; completions chunks (expected_object
    "text_completion") carry `text`, which is gathered the same way."""
    reading = StreamReading()
    for number, data in enumerate(datas, 1):
        if reading.done_seen:
            reading.events_after_done += 1
            continue
        if data.strip() == "[DONE]":
            reading.done_seen = True
            continue
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            reading.not_json.append(number)
            continue
        if not isinstance(chunk, dict):
            reading.not_json.append(number)
            continue
        if "error" in chunk:
            reading.errors.append(one_line(json.dumps(chunk["error"]), 200))
            continue
        reading.chunks.append(chunk)
        if chunk.get("object") != expected_object:
            reading.other_objects.add(str(chunk.get("object")))
        if isinstance(chunk.get("id"), str):
            reading.ids.add(chunk["id"])
        choices = chunk.get("choices") if isinstance(chunk.get("choices"), list) else []
        finished_here = False
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            reading.indexes.add(index if is_int(index) else -1)
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            if not reading.saw_delta and "delta" in choice:
                reading.saw_delta = True
                reading.first_role = delta.get("role")
            piece = delta.get("content") if "delta" in choice else choice.get("text")
            if isinstance(piece, str):
                reading.text += piece
                if piece and reading.finishes:
                    reading.content_after_finish += 1
            reading.reasoning += reasoning_of(delta)
            if choice.get("finish_reason") is not None:
                reading.finishes.append(choice["finish_reason"])
                finished_here = True
        if isinstance(chunk.get("usage"), dict):
            reading.usage = chunk["usage"]  # with per-chunk usage (vLLM continuous_usage_stats) the last one counts
            reading.usage_chunks += 1
            reading.usage_where = (SEPARATE_USAGE if not choices else
                                   "inside the chunk with finish_reason" if finished_here else "inside a content chunk")
            reading.usage_last = True
        else:
            reading.usage_last = False
    return reading


def judge_stream_end(reply: StreamReply, reading: StreamReading, findings: Findings) -> bool:
    """How the stream ended. True if it was cut off before [DONE]."""
    if reply.disconnect and not reading.done_seen:
        findings.fail(f"connection closed before [DONE] after {len(reply.events)} events ({reply.disconnect})")
        return True
    if reply.disconnect:
        findings.warn(f"the connection closed uncleanly after [DONE] ({reply.disconnect})")
    elif not reading.done_seen:
        findings.fail("the stream ended without `data: [DONE]`")  # transformers serve never sends it
    if reading.events_after_done:
        findings.fail(f"{reading.events_after_done} event(s) after [DONE]")
    return False


def judge_stream_format(reply: StreamReply, reading: StreamReading, findings: Findings, *,
                        strict: bool = False, expected_object: str = "chat.completion.chunk") -> None:
    """Every event well-formed: SSE content type, UTF-8, JSON chunks, no in-band errors, role on the first delta.
    `strict` (the framing check) fails what the story's check only warns about: a missing role delta."""
    if reply.content_type != "text/event-stream":
        findings.warn(f"content type is {reply.content_type}, not text/event-stream")
    try:
        reply.raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        findings.fail(f"the body is not valid UTF-8 (at byte {exc.start})")
    if reading.not_json:
        shown = ", ".join(map(str, reading.not_json[:5]))
        findings.fail(f"{len(reading.not_json)} data event(s) are not JSON objects (event {shown})")
    for error in reading.errors:
        findings.fail(f"the stream carried an error: {error}")
    if reading.other_objects:
        findings.warn(f"chunk object is {', '.join(sorted(reading.other_objects))}, expected {expected_object}")
    if reading.saw_delta and reading.first_role != "assistant":
        findings.problem(f"the first delta has role {reading.first_role!r}, expected 'assistant'", strict=strict)
    if len(reading.indexes) > 1:
        findings.fail(f"choices with indexes {sorted(reading.indexes)} arrived; one was asked for")


def judge_stream_completion(reading: StreamReading, findings: Findings, *, strict: bool = False) -> None:
    """What a complete stream must have delivered: one finish_reason, usage, and some text. `strict` (the framing
    check) fails a stream without the usage that stream_options.include_usage asked for, and warns when usage is
    not in a chunk of its own."""
    if not reading.finishes:
        findings.fail("no choice reached a finish_reason")
    elif len(reading.finishes) > 1:
        findings.fail(f"finish_reason arrived {len(reading.finishes)} times ({', '.join(map(str, reading.finishes))})")
    elif reading.finishes[0] not in FINISH_REASONS:
        findings.fail(f"finish_reason is {reading.finishes[0]!r}, expected one of {', '.join(FINISH_REASONS)}")
    if reading.content_after_finish:
        findings.fail(f"{reading.content_after_finish} chunk(s) carried text after the finish_reason")
    if reading.usage is None:
        # llama-cpp-python never streams usage
        findings.problem("no usage despite stream_options.include_usage", strict=strict)
    else:
        check_usage(reading.usage, findings, "the stream")
        where = f"usage {reading.usage_where}" + (
            f" (usage on {reading.usage_chunks} chunks)" if reading.usage_chunks > 1 else "")
        if strict and reading.usage_where != SEPARATE_USAGE:
            # transformers serve: usage rides on the chunk with finish_reason; OpenAI sends a chunk of its own
            findings.warn(f"{where}, not in a final chunk of its own with choices: [] as OpenAI sends it")
        elif strict and not reading.usage_last:
            findings.warn(f"{where}, but not as the last chunk before [DONE]")
        else:
            findings.note(where)
    # Correctness is the chat check's business; here the streamed text only has to exist and match it.
    check_content(reading.text, reading.reasoning, findings, "streamed")


def compare_with_chat(streamed: str, chat_text: str | None, findings: Findings) -> None:
    if "\ufffd" in streamed and "\ufffd" not in (chat_text or ""):
        findings.fail(f"U+FFFD at character {streamed.index(chr(0xFFFD))}: a multi-byte character was split")
    if chat_text is None:
        findings.note("not compared with a non-streamed answer (the chat check did not run or gave no text)")
    elif streamed == chat_text:
        findings.note("same text as the non-streamed answer")
    else:
        findings.fail("streamed text differs from the non-streamed answer "
                      + describe_difference(streamed, chat_text, "stream", "chat"))


def describe_difference(a: str, b: str, a_name: str, b_name: str) -> str:
    """Where two texts part, with 20 characters of each from there."""
    at = first_difference(a, b)
    return f"at character {at}: {a_name} {_raw_quoted(a[at:at + 20])} vs {b_name} {_raw_quoted(b[at:at + 20])}"


def _raw_quoted(text: str) -> str:
    # Whitespace kept as is: at a point of difference it may be the difference.
    return json.dumps(text, ensure_ascii=False)
