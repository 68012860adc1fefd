"""Read one OpenAI-compatible streaming chunk (already JSON-decoded) into what a benchmark needs.

Engines differ in small ways that decide whether numbers are right (shared/research/engines.md §0.5):
- reasoning arrives as `delta.reasoning_content` (SGLang, llama.cpp, transformers serve) or `delta.reasoning`
  (vLLM >= 0.16); both are read, and reasoning is kept apart from the answer;
- `/v1/completions` chunks carry `choices[].text`, chat chunks `choices[].delta.content`;
- usage comes in a separate final chunk with `choices: []` (vLLM, SGLang, llama.cpp chat), inside the chunk that
  carries finish_reason (transformers serve, llama.cpp completions), on every chunk (`continuous_usage_stats`), or
  not at all (llama-cpp-python);
- llama.cpp with `timings_per_token` puts its running count of generated tokens in `timings.predicted_n`;
- llama.cpp puts the prompt tokens it reused from its cache in `timings.cache_n` (on the last chunk, and on every
  chunk with `timings_per_token`); builds that also send `usage.prompt_tokens_details.cached_tokens` say the same
  there (tools/server/server-task.cpp), and the usage wins when both are present;
- an error can arrive inside a 200 stream as `{"error": {...}}`;
- a streamed tool call arrives as `choices[].delta.tool_calls` pieces, kept as sent for the client to join.

A chunk that is JSON but not a chunk (`"abc"`, `{"choices": [1]}`, `choices` that is not a list) raises
MalformedChunk: the client records that one request as a `parse` failure, and the run goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servelab.records import Usage


class MalformedChunk(ValueError):
    """Valid JSON that is not an OpenAI-compatible streaming chunk."""


def _excerpt(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 200 else text[:199] + "…"


@dataclass(slots=True)
class ChunkView:
    answer: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    running_count: int | None = None  # the server's running count of generated tokens, if this chunk has one
    has_choices: bool = False
    error: str | None = None
    cache_n: int | None = None  # llama.cpp's timings.cache_n: prompt tokens served from its cache
    end: bool = False  # the event that ends a complete stream, where a dialect has one (protocol/dialects/)
    # The chat delta's `tool_calls` pieces as sent (a list: each with its `index`, the first of a call with `id`,
    # `type` and `function.name`, then `function.arguments` fragments); the client joins them (bench/tool_calls.py)
    tool_calls: list | None = None
    # A keep-alive sent as a data event (Messages' data-only `{"type": "ping"}`): the client treats it as a `: ping`
    # comment, neither an event for any count nor one that holds the idle deadline off
    keep_alive: bool = False


def parse_usage(obj: Any) -> Usage | None:
    if not isinstance(obj, dict):
        return None

    def as_int(v: Any) -> int | None:
        if isinstance(v, bool):
            return None
        if isinstance(v, int):
            return v
        if isinstance(v, float) and v.is_integer():
            # JSON has one number type: 10^30 and 1e308 arrive as floats. Kept as the count they claim, so the
            # client's bound fails the request (docs/metrics.md: a parse failure), not dropped silently.
            return int(v)
        return None

    details = obj.get("completion_tokens_details") or {}
    prompt_details = obj.get("prompt_tokens_details") or {}
    reasoning = as_int(obj.get("reasoning_tokens"))  # SGLang: top level
    if reasoning is None and isinstance(details, dict):
        reasoning = as_int(details.get("reasoning_tokens"))  # OpenAI / vLLM
    return Usage(
        prompt_tokens=as_int(obj.get("prompt_tokens")),
        completion_tokens=as_int(obj.get("completion_tokens")),
        total_tokens=as_int(obj.get("total_tokens")),
        reasoning_tokens=reasoning,
        cached_tokens=as_int(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else None,
    )


def error_message(err: Any) -> str:
    if isinstance(err, dict):
        msg = err.get("message") or err.get("error") or str(err)
        code = err.get("code") or err.get("type")
        return f"{msg} ({code})" if code else str(msg)
    return str(err)


def read_chunk(obj: Any) -> ChunkView:
    # Runs once per streamed event: each field is looked up once and the view is built in one call.
    if not isinstance(obj, dict):
        raise MalformedChunk(f"the chunk is not a JSON object: {_excerpt(obj)}")
    choices = obj.get("choices")
    if not choices and "error" in obj:
        return ChunkView(error=error_message(obj["error"]))
    answer = reasoning = ""
    finish_reason = tool_calls = None
    if choices:
        if choices.__class__ is not list:
            raise MalformedChunk(f"the chunk's `choices` is not a list: {_excerpt(choices)}")
        choice = choices[0]  # servelab sends n=1
        if choice.__class__ is not dict:
            raise MalformedChunk(f"the chunk's choices[0] is not an object: {_excerpt(choice)}")
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if content.__class__ is str:
                answer = content
            r = delta.get("reasoning_content")
            if r.__class__ is not str:
                r = delta.get("reasoning")
            if r.__class__ is str:
                reasoning = r
            pieces = delta.get("tool_calls")
            if pieces:
                if pieces.__class__ is not list:
                    raise MalformedChunk(f"the chunk's delta.tool_calls is not a list: {_excerpt(pieces)}")
                tool_calls = pieces
        else:
            text = choice.get("text")
            if isinstance(text, str):
                answer = text
        finish_reason = choice.get("finish_reason") or None
        if finish_reason is not None and finish_reason.__class__ is not str:
            raise MalformedChunk(f"the chunk's finish_reason is not a string: {_excerpt(finish_reason)}")
    raw_usage = obj.get("usage")
    usage = parse_usage(raw_usage) if raw_usage else None
    running_count = cache_n = None
    timings = obj.get("timings")
    if isinstance(timings, dict):
        predicted = timings.get("predicted_n")
        if predicted.__class__ is int:  # an int, not a bool
            running_count = predicted
        elif predicted.__class__ is float and predicted.is_integer():  # 1e30: a count past any bound
            running_count = int(predicted)
        if timings.get("cache_n").__class__ is int and timings["cache_n"] >= 0:
            cache_n = timings["cache_n"]
    if running_count is None and choices and usage is not None and usage.completion_tokens is not None:
        # Usage on a chunk that still has choices: a running count (continuous_usage_stats) or the final count on
        # the last chunk. The counting pass below tells the two apart by whether every chunk had one.
        running_count = usage.completion_tokens
    return ChunkView(answer, reasoning, finish_reason, usage, running_count, bool(choices), None, cache_n,
                     tool_calls=tool_calls)
