"""verify's requests, through bench's HTTP/1.1 exchange (protocol/http1.py) with verify's bounds on top.

bench's exchange already bounds the response head (http1.MAX_HEAD_BYTES in all, MAX_HEADER_LINE_BYTES a header,
MAX_HEADERS headers), inflates a compressed body a step at a time and never follows a redirect; verify adds, per
response, what a check of a small answer needs and a hostile server must not get past:

- the body (after inflating) at most MAX_BODY_BYTES, a stream at most MAX_EVENTS events and one line of it at most
  MAX_LINE_BYTES (the SSE parser's own bound, protocol/sse.py, is 16 MiB an event: four streams at once each holding
  that much, and the copies a line that long costs to parse, would be 300 MB).

A response past a bound ends at once (the rest is not read) with an `Overflow`, whose message names the bound and
what was seen. Whatever the server sent that is not HTTP becomes a one-line `BadResponse` naming it, never a library
error with a status the server did not send. Each request in flight is listed in FLIGHTS (per check), so that the
runner can tell, when a check reaches its deadline, whether the server had stopped answering.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import re
import ssl
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from servelab.protocol import http1
from servelab.net import CONNECT_TIMEOUT_S

MAX_BODY_BYTES = 16 << 20  # one response's body, after inflating: verify's answers are a few kB
MAX_EVENTS = 100_000  # SSE events in one stream (a 64-token answer is ~70)
MAX_LINE_BYTES = 1 << 20  # one line of a stream (the SSE parser's own bound, 16 MiB, is bench's)


class BadResponse(Exception):
    """The server answered in a way an OpenAI-compatible server must not, or the transport failed. str() is the
    reason to report; `excerpt` is what the server sent, when it sent anything."""

    def __init__(self, reason: str, excerpt: str | None = None):
        super().__init__(reason)
        self.excerpt = excerpt


class Overflow(BadResponse):
    """A response went past one of verify's bounds (a flooding or hostile server): the rest was not read."""


@dataclass(eq=False)  # hashed by identity: kept in a set
class Flight:
    """One request in flight, for the runner's "did the server stop answering?" when a check's deadline passes."""

    sent_at: float
    first_byte_at: float | None = None  # any byte of the response
    progress_at: float | None = None  # the last time the answer grew: its head, a complete SSE event


FLIGHTS: ContextVar[set[Flight] | None] = ContextVar("verify_flights", default=None)


def mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


# ----------------------------------------------------------------------------------------------------------------
# The response as it arrives
# ----------------------------------------------------------------------------------------------------------------


class Collector:
    """The exchange's handler: keeps the status, the headers and the body (within MAX_BODY_BYTES); a streamed 2xx
    body also goes to `sink` read by read."""

    def __init__(self, flight: Flight, sink: Callable[[bytes], None] | None = None):
        self.flight = flight
        self.sink = sink
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.body = bytearray()  # not kept for a streamed 2xx body: that goes to `sink`
        self.size = 0
        self.disconnect: str | None = None
        self.exchange: BoundedExchange | None = None

    @property
    def compressed(self) -> bool:
        return self.headers.get("Content-Encoding", "identity").lower() != "identity"

    def on_head(self, status: int, headers: dict[str, str], now_ns: int) -> None:
        self.status, self.headers = status, headers
        self.flight.progress_at = time.perf_counter()
        if 300 <= status < 400 and status != 304:
            location = headers.get("Location")
            where = f" redirect to {location}" if location else " redirect (no Location header)"
            raise BadResponse(f"HTTP {status}{where}: servelab does not follow redirects")

    def on_body(self, data: bytes, now_ns: int) -> bool:
        if self.size + len(data) > MAX_BODY_BYTES:
            raise Overflow(self.too_large())
        self.size += len(data)
        if self.sink is not None and self.status is not None and 200 <= self.status < 300:
            self.sink(data)  # a stream progresses by its complete events (keep-alive comments are no progress)
        else:
            self.body += data  # an answer read whole is of use only whole: its bytes trickling in are no progress
        return False

    def on_end(self, now_ns: int) -> None:
        pass

    def too_large(self) -> str:
        if self.compressed:
            wire = self.exchange.body_wire_bytes if self.exchange is not None else 0
            return (f"answer inflated past {mib(MAX_BODY_BYTES)}: a compressed body that never ends "
                    f"({wire:,} compressed bytes read; the rest was not)")
        return f"answer larger than {mib(MAX_BODY_BYTES)}: the rest was not read"


class BoundedExchange(http1.Exchange):
    """bench's exchange (which bounds the response head and the inflating), keeping what verify needs to name what
    the server sent: the start of the reply, the latest read, the body bytes as sent."""

    def __init__(self, request: bytes, handler: Collector, loop: asyncio.AbstractEventLoop):
        super().__init__(request, handler, loop)
        self.collector = handler
        self.body_wire_bytes = 0  # body bytes as sent (compressed, when compressed)
        self.first_read = b""  # the start of the reply, to name what a non-HTTP server sent
        self.last_read = b""  # the latest read, to name a malformed chunk size

    def data_received(self, data: bytes, stamp_ns: int | None = None) -> None:
        flight = self.collector.flight
        if flight.first_byte_at is None:
            flight.first_byte_at = time.perf_counter()
        if len(self.first_read) < 64:
            self.first_read += data[:64 - len(self.first_read)]
        self.last_read = data
        super().data_received(data, stamp_ns)

    def on_body(self, body: bytes) -> None:
        self.body_wire_bytes += len(body)
        super().on_body(body)


# ----------------------------------------------------------------------------------------------------------------
# What the server sent, named
# ----------------------------------------------------------------------------------------------------------------

