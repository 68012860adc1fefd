"""A loopback HTTP server whose answers to POSTs are scripted raw bytes (issue 27): headers that never end, a
stall before any byte, an answer that asks for Basic auth. GETs (and POSTs elsewhere, as /tokenize) get a small
well-formed answer (a model list, or 404), so bench's set-up probes pass and the fault reaches the measured requests.

    with FaultyServer(fault) as srv: srv.url ...

`fault(reader, writer, request_head)` is an async function writing the answer to one POST to a completions
endpoint; the server counts the
POSTs it received (`posts`) and keeps their heads (`heads`)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable

Fault = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[None]]
MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()


def sse_answer(text: str = "hello") -> bytes:
    """A well-formed streamed chat answer of one token."""
    events = [{"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
              {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            % len(body)) + body


class FaultyServer:
    def __init__(self, fault: Fault, model: str = "m"):
        self.fault = fault
        self.models = json.dumps({"object": "list", "data": [{"id": model, "object": "model"}]}).encode()
        self.posts = 0
        self.heads: list[bytes] = []
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length:
                await reader.readexactly(length)
            self.heads.append(head)
            if head.startswith(b"POST") and b"/completions " in head.split(b"\r\n")[0]:
                self.posts += 1
                await self.fault(reader, writer, head)
            else:
                path = head.split(b" ")[1]
                if path.endswith(b"/models"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                                 b"Connection: close\r\n\r\n" % len(self.models) + self.models)
                else:
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            try:
                writer.close()
            except Exception:  # noqa: BLE001
                pass

    def _run(self) -> None:
        async def main() -> None:
            self._stop = asyncio.Event()
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            self._loop = asyncio.get_running_loop()
            self._ready.set()
            async with server:
                await self._stop.wait()
                server.close()
        asyncio.run(main())

    def __enter__(self) -> FaultyServer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)


async def never_answers(reader, writer, head) -> None:
    """Accepts the request and never sends a byte (until the client goes)."""
    await reader.read()


async def huge_header_line(reader, writer, head, size: int = 256 << 20) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Huge: ")
    block = b"a" * (1 << 20)
    for _ in range(size >> 20):
        writer.write(block)
        await writer.drain()
    writer.write(b"\r\n\r\n")
    await writer.drain()


async def many_headers(reader, writer, head, count: int = 2_000_000) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
    block = b"X-A: b\r\n" * 10_000
    for _ in range(count // 10_000):
        writer.write(block)
        await writer.drain()
    writer.write(b"\r\n")
    await writer.drain()


def basic_auth_required(user: str, password: str):
    """A fault: every completion POST without `user:password` as Basic auth gets a 401; with it, an answer."""
    import base64

    want = b"authorization: basic " + base64.b64encode(f"{user}:{password}".encode())

    async def fault(reader, writer, head) -> None:
        if any(line.lower() == want.lower() for line in head.split(b"\r\n")):
            writer.write(sse_answer())
        else:
            writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: 27\r\n"
                         b"Connection: close\r\n\r\n{\"error\": \"unauthorized\"}  ")
        await writer.drain()
    return fault


HOSTILE = "\x1b[31mred\x1b]0;pwned\x07\x9b2J\u202etxt"  # CSI, OSC with BEL, a C1 CSI, a bidi override


def hostile_answers():
    """A fault: every other completion POST is a 500 whose error message carries terminal escapes; the others
    stream an answer carrying the same."""
    seen = [0]

    async def fault(reader, writer, head) -> None:
        seen[0] += 1
        if seen[0] % 2:
            body = json.dumps({"error": {"message": f"boom {HOSTILE}", "type": "x"}}).encode()
            writer.write(b"HTTP/1.1 500 Oops\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n" % len(body) + body)
        else:
            writer.write(sse_answer(f"answer {HOSTILE}"))
        await writer.drain()
    return fault
