"""Replays of Responses and Messages streams in the real engines' formats, for the faults a real engine cannot be
made to send on demand (an error mid-stream, a stream cut before its end event, pings, reasoning a small model does
not produce). The events are llama.cpp's (tools/server/server-task.cpp, as xllamacpp 2026.10 sends them, measured),
with the additions OpenAI's and Anthropic's docs and vLLM's converters define; tests/endpoints_fake.py has the plain
answers.

A replay is a list of steps: bytes to write, or a number of seconds to wait, so a test knows when each event left
the server and can check the client's times against it. Each request's headers and body are kept for the test."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from endpoints_fake import ANSWER, message_events, response_events, typed_sse

Step = bytes | float


def typed(*events: dict[str, Any], event_lines: bool = True) -> bytes:
    return typed_sse(list(events), event_lines=event_lines)


def ping() -> bytes:
    return b"event: ping\ndata: {\"type\": \"ping\"}\n\n"


def reasoning_response_events(thinking: tuple[str, ...], answer: tuple[str, ...] = ANSWER,
                              prompt: int = 12) -> list[dict[str, Any]]:
    """llama.cpp's Responses stream for a reasoning model: a reasoning item with response.reasoning_text.delta
    events, then the message; usage counts both."""
    plain = response_events(answer, prompt)
    reasoning_item = {"id": "rs_1", "summary": [], "type": "reasoning", "content": [], "encrypted_content": "",
                      "status": "in_progress"}
    thoughts = [{"type": "response.output_item.added", "item": reasoning_item}] + [
        {"type": "response.reasoning_text.delta", "delta": piece, "item_id": "rs_1"} for piece in thinking]
    completed = plain[-1]
    completed["response"]["usage"] = {"input_tokens": prompt, "output_tokens": len(thinking) + len(answer),
                                      "total_tokens": prompt + len(thinking) + len(answer),
                                      "output_tokens_details": {"reasoning_tokens": len(thinking)}}
    return plain[:2] + thoughts + plain[2:]


def thinking_message_events(thinking: tuple[str, ...], answer: tuple[str, ...] = ANSWER,
                            prompt: int = 12) -> list[dict[str, Any]]:
    """llama.cpp's Messages stream for a reasoning model: a thinking block (thinking_delta, then an empty
    signature_delta) at index 0, the text block at index 1."""
    plain = message_events(answer, prompt)
    thoughts = [{"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}]
    thoughts += [{"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": piece}}
                 for piece in thinking]
    thoughts += [{"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": ""}},
                 {"type": "content_block_stop", "index": 0}]
    rest = [dict(event, index=1) if "index" in event else event for event in plain[1:]]
    rest[-2]["usage"] = {"output_tokens": len(thinking) + len(answer)}
    return plain[:1] + thoughts + rest


def spaced(events: list[dict[str, Any]], gap_s: float, *, event_lines: bool = True) -> list[Step]:
    """Each event in its own write, `gap_s` apart."""
    steps: list[Step] = []
    for event in events:
        steps += [typed(event, event_lines=event_lines), gap_s]
    return steps


class Replay:
    """An app that answers every POST with the next scripted stream, and keeps what each request sent."""

    def __init__(self) -> None:
        self.scripts: list[list[Step]] = []
        self.requests: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{path:.*}", self.answer)
        return app

    async def answer(self, request: web.Request) -> web.StreamResponse:
        self.requests.append({"path": request.path, "headers": dict(request.headers),
                              "body": json.loads(await request.read())})
        steps = self.scripts.pop(0)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for step in steps:
            if isinstance(step, bytes):
                await response.write(step)
            else:
                await asyncio.sleep(step)
        await response.write_eof()
        return response
