"""Anthropic's Messages API streamed (`POST /v1/messages`, `stream: true`): typed events in Anthropic's order,
each `event: <type>` and `data: {"type": <type>, …}`.

What is read (Anthropic's streaming docs; llama.cpp's tools/server/server-task.cpp and vLLM's entrypoints/anthropic
send the same; vLLM's source has a `data: [DONE]` after message_stop on some paths, never read, and 0.32.0 sent
none in tests/fixtures/dialects):
- message_start: `message.usage` with the prompt's tokens: input_tokens, plus cache_read_input_tokens and
  cache_creation_input_tokens where the server counts its cache apart (Anthropic and llama.cpp do: a prompt whose
  prefix llama.cpp held says input_tokens 1, cache_read_input_tokens 32). Its output_tokens is a placeholder (0 or
  1) and is not read;
- content_block_delta: `delta.text` of a text_delta is answer, `delta.thinking` of a thinking_delta reasoning,
  kept apart; signature_delta carries neither;
- a tool call: content_block_start with a `tool_use` block (its `id` and `name`), then input_json_delta deltas
  (`partial_json` fragments of its input) at the block's `index`: read as chat's tool_calls pieces (the start as the
  call's first piece, each fragment as an arguments piece, the block index as the call's), so each is a token event
  with no text and the client joins the call (bench/tool_calls.py) as on chat;
- message_delta: `delta.stop_reason` (end_turn, max_tokens, …) and `usage.output_tokens`, the answer's whole count
  (cumulative; vLLM repeats input_tokens there);
- message_stop: the end of a complete stream;
- error (`error.type`, `error.message`): the request failed in-band; ping: a keep-alive, whether it came as
  `event: ping` or as data alone, so it holds the idle deadline off no more than a `: ping` comment does.
"""

from __future__ import annotations

from typing import Any

from servelab.protocol.chunks import ChunkView, MalformedChunk, _excerpt
from servelab.protocol.dialects.dialect import Dialect
from servelab.protocol.dialects.common import NOTHING, count, error_view, event_type, text_of
from servelab.records import Usage

KEEP_ALIVE = ChunkView(keep_alive=True)


def read_event(obj: Any) -> ChunkView:
    kind = event_type(obj)
    if kind == "content_block_delta":
        delta = obj.get("delta")
        if delta.__class__ is not dict:
            raise MalformedChunk(f"content_block_delta has no delta object: {_excerpt(obj)}")
        sort = delta.get("type")
        if sort == "text_delta":
            return ChunkView(answer=text_of(delta, "text", "a text_delta"))
        if sort == "thinking_delta":
            return ChunkView(reasoning=text_of(delta, "thinking", "a thinking_delta"))
        if sort == "input_json_delta":
            fragment = text_of(delta, "partial_json", "an input_json_delta")
            return ChunkView(tool_calls=[{"index": obj.get("index"), "function": {"arguments": fragment}}])
        return NOTHING
    if kind == "content_block_start":
        block = obj.get("content_block")
        if block.__class__ is dict and block.get("type") == "tool_use":
            return ChunkView(tool_calls=[{"index": obj.get("index"), "id": block.get("id"),
                                          "function": {"name": block.get("name")}}])
        return NOTHING
    if kind == "ping":
        return KEEP_ALIVE
    if kind == "message_start":
        message = obj.get("message")
        if message.__class__ is not dict:
            raise MalformedChunk(f"message_start carries no message object: {_excerpt(obj)}")
        return ChunkView(usage=usage_of(message.get("usage"), with_output=False))
    if kind == "message_delta":
        delta = obj.get("delta")
        stop = delta.get("stop_reason") if delta.__class__ is dict else None
        if stop is not None and stop.__class__ is not str:
            raise MalformedChunk(f"message_delta's stop_reason is not a string: {_excerpt(stop)}")
        return ChunkView(finish_reason=stop, usage=usage_of(obj.get("usage"), with_output=True))
    if kind == "message_stop":
        return ChunkView(end=True)
    if kind == "error":
        return error_view(obj.get("error"), obj)
    return NOTHING  # content_block_stop, and event types added later


def usage_of(raw: Any, *, with_output: bool) -> Usage | None:
    """Anthropic's usage as servelab's: prompt_tokens is the whole prompt (input_tokens + the cache's read and
    creation counts), cached_tokens the part read from the cache."""
    if raw.__class__ is not dict:
        return None
    fresh, read, created = (count(raw.get(k)) for k in ("input_tokens", "cache_read_input_tokens",
                                                        "cache_creation_input_tokens"))
    prompt = None if fresh is None and read is None and created is None else \
        (fresh or 0) + (read or 0) + (created or 0)
    output = count(raw.get("output_tokens")) if with_output else None
    if prompt is None and output is None:
        return None
    return Usage(prompt_tokens=prompt, completion_tokens=output, cached_tokens=read,
                 total_tokens=prompt + output if prompt is not None and output is not None else None)


def merge_usage(held: Usage, later: Usage) -> Usage:
    """message_start says the input, message_delta the output: each field from the latest event that had it."""
    update = {k: v for k, v in later.model_dump().items() if v is not None}
    merged = held.model_copy(update=update)
    if merged.prompt_tokens is not None and merged.completion_tokens is not None:
        merged.total_tokens = merged.prompt_tokens + merged.completion_tokens
    return merged


def messages_fields(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Anthropic takes the system prompt apart (`system`), not as a message; several are joined by blank lines."""
    system = [m["content"] for m in messages if m.get("role") == "system" and isinstance(m.get("content"), str)]
    rest = [m for m in messages if m.get("role") != "system"]
    return {"system": "\n\n".join(system), "messages": rest} if system else {"messages": rest}


MESSAGES = Dialect(name="messages", path="/v1/messages", read=read_event, merge_usage=merge_usage,
                   ends_with="message_stop", max_tokens_field="max_tokens", engine_fields=False,
                   stream_options=False, content_fields=messages_fields,
                   natural_stops=frozenset({"end_turn", "stop_sequence"}))
