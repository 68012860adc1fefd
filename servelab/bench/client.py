"""The streaming client: one request in, one RequestRecord out, never an exception.

Timing: `perf_counter_ns()` right after each socket read returns; every event completed by that read gets that
time. The hot loop only parses SSE and JSON and appends tuples; token counting happens when the stream has
ended (bench/tokens.py).

Deadlines (all per request): connect, first byte (until the first event that carries a token), idle (the longest
gap between two reads after that), total. Whichever fires is recorded as the error kind, so a stalled stream costs `idle_s`, not hours.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from servelab.bench.chunks import error_message, read_chunk
from servelab.bench.sse import SSEDecodeError, SSEParser
from servelab.bench.tokens import RawChunk, count_tokens
from servelab.records import ErrorKind, RequestRecord, Usage

_EXCERPT = 300


@dataclass(frozen=True)
class Deadlines:
    connect_s: float = 10.0
    first_byte_s: float = 120.0
    idle_s: float = 60.0
    total_s: float = 900.0


@dataclass
class RequestSpec:
    """What to send. `body` is the OpenAI request without the streaming fields; the client adds those."""

    endpoint: str
    body: dict[str, Any]
    index: int = 0
    tag: str = ""
    warmup: bool = False
    input_tokens: int | None = None
    headers: dict[str, str] = field(default_factory=dict)  # per-request headers (e.g. a calibration id)


class _StreamState:
    """What the hot loop accumulates for one stream. A plain slotted object: setting a pydantic field costs
    ~10x more, and this is touched once per event."""

    __slots__ = ("chunks", "usage", "finish_reason", "events", "saw_done")

    def __init__(self) -> None:
        self.chunks: list[RawChunk] = []
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.events = 0  # SSE data events, [DONE] excluded
        self.saw_done = False

    def on_event(self, data: str, now_ns: int) -> bool:
        """Handle one SSE event; True when the stream is finished ([DONE])."""
        if data == "[DONE]":
            self.saw_done = True
            return True
        self.events += 1
        try:
            obj = orjson.loads(data)  # ~3x faster than json on these small objects: the client's biggest cost
        except orjson.JSONDecodeError:
            raise _Failure("parse", f"event is not JSON: {data[:_EXCERPT]!r}") from None
        view = read_chunk(obj)
        if view.error is not None:
            raise _Failure("in_band", view.error)
        if view.usage is not None:
            self.usage = view.usage
        if view.finish_reason is not None:
            self.finish_reason = view.finish_reason
        if view.answer or view.reasoning or view.running_count is not None:
            self.chunks.append(RawChunk(now_ns, view.answer, view.reasoning, view.running_count))
        return False


@dataclass
class _Failure(Exception):
    kind: ErrorKind
    detail: str
    status: int | None = None


@dataclass
class ClientOptions:
    deadlines: Deadlines = field(default_factory=Deadlines)
    api_key: str | None = None  # sent as a bearer token; never written anywhere
    stream_extras: dict[str, Any] = field(default_factory=dict)  # engine-specific request fields
    include_usage: bool = True


class StreamClient:
    """A pooled aiohttp session that sends streaming requests and records them. Use as an async context manager."""

    def __init__(self, base_url: str, options: ClientOptions | None = None):
        self.base_url = base_url.rstrip("/")
        self.options = options or ClientOptions()
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> StreamClient:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.options.api_key:
            headers["Authorization"] = f"Bearer {self.options.api_key}"
        # One connection per request: llama.cpp's server closes the connection after every stream although it
        # advertises keep-alive, and a pooled client then writes its next request into a dead socket. A loopback
        # connect costs ~0.1 ms, which TTFT includes as any fresh client would pay it.
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=True)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.options.deadlines.connect_s)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers,
                                              read_bufsize=1 << 20, auto_decompress=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def build_body(self, spec: RequestSpec) -> dict[str, Any]:
        body = dict(spec.body)
        body["stream"] = True
        extras = dict(self.options.stream_extras)
        stream_options = {**(extras.pop("stream_options", None) or {}), **(body.get("stream_options") or {})}
        if self.options.include_usage:
            stream_options.setdefault("include_usage", True)
        if stream_options:
            body["stream_options"] = stream_options
        for key, value in extras.items():
            body.setdefault(key, value)  # what the workload set explicitly wins over the engine's extras
        return body

    async def send(self, spec: RequestSpec, scheduled_ns: int | None = None) -> RequestRecord:
        assert self._session is not None, "use StreamClient as an async context manager"
        body = self.build_body(spec)
        payload = json.dumps(body).encode()
        sampling = {k: body[k] for k in ("temperature", "top_p", "top_k", "seed", "ignore_eos", "min_tokens")
                    if k in body}
        record = RequestRecord(index=spec.index, tag=spec.tag, warmup=spec.warmup, endpoint=spec.endpoint,
                               input_tokens=spec.input_tokens, max_tokens=body.get("max_tokens"),
                               sampling=sampling, scheduled_ns=scheduled_ns, t_send_ns=time.perf_counter_ns())
        state = _StreamState()
        try:
            await self._stream(payload, spec.endpoint, record, state, spec.headers)
            record.ok = True
        except _Failure as f:
            record.error_kind, record.error_detail, record.http_status = f.kind, f.detail, f.status or \
                record.http_status
        finally:
            if record.t_end_ns is None:
                record.t_end_ns = time.perf_counter_ns()
            record.chunks, record.saw_done, record.finish_reason = state.events, state.saw_done, \
                state.finish_reason
        record.usage = state.usage
        record.events, record.count_method = count_tokens(state.chunks, state.usage)
        return record

    async def _stream(self, payload: bytes, endpoint: str, record: RequestRecord, state: _StreamState,
                      headers: dict[str, str]) -> None:
        d = self.options.deadlines
        loop = asyncio.get_running_loop()
        start = loop.time()
        first_byte_deadline, total_deadline = start + d.first_byte_s, start + d.total_s
        chunks = state.chunks

        def next_deadline() -> tuple[float, ErrorKind]:
            # Until the first token: the first-byte deadline (a role chunk sent with the headers does not end it:
            # prefill of a long prompt can take longer than any idle gap); then the idle gap; never past the total.
            if not chunks:
                limit, kind = first_byte_deadline, "timeout_first_byte"
            else:
                limit, kind = loop.time() + d.idle_s, "timeout_idle"
            return (limit, kind) if limit < total_deadline else (total_deadline, "timeout_total")

        limit, phase = next_deadline()
        try:
            async with asyncio.timeout_at(limit) as guard:
                async with self._session.post(self.base_url + endpoint, data=payload,
                                              headers=headers or None) as resp:
                    record.t_headers_ns = time.perf_counter_ns()
                    record.http_status = resp.status
                    if resp.status >= 400:
                        raise _Failure("http", f"HTTP {resp.status}: {await _error_text(resp)}", resp.status)
                    ctype = resp.headers.get("Content-Type", "")
                    if "text/event-stream" not in ctype:
                        raise _Failure("parse", await _not_a_stream(resp, ctype), resp.status)
                    parser = SSEParser()
                    done = False
                    while not done:
                        data = await resp.content.readany()
                        now_ns = time.perf_counter_ns()
                        if not data:  # end of body
                            for ev in parser.close():
                                done = state.on_event(ev.data, now_ns)
                            if not done and state.finish_reason is None:
                                raise _Failure("disconnect", f"connection closed after {state.events} events, "
                                                             "before any finish_reason or [DONE]")
                            # A clean end after finish_reason is a complete answer even without [DONE]
                            # (transformers serve never sends it); `saw_done` keeps the deviation visible.
                            break
                        for ev in parser.feed(data):
                            if state.on_event(ev.data, now_ns):
                                done = True
                                break
                        limit, phase = next_deadline()
                        guard.reschedule(limit)
                    record.t_end_ns = time.perf_counter_ns()
        except TimeoutError:
            waited = loop.time() - start
            raise _Failure(phase, f"{phase.removeprefix('timeout_').replace('_', ' ')} deadline passed after "
                                  f"{waited:.1f}s ({state.events} events received)") from None
        except aiohttp.ClientConnectorError as exc:
            raise _Failure("timeout_connect" if isinstance(exc, aiohttp.ConnectionTimeoutError) else "connect",
                           f"cannot connect: {exc.os_error or exc}") from None
        except aiohttp.ConnectionTimeoutError as exc:
            raise _Failure("timeout_connect", f"connect deadline passed: {exc}") from None
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise _Failure("disconnect", f"connection lost after {state.events} events: "
                                         f"{type(exc).__name__}: {exc}") from None
        except aiohttp.ClientResponseError as exc:
            raise _Failure("http", f"HTTP {exc.status}: {exc.message}", exc.status) from None
        except SSEDecodeError as exc:
            raise _Failure("parse", str(exc)) from None


async def _error_text(resp: aiohttp.ClientResponse) -> str:
    raw = await resp.read()
    text = raw.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
        if isinstance(obj, dict) and "error" in obj:
            return error_message(obj["error"])[:_EXCERPT]
        if isinstance(obj, dict) and "detail" in obj:
            return str(obj["detail"])[:_EXCERPT]
    except ValueError:
        pass
    return " ".join(text.split())[:_EXCERPT] or resp.reason or ""


async def _not_a_stream(resp: aiohttp.ClientResponse, ctype: str) -> str:
    raw = await resp.read()
    text = " ".join(raw.decode("utf-8", "replace").split())
    if "json" in ctype:
        try:
            obj = json.loads(raw)
            if isinstance(obj, dict) and "error" in obj:
                return f"server answered a JSON error instead of a stream: {error_message(obj['error'])}"
        except ValueError:
            return f"expected an event stream, got invalid JSON: {text[:_EXCERPT]!r}"
        return f"expected an event stream, got a JSON body (does the server support stream=true?): " \
               f"{text[:_EXCERPT]!r}"
    return f"expected an event stream, got {ctype or 'no content type'}: {text[:_EXCERPT]!r}"
