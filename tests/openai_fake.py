"""A small, well-behaved OpenAI-compatible server for verify's fault tests, whose parts can be swapped for broken
ones. It is a test double for misbehaving engines (a real engine cannot be made to misbehave on demand); that the
unbroken double passes every check is itself a test (test_verify_checks.py), so each fault test differs from a
passing server in exactly the broken part.

Its "model" answers by reciting a fixed text, one word per token: deterministic, honours max_tokens and stop, and
its /tokenize counts words, so usage can be checked exactly.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MODEL = "fake"
STORY = ("Once upon a time in a café by the harbour there lived a robot named Pip who wanted to paint the sea "
         "at dawn with every colour it could find while fishermen told long stories about the waves").split()
CONTEXT = 512
USAGE = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}


@contextmanager
def serving(app: web.Application) -> Iterator[str]:
    """Run `app` on a free 127.0.0.1 port in a background thread; yield its base URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    # A short shutdown_timeout: handlers that hang on purpose must not hold up the teardown.
    runner = web.AppRunner(app, shutdown_timeout=0.2, access_log=None)

    async def start() -> int:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner.addresses[0][1]

    async def stop() -> None:
        await runner.cleanup()
        # Handlers that hang on purpose outlive the cleanup; end them so the loop closes without complaints.
        leftovers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in leftovers:
            task.cancel()
        await asyncio.gather(*leftovers, return_exceptions=True)

    port = asyncio.run_coroutine_threadsafe(start(), loop).result(5)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def sse(*events: dict[str, Any] | str) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, str) else json.dumps(e)).encode() + b"\n\n" for e in events)


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def words_of(body: dict[str, Any]) -> int:
    if "prompt" in body:
        return len(str(body["prompt"]).split())
    return sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))


def recite(body: dict[str, Any]) -> tuple[list[str], str]:
    """The answer's tokens (words, each but the first with its leading space) and its finish_reason."""
    limit = body.get("max_tokens", 16)
    if "2+2" in json.dumps(body.get("messages")):
        return ["Four."], "stop"  # the story's question gets the right answer
    pieces = [w if i == 0 else " " + w for i, w in enumerate(STORY[:limit])]
    finish = "length" if limit < len(STORY) else "stop"
    text = "".join(pieces)
    cuts = [text.index(stop) for stop in body.get("stop") or [] if stop in text]
    if cuts:
        cut, kept, length = min(cuts), [], 0
        for piece in pieces:
            if length + len(piece) > cut:
                if cut > length:
                    kept.append(piece[:cut - length])
                break
            kept.append(piece)
            length += len(piece)
        pieces, finish = kept, "stop"
    return pieces, finish


class FakeOpenAI:
    """The routes of a correct server. Override a method (or pass a handler) to break one thing."""

    def __init__(self, **routes: Handler) -> None:
        self.routes = routes
        self.requests: list[dict[str, Any]] = []  # bodies and headers seen, for tests that look at them

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.routes.get("models", self.models))
        app.router.add_post("/v1/chat/completions", self.routes.get("chat_route", self.chat_route))
        app.router.add_post("/v1/completions", self.routes.get("completions", self.completions))
        app.router.add_post("/tokenize", self.routes.get("tokenize", self.tokenize))
        app.router.add_get("/props", self.routes.get("props", self.props))
        import endpoints_fake  # the endpoints beyond chat, in llama.cpp's formats (it imports this module)
        for path, name in (("/v1/embeddings", "embeddings"), ("/v1/rerank", "rerank"), ("/v1/responses", "responses"),
                           ("/v1/messages", "messages")):
            app.router.add_post(path, self.routes.get(name, getattr(endpoints_fake, name)))
        return app

    # ---- routes ----

    async def models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def props(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"default_generation_settings": {"n_ctx": CONTEXT}})

    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if "content" not in body:
            return web.json_response(error_body("content is required"), status=400)
        return web.json_response({"tokens": list(range(len(body["content"].split())))})

    async def chat_route(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"body": body, "headers": dict(request.headers)})
        refusal = self.refuse(body)
        if refusal is not None:
            return refusal
        if body.get("response_format"):
            return await self.routes.get("structured", self.structured)(request)
        if body.get("tools") and body.get("stream"):
            import endpoints_fake
            return await self.routes.get("tools_stream", endpoints_fake.streamed_tools)(request)
        if body.get("tools"):
            return await self.routes.get("tools", self.tools)(request)
        return await self.routes.get("stream" if body.get("stream") else "chat",
                                     self.stream if body.get("stream") else self.chat)(request)

    def refuse(self, body: dict[str, Any]) -> web.StreamResponse | None:
        if body.get("model") != MODEL:
            return web.json_response(error_body(f"model {body.get('model')!r} not found", "not_found_error"),
                                     status=404)
        if not isinstance(body.get("temperature", 0), (int, float)):
            return web.json_response(error_body("temperature must be a number"), status=400)
        if body.get("max_tokens", 1) < 1:
            return web.json_response(error_body("max_tokens must be at least 1"), status=400)
        if words_of(body) > CONTEXT:
            return web.json_response(error_body("the prompt exceeds the context"), status=400)
        return None

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        pieces, finish = recite(body)
        return web.json_response(completion("".join(pieces), finish, words_of(body), len(pieces)))

    async def stream(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        pieces, finish = recite(body)
        events: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": piece}) for piece in pieces]
        events += [chunk({}, finish), chunk(usage=usage(words_of(body), len(pieces))), "[DONE]"]
        return await write_events(request, events)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        pieces, finish = recite(body)
        prompt, done = words_of(body), len(pieces)
        if not body.get("stream"):
            return web.json_response({"id": "t1", "object": "text_completion", "model": MODEL,
                                      "choices": [{"index": 0, "text": "".join(pieces), "finish_reason": finish}],
                                      "usage": usage(prompt, done)})
        def text_chunk(text: str, finish_reason: str | None = None) -> dict[str, Any]:
            return {"id": "t1", "object": "text_completion", "model": MODEL,
                    "choices": [{"index": 0, "text": text, "finish_reason": finish_reason}]}
        events: list[dict[str, Any] | str] = [text_chunk(piece) for piece in pieces]
        events += [text_chunk("", finish), {"id": "t1", "object": "text_completion", "model": MODEL,
                                            "choices": [], "usage": usage(prompt, done)}, "[DONE]"]
        return await write_events(request, events)

    async def structured(self, request: web.Request) -> web.StreamResponse:
        import endpoints_fake
        body = await request.json()
        text = endpoints_fake.structured_text(body)
        return web.json_response(completion(text, "stop", words_of(body), len(text.split())))

    async def tools(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]}
        return web.json_response(completion("", "tool_calls", words_of(body) + 40, 9) | {
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})


def usage(prompt: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens}


def completion(text: str = "4", finish: str = "stop", prompt: int = 10, completion_tokens: int = 1,
               **overrides: Any) -> dict[str, Any]:
    body = {"id": "c1", "object": "chat.completion", "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": usage(prompt, completion_tokens)}
    return body | overrides


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "c1", "object": "chat.completion.chunk", "model": MODEL, "choices": choices} | extra


async def write_events(request: web.Request, events: list[dict[str, Any] | str],
                       gap_s: float = 0.0) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in events:
        await response.write(sse(event))
        if gap_s:
            await asyncio.sleep(gap_s)
    await response.write_eof()
    return response


def json_route(body: Any, status: int = 200) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(body, status=status)
    return handler


def bytes_route(body: bytes, content_type: str = "text/event-stream", status: int = 200) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, status=status, headers={"Content-Type": content_type})
    return handler
