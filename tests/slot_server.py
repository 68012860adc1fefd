"""A tiny OpenAI-compatible streaming server whose latency rises with load: it serves `--slots` requests at a time
and queues the rest (first come, first served), as an inference engine with a fixed batch does.

Why not the calibration server: its timing is scripted per request and does not depend on how many requests are
in flight, so it has no capacity to find. Here the capacity is known by construction: each request holds a slot
for ttft + (tokens - 1) * itl, so at most `slots / service time` requests/s fit, and a closed loop of more than
`slots` streams makes every request wait about one service time for a slot.

    python tests/slot_server.py --slots 2 --ttft-ms 20 --itl-ms 10 --tokens 6
prints `LISTENING <port>` once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from aiohttp import web


def chunk(content: str | None, finish: str | None = None, usage: dict | None = None) -> bytes:
    body: dict = {"id": "slot", "object": "chat.completion.chunk", "model": "slot",
                  "choices": [] if usage else [{"index": 0, "delta": {"content": content} if content else {},
                                                "finish_reason": finish}]}
    if usage:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n".encode()


def make_app(slots: int, ttft_ms: float, itl_ms: float, tokens: int) -> web.Application:
    gate = asyncio.Semaphore(slots)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "slot", "object": "model"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        async with gate:  # queued here while every slot is busy: the load-dependent part of TTFT
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            start = time.monotonic()
            for i in range(tokens):
                due = start + (ttft_ms + i * itl_ms) / 1000
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                await resp.write(chunk(f" t{i}", "length" if i == tokens - 1 else None))
            await resp.write(chunk(None, usage={"prompt_tokens": 4, "completion_tokens": tokens,
                                                "total_tokens": 4 + tokens}))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def serve(args: argparse.Namespace) -> None:
    runner = web.AppRunner(make_app(args.slots, args.ttft_ms, args.itl_ms, args.tokens), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"LISTENING {runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--tokens", type=int, default=6)
    try:
        asyncio.run(serve(p.parse_args()))
    except KeyboardInterrupt:
        pass
