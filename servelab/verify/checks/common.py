"""Validation shared by several checks: requests they send, usage and content rules, reading a chat stream."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from servelab.verify.checks.registry import Findings
from servelab.verify.http import StreamReply, one_line

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
