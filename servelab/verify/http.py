"""HTTP for the verify checks: base-URL handling, the reachability probe, JSON and SSE requests.

Every way a server can let a check down (refused or dropped connection, non-2xx status, a redirect, HTML where JSON
belongs, invalid JSON, a response past verify's bounds) surfaces here as `BadResponse`, whose message is already the
one-line reason a failed check shows. The requests go through bench's HTTP/1.1 exchange with verify's bounds
(transport.py); the aiohttp session only carries the API key header (and serves engine detection).
Timeouts are *not* handled here: the runner owns each check's deadline and cancels the whole check.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from servelab.net import CONNECT_TIMEOUT_S, ensure_reachable, normalize_base_url  # noqa: F401 (re-exported)
from servelab.protocol.sse import SSEDecodeError, SSEEvent, SSEParser
from servelab.verify.transport import (MAX_EVENTS, MAX_LINE_BYTES, BadResponse, Flight, Overflow,  # noqa: F401
                                       exchange, mib)

EXCERPT_CHARS = 500


# ----------------------------------------------------------------------------------------------------------------
# Text helpers
# ----------------------------------------------------------------------------------------------------------------


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """The start of `text`, at most `limit` characters including the ellipsis that marks a cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def excerpt_ends(text: str, limit: int = EXCERPT_CHARS) -> str:
    """The start and the end of `text`: for streams, whose end ([DONE], usage) matters as much as their start."""
    if len(text) <= limit:
        return text
    half = (limit - 3) // 2
    return text[:half] + " … " + text[-half:]


def one_line(text: str, limit: int = 80) -> str:
    """`text` squeezed into a reason: whitespace runs collapsed, cut at `limit` characters."""
    return excerpt(" ".join(text.split()), limit)


# ----------------------------------------------------------------------------------------------------------------
# Sessions and errors
# ----------------------------------------------------------------------------------------------------------------


def new_session(api_key: str | None = None) -> aiohttp.ClientSession:
    # No total timeout here: each check has its own deadline (runner). A connect that takes longer than a few
    # seconds on a server that was reachable a moment ago is a failure worth naming on its own.
    # The API key travels only in this header: evidence records request bodies, never headers.
    # A fresh connection per request: servers differ in whether a connection stays usable after a stream (llama.cpp
    # closes it, and the next request on the pooled connection then fails with nothing sent), and a check must not
    # fail for how the previous one left the pool.
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
                                 headers=headers, connector=aiohttp.TCPConnector(force_close=True))


def describe_transport_error(exc: aiohttp.ClientError) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        cause = exc.os_error
        if isinstance(cause, ConnectionRefusedError):
            return "cannot connect: connection refused"
        return f"cannot connect: {cause.strerror or cause}"
    if isinstance(exc, aiohttp.ServerTimeoutError):  # only the connect phase has an aiohttp timeout (new_session)
        return f"cannot connect: no connection within {CONNECT_TIMEOUT_S:g}s"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection without answering"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the connection closed before the response was complete"
    return f"{type(exc).__name__}: {exc}"


# ----------------------------------------------------------------------------------------------------------------
# JSON requests
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class JsonReply:
    status: int
    content_type: str
    text: str
    body: Any  # the parsed JSON document


def _content_type(headers: dict[str, str]) -> str:
    return headers.get("Content-Type", "").split(";")[0].strip().lower() or "(no content type)"


def _check_status(method: str, path: str, status: int, text: str) -> None:
    if not 200 <= status < 300:
        raise BadResponse(f"HTTP {status} from {method} {path}: {one_line(text) or '(empty body)'}", excerpt(text))


