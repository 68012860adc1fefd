"""HTTP for the verify checks: base-URL handling, the reachability probe, JSON and SSE requests.

Every way a server can let a check down (refused or dropped connection, non-2xx status, HTML where JSON belongs,
invalid JSON) surfaces here as `BadResponse`, whose message is already the one-line reason a failed check shows.
Timeouts are *not* handled here: the runner owns each check's deadline and cancels the whole check.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from yarl import URL

from servelab.errors import UserError
from servelab.bench.sse import SSEDecodeError, SSEEvent, SSEParser

EXCERPT_CHARS = 500
CONNECT_TIMEOUT_S = 5.0


class BadResponse(Exception):
    """The server answered in a way an OpenAI-compatible server must not, or the transport failed. str() is the
    reason to report; `excerpt` is what the server sent, when it sent anything."""

    def __init__(self, reason: str, excerpt: str | None = None):
        super().__init__(reason)
        self.excerpt = excerpt


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
# URLs and reachability
# ----------------------------------------------------------------------------------------------------------------


def normalize_base_url(url: str) -> str:
    """`host:port`, `http://host:port/` and `http://host:port/v1` (the OpenAI SDK's base_url) all name the same
    server; checks append `/v1/...` themselves. Raises UserError for something that is not an http(s) URL."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parsed = URL(text)
    except ValueError as exc:
        raise UserError(f"invalid server URL '{url}': {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise UserError(f"invalid server URL '{url}'", hint="expected http://HOST:PORT")
    path = parsed.path.rstrip("/")
    path = path.removesuffix("/v1")
    return str(parsed.with_path(path or "/").with_query(None).with_fragment(None)).rstrip("/")


async def ensure_reachable(base_url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Open (and close) one TCP connection, so that a wrong host or port is one clear UserError instead of every
    check failing the same way. Only connecting is tested: a server that accepts and then hangs is the checks' job."""
    parsed = URL(base_url)
    host, port = parsed.host, parsed.port
    assert host is not None and port is not None  # normalize_base_url guarantees both
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        raise UserError(f"cannot reach {base_url}: connection refused",
                        hint="is the server running, and on this port?") from None
    except socket.gaierror as exc:
        raise UserError(f"cannot reach {base_url}: cannot resolve host '{host}' ({exc.strerror})") from None
    except TimeoutError:
        raise UserError(f"cannot reach {base_url}: no connection within {timeout_s:g}s") from None
    except OSError as exc:
        raise UserError(f"cannot reach {base_url}: {exc.strerror or exc}") from None
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass  # the peer may reset a connection that sent nothing; we only wanted to know it accepts


def new_session() -> aiohttp.ClientSession:
    # No total timeout here: each check has its own deadline (runner). A connect that takes longer than a few
    # seconds on a server that was reachable a moment ago is a failure worth naming on its own.
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S))


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


def _content_type(response: aiohttp.ClientResponse) -> str:
    return response.headers.get("Content-Type", "").split(";")[0].strip().lower() or "(no content type)"


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


async def request_json(session: aiohttp.ClientSession, method: str, base_url: str, path: str,
                       body: dict[str, Any] | None = None) -> JsonReply:
    try:
        async with session.request(method, base_url + path, json=body) as response:
            raw = await response.read()
            content_type = _content_type(response)
            status = response.status
    except aiohttp.ClientError as exc:
        raise BadResponse(describe_transport_error(exc)) from None
    text = raw.decode("utf-8", errors="replace")
    _check_status(method, path, status, text)
    return JsonReply(status=status, content_type=content_type, text=text, body=parse_json(text, content_type))


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


async def post_stream(session: aiohttp.ClientSession, base_url: str, path: str, body: dict[str, Any],
                      on_progress: Callable[[bytes], None] | None = None) -> StreamReply:
    """POST `body` and read the SSE response to its end. `on_progress(raw_so_far)` runs after every read, so that
    if the runner's deadline cancels the check the evidence of what had arrived is not lost."""
    parser = SSEParser()
    try:
        async with session.post(base_url + path, json=body) as response:
            reply = StreamReply(status=response.status, content_type=_content_type(response))
            if not 200 <= response.status < 300:
                text = (await response.read()).decode("utf-8", errors="replace")
                _check_status("POST", path, response.status, text)
            try:
                async for chunk in response.content.iter_any():
                    reply.raw += chunk
                    _feed(reply, parser, chunk)
                    if on_progress is not None:
                        on_progress(reply.raw)
            except aiohttp.ClientPayloadError:
                # aiohttp's message ("Response payload is not completed: <TransferEncodingError ...>") says no more.
                reply.disconnect = "the body was cut off mid-transfer"
            except aiohttp.ServerDisconnectedError:
                reply.disconnect = "the server disconnected"
    except aiohttp.ClientError as exc:
        raise BadResponse(describe_transport_error(exc)) from None
    try:
        reply.events.extend(parser.close())
    except SSEDecodeError:
        reply.undecodable = True
    if reply.undecodable:
        # The parser raises on an event that is not UTF-8 and drops what that read completed. The check fails on the
        # invalid bytes anyway (it inspects `raw`); parse a repaired copy so the rest of the stream is judged too.
        repaired = SSEParser()
        reply.events = repaired.feed(reply.raw.decode("utf-8", errors="replace").encode()) + repaired.close()
    return reply


def _feed(reply: StreamReply, parser: SSEParser, chunk: bytes) -> None:
    if reply.undecodable:
        return  # everything is re-parsed at the end
    try:
        reply.events.extend(parser.feed(chunk))
    except SSEDecodeError:
        reply.undecodable = True
