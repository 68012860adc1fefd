"""The verify checks, and the small registry they live in.

A check is one async function `(ctx, evidence) -> Verdict`, registered with `@check(id, title)`; the runner runs
the registered checks in order. A check records the request body it sends and an excerpt of the answer in
`evidence` *as it goes*, so that a check cut off by its deadline still shows what happened. It fails by returning a
fail Verdict or by raising `CheckFailed` / `http.BadResponse`; any other exception is a bug and propagates.

Checks share a `CheckContext`: the HTTP session, the base URL, the model under test (the `models` check fills it in
when the caller gave none), earlier checks' results, and values later checks compare against (`chat_text`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from servelab.records import CheckOutcome, CheckResult
from servelab.verify.http import (BadResponse, StreamReply, excerpt, excerpt_ends, one_line, post_stream,
                                  request_json)

# ---- The registry ------------------------------------------------------------------------------------------------


class CheckFailed(Exception):
    """Raised by a check to fail with str(exc) as the reason."""


@dataclass
class Evidence:
    request: dict[str, Any] | None = None  # the body sent (None for a GET)
    response_excerpt: str | None = None


@dataclass(frozen=True)
class Verdict:
    outcome: CheckOutcome
    reason: str


@dataclass
class CheckContext:
    session: aiohttp.ClientSession
    base_url: str  # without /v1
    model: str | None
    results: dict[str, CheckResult] = field(default_factory=dict)  # by check id, in run order
    chat_text: str | None = None  # the non-streamed temperature-0 answer from `chat`, for `chat_stream` to match


CheckFn = Callable[[CheckContext, Evidence], Awaitable[Verdict]]


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    run: CheckFn
    needs_model: bool = True  # skipped when no model is known (none given, and none could be listed)


CHECKS: list[Check] = []


def check(check_id: str, title: str, *, needs_model: bool = True) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        if any(c.id == check_id for c in CHECKS):
            raise ValueError(f"duplicate check id {check_id!r}")
        CHECKS.append(Check(id=check_id, title=title, run=fn, needs_model=needs_model))
        return fn

    return register


class Findings:
    """Collects a check's fails, warnings and notes, so one run reports every problem rather than the first."""

    def __init__(self) -> None:
        self.fails: list[str] = []
        self.warns: list[str] = []
        self.notes: list[str] = []

    def fail(self, text: str) -> None:
        self.fails.append(text)

    def warn(self, text: str) -> None:
        self.warns.append(text)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def verdict(self, headline: str | None = None) -> Verdict:
        outcome: CheckOutcome = "fail" if self.fails else "warn" if self.warns else "pass"
        parts = ([headline] if headline else []) + self.fails + self.warns + self.notes
        return Verdict(outcome, "; ".join(parts) or "ok")


# ---- Shared validation -------------------------------------------------------------------------------------------

CHAT_PROMPT = "What is 2+2? Reply in one word."
FINISH_REASONS = ("stop", "length")
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


def first_difference(a: str, b: str) -> int:
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position
    return min(len(a), len(b))


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
async def models_listed(ctx: CheckContext, evidence: Evidence) -> Verdict:
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
async def chat_completion(ctx: CheckContext, evidence: Evidence) -> Verdict:
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
    check_content(text, reasoning_of(message), findings, "message")
    check_correct_answer(text, findings)
    finish_reason = choices[0].get("finish_reason")
    if finish_reason not in FINISH_REASONS:
        findings.fail(f"finish_reason is {finish_reason!r}, expected one of {', '.join(FINISH_REASONS)}")
    check_usage(body.get("usage"), findings, "the response")
    if text:
        ctx.chat_text = text
    return findings.verdict(f"answer: {quoted(text)}")


# ---- chat_stream -------------------------------------------------------------------------------------------------


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
    other_objects: set[str] = field(default_factory=set)


def read_chat_stream(datas: list[str]) -> StreamReading:
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
        if chunk.get("object") != "chat.completion.chunk":
            reading.other_objects.add(str(chunk.get("object")))
        choices = chunk.get("choices") if isinstance(chunk.get("choices"), list) else []
        finished_here = False
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            reading.indexes.add(index if is_int(index) else -1)
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            if not reading.saw_delta:
                reading.saw_delta = True
                reading.first_role = delta.get("role")
            if isinstance(delta.get("content"), str):
                reading.text += delta["content"]
            reading.reasoning += reasoning_of(delta)
            if choice.get("finish_reason") is not None:
                reading.finishes.append(choice["finish_reason"])
                finished_here = True
        if isinstance(chunk.get("usage"), dict):
            reading.usage = chunk["usage"]  # with per-chunk usage (vLLM continuous_usage_stats) the last one counts
            reading.usage_chunks += 1
            reading.usage_where = ("in a separate final chunk (choices: [])" if not choices else
                                   "inside the chunk with finish_reason" if finished_here else "inside a content chunk")
    return reading


@check("chat_stream", "Streamed chat: SSE, [DONE], usage, same text as non-streamed")
async def chat_stream(ctx: CheckContext, evidence: Evidence) -> Verdict:
    assert ctx.model is not None  # needs_model
    evidence.request = chat_request(ctx.model, stream=True)

    def keep_excerpt(raw: bytes) -> None:
        evidence.response_excerpt = excerpt_ends(raw.decode("utf-8", errors="replace"))

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
        judge_stream_completion(reading, findings)
        compare_with_chat(reading.text, ctx.chat_text, findings)
    return findings.verdict(f"answer: {quoted(reading.text)}; {len(reading.chunks)} chunks")


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


def judge_stream_format(reply: StreamReply, reading: StreamReading, findings: Findings) -> None:
    """Every event well-formed: SSE content type, UTF-8, JSON chunks, no in-band errors, role on the first delta."""
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
        findings.warn(f"chunk object is {', '.join(sorted(reading.other_objects))}, expected chat.completion.chunk")
    if reading.saw_delta and reading.first_role != "assistant":
        findings.warn(f"the first delta has role {reading.first_role!r}, expected 'assistant'")
    if len(reading.indexes) > 1:
        findings.fail(f"choices with indexes {sorted(reading.indexes)} arrived; one was asked for")


def judge_stream_completion(reading: StreamReading, findings: Findings) -> None:
    """What a complete stream must have delivered: one finish_reason, usage, and some text."""
    if not reading.finishes:
        findings.fail("no choice reached a finish_reason")
    elif len(reading.finishes) > 1:
        findings.fail(f"finish_reason arrived {len(reading.finishes)} times ({', '.join(map(str, reading.finishes))})")
    elif reading.finishes[0] not in FINISH_REASONS:
        findings.fail(f"finish_reason is {reading.finishes[0]!r}, expected one of {', '.join(FINISH_REASONS)}")
    if reading.usage is None:
        findings.warn("no usage despite stream_options.include_usage")  # llama-cpp-python never streams usage
    else:
        check_usage(reading.usage, findings, "the stream")
        findings.note(f"usage {reading.usage_where}" +
                      (f" (usage on {reading.usage_chunks} chunks)" if reading.usage_chunks > 1 else ""))
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
        at = first_difference(streamed, chat_text)
        findings.fail(f"streamed text differs from the non-streamed answer at character {at}: "
                      f"stream {_raw_quoted(streamed[at:at + 20])} vs chat {_raw_quoted(chat_text[at:at + 20])}")


def _raw_quoted(text: str) -> str:
    # Whitespace kept as is: at a point of difference it may be the difference.
    return json.dumps(text, ensure_ascii=False)