def parse_json(text: str, content_type: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        shown = one_line(text) or "(empty body)"
        if "json" not in content_type:
            raise BadResponse(f"expected JSON, got {content_type}: {shown}", excerpt(text)) from None
        raise BadResponse(f"invalid JSON ({exc.msg} at char {exc.pos}): {shown}", excerpt(text)) from None


@dataclass
class RawReply:
    """An answer of any status, its body not yet judged: for checks that expect an error, or a missing endpoint."""

    status: int
    content_type: str
    text: str

    def json(self) -> Any:
        """The parsed body, or None when it is not JSON."""
        try:
            return json.loads(self.text)
        except json.JSONDecodeError:
            return None


def _auth(session: aiohttp.ClientSession | None) -> dict[str, str]:
    value = session.headers.get("Authorization") if session is not None else None
    return {"Authorization": value} if value else {}


async def request_raw(session: aiohttp.ClientSession | None, method: str, base_url: str, path: str,
                      body: dict[str, Any] | None = None) -> RawReply:
    """Send one request and return whatever status came back. Transport failures, redirects and responses past
    verify's bounds still raise BadResponse."""
    payload = json.dumps(body).encode() if body is not None else None
    got = await exchange(method, base_url, path, payload, _auth(session))
    if got.disconnect is not None:
        raise BadResponse("the connection closed before the response was complete", excerpt(_text(got.body)))
    assert got.status is not None
    return RawReply(status=got.status, content_type=_content_type(got.headers), text=_text(got.body))


def _text(raw: bytes | bytearray) -> str:
    return bytes(raw).decode("utf-8", errors="replace")


def excerpt_ends_bytes(raw: bytes | bytearray) -> str | None:
    """An excerpt of the start and the end of `raw`, decoding only those (it may be megabytes)."""
    if not raw:
        return None
    if len(raw) <= 4 * EXCERPT_CHARS:
        return excerpt_ends(_text(raw))
    return excerpt_ends(_text(raw[:2 * EXCERPT_CHARS]) + _text(raw[-2 * EXCERPT_CHARS:]))


async def request_json(session: aiohttp.ClientSession, method: str, base_url: str, path: str,
                       body: dict[str, Any] | None = None) -> JsonReply:
    reply = await request_raw(session, method, base_url, path, body)
    _check_status(method, path, reply.status, reply.text)
    return JsonReply(status=reply.status, content_type=reply.content_type, text=reply.text,
                     body=parse_json(reply.text, reply.content_type))


# ----------------------------------------------------------------------------------------------------------------
# Streaming requests
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class StreamReply:
    """Everything a stream delivered, including when it broke off: a check judges a partial stream too."""

    status: int
    content_type: str
    raw: bytes = b""
    events: list[SSEEvent] = field(default_factory=list)
    disconnect: str | None = None  # why the body ended early, when the transport broke instead of ending cleanly
    undecodable: bool = False  # some event's data was not UTF-8
    # perf_counter() times: request sent, first body bytes, end of the body (for telling overlap from queueing)
    sent_at: float = 0.0
    first_bytes_at: float | None = None
    ended_at: float | None = None
    event_times: list[float] = field(default_factory=list)  # when each of `events` was complete


async def post_stream(session: aiohttp.ClientSession | None, base_url: str, path: str, body: dict[str, Any],
                      on_progress: Callable[[bytes], None] | None = None) -> StreamReply:
    """POST `body` and read the SSE response to its end. `on_progress(raw_so_far)` runs after every read, so that
    if the runner's deadline cancels the check the evidence of what had arrived is not lost. A stream past verify's
    bounds (bytes, events, one event's size) raises Overflow naming the bound and what had arrived."""
    parser = SSEParser()
    reply = StreamReply(status=0, content_type="", sent_at=time.perf_counter())
    raw = bytearray()
    flight = Flight(sent_at=reply.sent_at)
    line = [0]  # bytes of the line not yet ended

    def sink(chunk: bytes) -> None:
        if reply.first_bytes_at is None:
            reply.first_bytes_at = time.perf_counter()
        raw.extend(chunk)
        newline = chunk.rfind(b"\n")
        line[0] = len(chunk) - newline - 1 if newline >= 0 else line[0] + len(chunk)
        if line[0] > MAX_LINE_BYTES:
            raise Overflow(f"a line of the stream grew past {mib(MAX_LINE_BYTES)} without its end "
                           f"({len(raw):,} bytes and {len(reply.events):,} complete events read; the rest was not)")
        before = len(reply.events)
        _feed(reply, parser, chunk)
        if len(reply.events) > before:
            flight.progress_at = time.perf_counter()
        if len(reply.events) > MAX_EVENTS:
            raise Overflow(f"the stream sent more than {MAX_EVENTS:,} events ({len(raw):,} bytes): "
                           "the rest was not read")
        reply.event_times.extend([time.perf_counter()] * (len(reply.events) - len(reply.event_times)))
        if on_progress is not None:
            on_progress(raw)

    try:
        got = await exchange("POST", base_url, path, json.dumps(body).encode(), _auth(session), sink, flight=flight)
    except Overflow as exc:
        seen = f" ({len(reply.events):,} complete events read)" if raw and "events" not in str(exc) else ""
        raise Overflow(f"{exc}{seen}", exc.excerpt or excerpt_ends_bytes(raw)) from None
    assert got.status is not None
    reply.status, reply.content_type = got.status, _content_type(got.headers)
    if not 200 <= got.status < 300:
        _check_status("POST", path, got.status, _text(got.body))
    reply.raw = bytes(raw)
    reply.disconnect = got.disconnect
    reply.ended_at = time.perf_counter()
    try:
        reply.events.extend(parser.close())
    except SSEDecodeError:
        reply.undecodable = True
    if reply.undecodable:
        # The parser raises on an event that is not UTF-8 and drops what that read completed. The check fails on the
        # invalid bytes anyway (it inspects `raw`); parse a repaired copy so the rest of the stream is judged too.
        repaired = SSEParser()
        try:
            reply.events = repaired.feed(reply.raw.decode("utf-8", errors="replace").encode()) + repaired.close()
        except SSEDecodeError as exc:  # an event past the parser's size bound: judge what came before it
            reply.events = exc.events
    # Events completed only by the end of the body (or re-parsed above) count as arriving at the end.
    del reply.event_times[len(reply.events):]
    reply.event_times.extend([reply.ended_at] * (len(reply.events) - len(reply.event_times)))
    return reply


def _feed(reply: StreamReply, parser: SSEParser, chunk: bytes) -> None:
    if reply.undecodable:
        return  # everything is re-parsed at the end
    try:
        reply.events.extend(parser.feed(chunk))
    except SSEDecodeError:
        reply.undecodable = True
