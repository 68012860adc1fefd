"""The endpoints beyond chat for tests/openai_fake.py's well-behaved server, in the formats llama.cpp's server
(xllamacpp 2026.10) sends them, read from its real answers: /v1/embeddings, /v1/rerank, response_format on chat,
streamed tool calls, /v1/responses and /v1/messages. Each builder takes parameters so that a test can break one
part (a wrong order, a missing event) and keep the rest as the real engine sends it.

Its "embedding model" counts words into hashed buckets and its "reranker" counts the query's words in each document:
deterministic, and right about the obvious cases the checks ask about."""

from __future__ import annotations

import json
import math
import re
import zlib
from typing import Any

from aiohttp import web

from openai_fake import MODEL, chunk, sse, usage, words_of, write_events

EMBEDDING_DIMENSION = 16
PERSON = {"name": "Pip", "age": 7}
WEATHER_ARGUMENT_FRAGMENTS = ('{"ci', 'ty": "Pa', 'ris"}')


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def embed(text: str, *, normalise: bool = True) -> list[float]:
    vector = [0.0] * EMBEDDING_DIMENSION
    for word in words(text):
        vector[zlib.crc32(word.encode()) % EMBEDDING_DIMENSION] += 1.0
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector] if normalise else vector


def embeddings_body(inputs: list[str], *, normalise: bool = True) -> dict[str, Any]:
    tokens = sum(len(words(text)) for text in inputs)
    return {"model": MODEL, "object": "list", "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "data": [{"embedding": embed(text, normalise=normalise), "index": i, "object": "embedding"}
                     for i, text in enumerate(inputs)]}


async def embeddings(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
    return web.json_response(embeddings_body(inputs))


def rerank_body(query: str, documents: list[str], *, reverse: bool = False) -> dict[str, Any]:
    """llama.cpp's answer: results sorted by relevance_score, best first. `reverse` scores the worst first."""
    asked = set(words(query))
    scores = [len(asked & set(words(document))) / (len(asked) or 1) for document in documents]
    if reverse:
        scores = [1 - score for score in scores]
    results = sorted(({"index": i, "relevance_score": s} for i, s in enumerate(scores)),
                     key=lambda r: -r["relevance_score"])
    tokens = words_of({"prompt": query}) * len(documents) + sum(len(words(d)) for d in documents)
    return {"model": MODEL, "object": "list", "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": results}


async def rerank(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    return web.json_response(rerank_body(body["query"], body["documents"]))


def structured_text(body: dict[str, Any]) -> str:
    kind = body["response_format"]["type"]
    return json.dumps(PERSON if kind == "json_schema" else {"answer": 4}, indent=2)


def tool_call_events(body: dict[str, Any], fragments: tuple[str, ...] = WEATHER_ARGUMENT_FRAGMENTS,
                     name: str = "get_weather", finish: str = "tool_calls") -> list[dict[str, Any] | str]:
    """A streamed tool call as llama.cpp streams one: the id, type and name on the first delta with empty
    arguments, then the arguments in fragments, a finish chunk, the usage chunk and [DONE]."""
    events: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": ""}}]})]
    events += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}) for piece in fragments]
    events += [chunk({}, finish), chunk(usage=usage(words_of(body) + 40, 9)), "[DONE]"]
    return events


async def streamed_tools(request: web.Request) -> web.StreamResponse:
    return await write_events(request, tool_call_events(await request.json()))


# ---- the Responses API -----------------------------------------------------------------------------------------

ANSWER = ("The", " answer", " is", " 4.")


def response_object(text: str, prompt: int, output: int, status: str = "completed") -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "created_at": 1, "status": status, "model": MODEL,
            "output": [{"type": "message", "status": "completed", "id": "msg_1", "role": "assistant",
                        "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}]}],
            "usage": {"input_tokens": prompt, "output_tokens": output, "total_tokens": prompt + output}}


def response_events(pieces: tuple[str, ...] = ANSWER, prompt: int = 12) -> list[dict[str, Any]]:
    """The events llama.cpp streams for a response, in its order."""
    text = "".join(pieces)
    started = {"id": "resp_1", "object": "response", "status": "in_progress"}
    item = {"content": [], "id": "msg_1", "role": "assistant", "status": "in_progress", "type": "message"}
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    return ([{"type": "response.created", "response": started},
             {"type": "response.in_progress", "response": started},
             {"type": "response.output_item.added", "item": item},
             {"type": "response.content_part.added", "item_id": "msg_1", "part": {"type": "output_text", "text": ""}}]
            + [{"type": "response.output_text.delta", "item_id": "msg_1", "delta": piece} for piece in pieces]
            + [{"type": "response.output_text.done", "item_id": "msg_1", "text": text},
               {"type": "response.content_part.done", "item_id": "msg_1", "part": part},
               {"type": "response.output_item.done", "item": item | {"status": "completed", "content": [part]}},
               {"type": "response.completed", "response": response_object(text, prompt, len(pieces))}])


def typed_sse(events: list[dict[str, Any]], *, event_lines: bool = True) -> bytes:
    """`event: <type>` and `data: <json>` per event, as llama.cpp, vLLM, OpenAI and Anthropic send them."""
    return b"".join((f"event: {event['type']}\n".encode() if event_lines else b"") + sse(event) for event in events)


async def responses(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        return web.json_response(response_object("".join(ANSWER), 12, len(ANSWER)))
    return web.Response(body=typed_sse(response_events()), headers={"Content-Type": "text/event-stream"})


# ---- Anthropic's Messages API ----------------------------------------------------------------------------------


def message_object(text: str, prompt: int, output: int, stop_reason: str = "end_turn") -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": text}],
            "model": MODEL, "stop_reason": stop_reason, "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": output}}


def message_events(pieces: tuple[str, ...] = ANSWER, prompt: int = 12) -> list[dict[str, Any]]:
    """The events llama.cpp streams for a message, in Anthropic's order."""
    start = message_object("", prompt, 0) | {"content": [], "stop_reason": None}
    return ([{"type": "message_start", "message": start},
             {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]
            + [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
               for piece in pieces]
            + [{"type": "content_block_stop", "index": 0},
               {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": len(pieces)}},
               {"type": "message_stop"}])


async def messages(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        return web.json_response(message_object("".join(ANSWER), 12, len(ANSWER)))
    return web.Response(body=typed_sse(message_events()), headers={"Content-Type": "text/event-stream"})
