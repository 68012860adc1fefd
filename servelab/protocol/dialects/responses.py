"""OpenAI's Responses API streamed (`POST /v1/responses`, `stream: true`): typed events, each `event: <type>` and
`data: {"type": <type>, …}`.

What is read (the openai SDK's `openai.types.responses` names; llama.cpp's tools/server/server-task.cpp and vLLM's
entrypoints/openai/responses send the same):
- response.output_text.delta: answer text in `delta`;
- response.reasoning_text.delta (llama.cpp, vLLM) and response.reasoning_summary_text.delta (OpenAI's summaries):
  reasoning text in `delta`, kept apart from the answer;
- response.refusal.delta: the model's refusal, answer text in `delta` (what it answered instead);
- a function call: response.output_item.added with a `function_call` item (its `call_id` and `name`), then
  response.function_call_arguments.delta fragments in `delta`, both naming the item (`item.id`, `item_id`; vLLM
  adds `output_index`, llama.cpp does not, nor timings on the item): read as chat's tool_calls pieces (the call's
  first piece, then arguments pieces) placed by their item, so each is a token event with no text and the client
  joins the call (bench/tool_calls.py) as on chat;
- response.completed, or response.incomplete (OpenAI ends a response cut at max_output_tokens so; vLLM sends
  response.completed with status incomplete): the end of a complete stream; its `response.usage` has input_tokens,
  output_tokens (with input_tokens_details.cached_tokens, output_tokens_details.reasoning_tokens where sent), its
  `incomplete_details.reason` why it was cut; no `[DONE]` follows;
- response.failed (`response.error`) and `error` (`message`, `code`): the request failed in-band;
- llama.cpp adds its `timings` (predicted_n, cache_n) to the deltas when asked with timings_per_token, and to
  response.completed always: read as on chat chunks.
Every other event (response.created, response.in_progress, a message's output_item and content_part added and
done, the .done events) carries nothing a benchmark reads; the .done events repeat text the deltas already carried.
"""

from __future__ import annotations

from typing import Any

from servelab.protocol.chunks import ChunkView, MalformedChunk, _excerpt, parse_usage
from servelab.protocol.dialects.dialect import Dialect
from servelab.protocol.dialects.common import NOTHING, error_view, event_type, running_count, text_of
from servelab.records import Usage

TEXT = "response.output_text.delta"
REFUSAL = "response.refusal.delta"
CALL_STARTS = "response.output_item.added"
ARGUMENTS = "response.function_call_arguments.delta"
REASONING = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")
ENDS = ("response.completed", "response.incomplete")
FAILED = ("response.failed", "error")


def read_event(obj: Any) -> ChunkView:
    kind = event_type(obj)
    if kind == TEXT or kind in REASONING:
        text = text_of(obj, "delta", kind)
        predicted, cache_n = running_count(obj) if "timings" in obj else (None, None)
        if kind == TEXT:
            return ChunkView(answer=text, running_count=predicted, cache_n=cache_n)
        return ChunkView(reasoning=text, running_count=predicted, cache_n=cache_n)
    if kind == ARGUMENTS:
        predicted, cache_n = running_count(obj) if "timings" in obj else (None, None)
        piece = {"index": obj.get("output_index"), "item_id": obj.get("item_id"),
                 "function": {"arguments": text_of(obj, "delta", kind)}}
        return ChunkView(tool_calls=[piece], running_count=predicted, cache_n=cache_n)
    if kind == CALL_STARTS:
        item = obj.get("item")
        if item.__class__ is dict and item.get("type") == "function_call":
            piece = {"index": obj.get("output_index"), "item_id": item.get("id"),
                     "id": item.get("call_id") or item.get("id"),
                     "function": {"name": item.get("name"), "arguments": item.get("arguments") or ""}}
            predicted, cache_n = running_count(obj) if "timings" in obj else (None, None)
            return ChunkView(tool_calls=[piece], running_count=predicted, cache_n=cache_n)
        return NOTHING
    if kind == REFUSAL:
        return ChunkView(answer=text_of(obj, "delta", kind))
    if kind in ENDS:
        return _end(obj, kind)
    if kind in FAILED:
        return _failure(obj, kind)
    return NOTHING


def _end(obj: dict[str, Any], kind: str) -> ChunkView:
    response = obj.get("response")
    if response.__class__ is not dict:
        raise MalformedChunk(f"{kind} carries no response object: {_excerpt(obj)}")
    status = response.get("status")
    finish = status if status.__class__ is str else kind.removeprefix("response.")
    details = response.get("incomplete_details")
    if details.__class__ is dict and details.get("reason").__class__ is str:
        # max_output_tokens: on response.incomplete (OpenAI), or on response.completed with status incomplete (vLLM)
        finish = details["reason"]
    predicted, cache_n = running_count(obj)
    return ChunkView(finish_reason=finish, usage=usage_of(response.get("usage")), running_count=predicted,
                     cache_n=cache_n, end=True)


def usage_of(raw: Any) -> Usage | None:
    if raw.__class__ is not dict:
        return None
    inputs = raw.get("input_tokens_details")
    outputs = raw.get("output_tokens_details")
    return parse_usage({"prompt_tokens": raw.get("input_tokens"), "completion_tokens": raw.get("output_tokens"),
                        "total_tokens": raw.get("total_tokens"),
                        "completion_tokens_details": outputs if outputs.__class__ is dict else {},
                        "prompt_tokens_details": inputs if inputs.__class__ is dict else {}})


def _failure(obj: dict[str, Any], kind: str) -> ChunkView:
    if kind == "response.failed":
        response = obj.get("response") if obj.get("response").__class__ is dict else {}
        return error_view(response.get("error"), f"response.failed, status {response.get('status')!r}")
    inner = obj.get("error")  # a server that wraps it as chat streams do
    if inner is None:  # OpenAI's ResponseErrorEvent: message and code at the top
        inner = {"message": obj.get("message") or "no message", "code": obj.get("code")}
    return error_view(inner, obj)


def input_fields(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A single user message goes as the plain `input` string (what llama.cpp and vLLM render exactly as the chat
    endpoint's one user message); anything longer as the input message list, roles as they are, each item typed
    `message` (OpenAI's EasyInputMessage): llama.cpp answers an untyped assistant item with HTTP 400 "Cannot
    determine type of 'item'" (measured), so a conversation's later turns need it."""
    if len(messages) == 1 and messages[0].get("role") == "user" and isinstance(messages[0].get("content"), str):
        return {"input": messages[0]["content"]}
    return {"input": [{"type": "message", **m} for m in messages]}

RESPONSES = Dialect(name="responses", path="/v1/responses", read=read_event, merge_usage=None,
                    ends_with="response.completed", max_tokens_field="max_output_tokens", engine_fields=True,
                    stream_options=False, content_fields=input_fields,
                    # vLLM's status at a natural end; llama.cpp's too, but also at the limit (docs/metrics.md#dialects)
                    natural_stops=frozenset({"completed"}))