_CHUNK_SIZE = re.compile(rb"\s*([0-9A-Fa-f]+)\s*(;.*)?")


def bad_chunk_line(data: bytes) -> bytes:
    """The chunk-size line in `data` (the read that broke the parser) that is not one: walks the chunked framing
    from the start of the body, or of the read."""
    head_end = data.find(b"\r\n\r\n")
    pos = head_end + 4 if data.startswith(b"HTTP/") and head_end >= 0 else 0
    while pos < len(data):
        eol = data.find(b"\n", pos)
        line = data[pos:eol if eol >= 0 else len(data)].rstrip(b"\r")
        match = _CHUNK_SIZE.fullmatch(line)
        if match is None or eol < 0:
            return line[:40]
        pos = eol + 1 + int(match.group(1), 16) + 2
    return data[:40]


def describe_malformed(message: str, exchange: BoundedExchange) -> str:
    """bench's MalformedResponse message, as the one line a check reports: what the server sent, named."""
    collector = exchange.collector
    lowered = message.lower()
    if "expanded past" in lowered:  # bench's own bomb bound fired before verify's
        return collector.too_large()
    if "the rest was not read" in lowered or lowered.startswith("the server sent"):
        return message  # one of bench's bounds on the head, or an unknown Content-Encoding: the message names it
    if "chunk" in lowered:
        return f"the server sent a malformed chunked body (chunk size {bad_chunk_line(exchange.last_read)!r})"
    if collector.status is None:
        first_line = exchange.first_read.split(b"\n")[0].rstrip(b"\r")[:40]
        if not exchange.first_read.startswith(b"HTTP/"):
            return f"the server's reply is not HTTP: it began {first_line!r}"
        detail = message.removeprefix("malformed HTTP response: ")
        return f"the server sent a malformed response head ({detail}): status line {first_line!r}"
    if message.startswith("malformed HTTP response: "):
        return f"the server sent a malformed HTTP body ({message.removeprefix('malformed HTTP response: ')})"
    return message  # already says what the server sent (an unknown Content-Encoding, an undecodable body)


# ----------------------------------------------------------------------------------------------------------------
# One request
# ----------------------------------------------------------------------------------------------------------------


@functools.cache
def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()


def basic_auth(base_url: str) -> str | None:
    parts = urlsplit(base_url)
    if parts.username is None and parts.password is None:
        return None
    pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(pair.encode()).decode("ascii")


def build_request(origin: http1.Origin, method: str, path: str, body: bytes | None,
                  headers: dict[str, str]) -> bytes:
    lines = [f"{method} {origin.prefix}{path} HTTP/1.1", f"Host: {origin.host_header}",
             f"User-Agent: {http1.USER_AGENT}", "Accept: */*", "Accept-Encoding: gzip, deflate", "Connection: close"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    for name, value in headers.items():
        if any(c in name or c in value for c in "\r\n\0"):
            raise BadResponse(f"header {name!r} contains a line break")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


async def exchange(method: str, base_url: str, path: str, body: bytes | None, headers: dict[str, str],
                   sink: Callable[[bytes], None] | None = None, flight: Flight | None = None) -> Collector:
    """Send one request and read its whole response within the bounds. Raises BadResponse (Overflow past a bound)
    for anything but a complete response; a body cut off after the head is `disconnect` on the result."""
    origin = http1.Origin.from_url(base_url)
    auth = basic_auth(base_url)
    if auth and not any(name.lower() == "authorization" for name in headers):
        headers = {**headers, "Authorization": auth}
    request = build_request(origin, method, path, body, headers)
    flight = flight or Flight(sent_at=time.perf_counter())
    flights = FLIGHTS.get()
    if flights is not None:
        flights.add(flight)
    loop = asyncio.get_running_loop()
    collector = Collector(flight, sink)
    ex = BoundedExchange(request, collector, loop)
    collector.exchange = ex
    tls = _tls() if origin.scheme == "https" else None
    try:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await loop.create_connection(lambda: ex, origin.host, origin.port, ssl=tls,
                                             server_hostname=origin.host if tls else None)
        except TimeoutError:
            raise BadResponse(f"cannot connect: no connection within {CONNECT_TIMEOUT_S:g}s") from None
        except ConnectionRefusedError:
            raise BadResponse("cannot connect: connection refused") from None
        except OSError as exc:
            raise BadResponse(f"cannot connect: {exc.strerror or exc}") from None
        try:
            await ex.finished
        except asyncio.CancelledError:
            flights = None  # the deadline: the runner reads this request's flight to tell a stall
            raise
        except BadResponse:
            raise
        except http1.MalformedResponse as exc:
            reason = describe_malformed(str(exc), ex)
            kind = Overflow if "rest was not" in reason else BadResponse
            raise kind(reason, excerpt_bytes(collector.body)) from None
        except http1.HTTPError:  # the connection closed (or broke) before the response ended
            if collector.status is None:
                raise BadResponse("the server closed the connection without answering") from None
            collector.disconnect = "the body was cut off mid-transfer"
    except BaseException:
        # What was read goes now: this frame stays alive in the traceback (with the exchange, whose future holds
        # the failure and so this frame again: a cycle only the collector would free, holding up to 16 MiB).
        collector.body = bytearray()
        collector.sink = None
        raise
    finally:
        ex.close()
        collector.exchange = None
        del ex
        if flights is not None:
            flights.discard(flight)
    return collector


def excerpt_bytes(raw: bytes | bytearray, limit: int = 500) -> str | None:
    if not raw:
        return None
    text = bytes(raw[:limit * 4]).decode("utf-8", errors="replace")
    return text if len(text) <= limit else text[:limit - 1] + "…"
