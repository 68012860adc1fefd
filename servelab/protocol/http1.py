"""One HTTP/1.1 request whose response body is handed over as it arrives: the transport under the bench client.

Why not aiohttp here: a benchmark client spends almost all its CPU moving events from the socket to the record,
and with aiohttp each read wakes the reading task through a future and a StreamReader (~20 us of Python per event
on this machine). Here the response is parsed inside the protocol's `data_received` callback (httptools, the
C parser uvicorn uses), and the body goes straight to a handler: no task switch per event, one future per request.
Measured on the calibration server (benchmarks/client_ceiling.py): the client's CPU per streamed token fell
by more than half. aiohttp stays in use everywhere else in servelab (verify, metrics scrapes, tokenize calls).

What it does: plain and TLS connections, one connection per request (`Connection: close`, see client.py for
why), Content-Length, chunked and close-delimited bodies, gzip/deflate bodies. What it does not: proxies,
redirects, keep-alive pooling, HTTP/2 — none of which a benchmark of an inference server should go through
silently.

A compressed body is inflated in steps of at most INFLATE_STEP bytes, each handed to the handler before the next,
and may expand to at most MAX_INFLATED_BYTES in all (or MAX_INFLATE_RATIO times its compressed size, once past
INFLATE_RATIO_FROM bytes): a decompression bomb is a `parse` failure of its request, not gigabytes of memory.
The response head (status line, interim 1xx answers and headers) is bounded too: at most MAX_HEAD_BYTES in all,
MAX_HEADER_LINE_BYTES per header and MAX_HEADERS headers. Past any of them the request is a `parse` failure naming
the bound, and the rest is not read (a 256 MB header line held 1 GB of memory in a level of 8; two million
headers 1.5 GB). Real servers send well under 8 KiB of head.
A socket the client cannot open because it ran out of file descriptors (EMFILE, ENFILE) is a `fd_limit` failure
(FileLimit), the client's fault, not the server's.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import ipaddress
import os
import socket
import ssl
import struct
import sys
import time
import zlib
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import httptools

from servelab import __version__

USER_AGENT = f"servelab/{__version__}"
INFLATE_STEP = 1 << 20  # a compressed body is inflated this much at a time
MAX_INFLATED_BYTES = 256 << 20  # a compressed body may expand to this much in all ...
INFLATE_RATIO_FROM = 16 << 20  # ... and, past this much, to at most MAX_INFLATE_RATIO x its compressed size
MAX_INFLATE_RATIO = 200  # JSON event streams compress 10-50x; a bomb of zeros ~1000x
MAX_HEAD_BYTES = 64 << 10  # the response's head in all (interim 1xx answers included) ...
MAX_HEADER_LINE_BYTES = 16 << 10  # ... one header (name and value) ...
MAX_HEADERS = 128  # ... and how many headers one answer may have


class HTTPError(Exception):
    """The exchange failed below HTTP semantics; `kind` says how (the client maps it to an error kind)."""

    kind = "disconnect"


class ConnectFailed(HTTPError):
    kind = "connect"


class ConnectTimeout(HTTPError):
    kind = "timeout_connect"


class FileLimit(HTTPError):
    """The client could not open a socket: too many open files (its descriptor limit, or the system's)."""

    kind = "fd_limit"


class Disconnected(HTTPError):
    kind = "disconnect"


class MalformedResponse(HTTPError):
    kind = "parse"


@dataclass(frozen=True)
class Origin:
    """Where requests go: scheme, host, port and the base URL's path prefix (e.g. a gateway's /v1-proxy)."""

    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def from_url(cls, base_url: str) -> Origin:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def build_request(origin: Origin, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {origin.prefix}{path} HTTP/1.1", f"Host: {origin.host_header}", f"User-Agent: {USER_AGENT}",
             f"Content-Length: {len(body)}", "Connection: close"]
    for name, value in headers.items():
        if any(c in name or c in value for c in "\r\n\0"):
            raise ValueError(f"header {name!r} contains a line break")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class ResponseHandler(Protocol):
    """What an exchange reports to. Each call gets the perf_counter_ns taken right after the socket read that
    carried the bytes. Exceptions raised here end the exchange with that exception."""

    def on_head(self, status: int, headers: dict[str, str], now_ns: int) -> None: ...

    def on_body(self, data: bytes, now_ns: int) -> bool:
        """True: the handler has what it needs; the exchange ends now (the rest of the body is not read)."""
        ...

    def on_end(self, now_ns: int) -> None:
        """The body ended cleanly (its declared end, or the close that delimits it)."""
        ...


def _without_tracebacks(exc: BaseException) -> BaseException:
    """`exc`, and the exceptions it was raised from or during, stripped of their tracebacks."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        if e.__cause__ is not None:
            e.__cause__.__traceback__ = None
        e = e.__context__
    return exc


class _DoneParser:
    """Stands in for an exchange's parser once it is closed: bytes that still arrive are ignored."""

    @staticmethod
    def feed_data(data: bytes) -> None:
        return None

    @staticmethod
    def get_status_code() -> int:
        return 0


class Exchange(asyncio.Protocol):
    """The protocol for one request on one connection. `finished` resolves when the handler is done, the body
    ended, or anything failed."""

    def __init__(self, request: bytes, handler: ResponseHandler, loop: asyncio.AbstractEventLoop):
        self.request = request
        self.handler = handler
        self.finished: asyncio.Future[None] = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self.reader: KernelStampedReader | None = None  # instead of a transport, on plain TCP (Linux)
        self.last_read_ns = time.perf_counter_ns()
        self._parser = httptools.HttpResponseParser(self)
        self._headers: dict[str, str] = {}
        self._head_done = False
        self._close_delimited = False
        self._decoder: zlib._Decompress | None = None  # type: ignore[name-defined]
        self._compressed = 0  # bytes of compressed body received
        self._inflated = 0  # bytes they inflated to
        self._now_ns = 0
        self._head_bytes = 0  # bytes received before the final answer's headers were complete
        self._header_count = 0
        self._error: BaseException | None = None  # raised inside a parser callback, re-raised after feed_data

    # ---- asyncio.Protocol ----
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes, stamp_ns: int | None = None) -> None:
        """`stamp_ns`: when the kernel received these bytes (see KernelStampedReader); else now."""
        self.last_read_ns = time.perf_counter_ns()
        self._now_ns = self.last_read_ns if stamp_ns is None else stamp_ns
        if self.finished.done():
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:  # our own callbacks raised: report that, not the wrap
            self._finish(self._error or exc.__context__ or MalformedResponse(str(exc)))
        except httptools.HttpParserError as exc:
            self._finish(self._error or MalformedResponse(f"malformed HTTP response: {exc}"))
        if self._error is not None:
            self._finish(self._error)
        elif not self._head_done and not self.finished.done():
            # httptools keeps a header it has not seen the end of in memory, growing: bound it from outside,
            # counting every byte read before the head is complete (at most one read past the bound is held).
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._finish(MalformedResponse(
                    f"the response headers grew past {MAX_HEAD_BYTES >> 10} KiB ({self._head_bytes:,} bytes "
                    f"without their end, {self._header_count:,} headers); the rest was not read"))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.finished.done():
            return
        now = time.perf_counter_ns()
        if self._head_done and self._close_delimited:
            try:  # a body without length or chunking ends with the connection
                self._flush_decoder()
                self.handler.on_end(now)
            except BaseException as e:  # noqa: BLE001 - whatever the handler raised is the outcome
                self._finish(e)
                return
            self._finish(None)
            return
        reason = f": {type(exc).__name__}: {exc}" if exc else ""
        where = "before the response headers" if not self._head_done else "before the response ended"
        self._finish(Disconnected(f"connection closed {where}{reason}"))

    # ---- httptools callbacks ----
    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._error is not None:
            return
        if len(name) + len(value) > MAX_HEADER_LINE_BYTES:
            self._fail(MalformedResponse(
                f"a response header is longer than {MAX_HEADER_LINE_BYTES >> 10} KiB "
                f"({len(name) + len(value):,} bytes: {name[:40].decode('latin-1')!r}); the rest was not read"))
            return
        if self._header_count > MAX_HEADERS:
            self._fail(MalformedResponse(f"the response has more than {MAX_HEADERS} headers; the rest was not "
                                         "read"))
            return
        self._headers[name.decode("latin-1").title()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if self._error is not None:
            return
        if 100 <= status < 200:  # an interim response (e.g. 103): the real one follows
            self._headers = {}
            self._header_count = 0
            return
        self._head_done = True
        headers = self._headers
        chunked = "chunked" in headers.get("Transfer-Encoding", "").lower()
        self._close_delimited = not chunked and "Content-Length" not in headers
        encoding = headers.get("Content-Encoding", "identity").lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            self._decoder = zlib.decompressobj(wbits=47)  # 32 + 15: zlib or gzip header, detected
        elif encoding != "identity":
            self._fail(MalformedResponse(f"the server sent Content-Encoding {encoding!r}, which servelab cannot "
                                         "decode"))
            return
        self._call(self.handler.on_head, status, headers, self._now_ns)

    def on_body(self, body: bytes) -> None:
        if self._error is not None or self.finished.done():
            return
        if self._decoder is not None:
            self._inflate(body)
            return
        if self._call(self.handler.on_body, body, self._now_ns):
            self._finish(None)

    def _inflate(self, body: bytes) -> None:
        """Inflate `body` a step at a time, each step to the handler before the next, within the bounds."""
        decoder = self._decoder
        assert decoder is not None
        self._compressed += len(body)
        while True:
            try:
                out = decoder.decompress(body, INFLATE_STEP)
            except zlib.error as exc:
                self._fail(MalformedResponse(f"the compressed body could not be decoded: {exc}"))
                return
            self._inflated += len(out)
            if self._inflated > MAX_INFLATED_BYTES or (self._inflated > INFLATE_RATIO_FROM and
                                                       self._inflated > MAX_INFLATE_RATIO * self._compressed):
                self._fail(MalformedResponse(
                    f"the compressed body expanded past {self._inflated >> 20} MiB from "
                    f"{self._compressed:,} bytes (a decompression bomb?); the rest was not read"))
                return
            if out:
                if self._call(self.handler.on_body, out, self._now_ns):
                    self._finish(None)
                    return
                if self._error is not None:
                    return
            body = decoder.unconsumed_tail
            if not body:
                return

    def on_message_complete(self) -> None:
        if self._error is not None or self.finished.done() or not self._head_done:
            return
        self._flush_decoder()
        self._call(self.handler.on_end, self._now_ns)
        if self._error is None:
            self._finish(None)

    # ---- internals ----
    def _call(self, fn, *args):  # type: ignore[no-untyped-def]
        try:
            return fn(*args)
        except BaseException as exc:  # noqa: BLE001 - kept and re-raised to the awaiting request
            self._fail(exc)
            return None

    def _flush_decoder(self) -> None:
        if self._decoder is not None:
            try:
                rest = self._decoder.flush()
            except zlib.error as exc:
                raise MalformedResponse(f"the compressed body could not be decoded: {exc}") from None
            self._decoder = None
            if rest:
                self.handler.on_body(rest, self._now_ns)

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc

    def _finish(self, exc: BaseException | None) -> None:
        if not self.finished.done():
            if exc is None:
                self.finished.set_result(None)
            else:
                # Without its traceback: raised in a parser callback, it would hold that frame, whose `self` is
                # this exchange, which holds it: a cycle (freed only by a collection, which the client's frozen
                # generations never make). What it says is in its type and message.
                self.finished.set_exception(_without_tracebacks(exc))
        self.close()

    def abort(self, exc: BaseException) -> None:
        """End the exchange from outside (a deadline): the awaiting request gets `exc`."""
        self._finish(exc)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        if self.reader is not None:
            self.reader.close()
            self.reader = None  # it holds this exchange too
        # Break the exchange's reference cycle (the parser holds this protocol for its callbacks, this protocol
        # holds the parser) so that it, and the stream its handler built, are freed at once by reference
        # counting: the client moves what is alive into the collector's permanent generation every quarter
        # second (client.py), and cyclic garbage frozen there was never collected: ~4 MB/s of a 64-stream run.
        self._parser = _DoneParser


# ---------------------------------------------------------------------------------------------------------
# Kernel receive timestamps. A single-threaded client that reads a burst of events (every stream of a batch-decoding
# server gets its token at the same moment) handles them one socket after another, so the last one is read, and
# was timed, milliseconds after it arrived. With SO_TIMESTAMPNS the kernel stamps every packet as it arrives and
# recvmsg hands back the stamp of the last packet it read: the time the bytes that completed the event arrived,
# whatever the client was busy with. The stamp is on the realtime clock; it is moved to the monotonic clock with
# the offset between the two sampled at that read (so clock slewing cannot accumulate), and a stamp outside
# [previous stamp, now] (a clock step) falls back to the read time. Not used for TLS, where the bytes read are
# not the bytes that arrived.
# ---------------------------------------------------------------------------------------------------------

SO_TIMESTAMPNS = 35  # Linux, all architectures servelab runs on; not exposed by the socket module
_STAMP_SPACE = socket.CMSG_SPACE(16)  # one struct timespec
_READ_SIZE = 1 << 18


def kernel_timestamps_wanted() -> bool:
    return sys.platform == "linux" and os.environ.get("SERVELAB_KERNEL_TIMESTAMPS", "1") != "0"


class KernelStampedReader:
    """Reads a connected non-blocking socket from the event loop's readiness callback with recvmsg, and hands
    each read to the exchange with the kernel's receive time."""

    __slots__ = ("sock", "exchange", "loop", "floor_ns", "closed")

    def __init__(self, sock: socket.socket, exchange: Exchange, loop: asyncio.AbstractEventLoop, floor_ns: int):
        self.sock, self.exchange, self.loop, self.floor_ns, self.closed = sock, exchange, loop, floor_ns, False
        loop.add_reader(sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(_READ_SIZE, _STAMP_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.close()
            self.exchange.connection_lost(exc)
            return
        if not data:
            self.close()
            self.exchange.connection_lost(None)
            return
        stamp = None
        if ancillary:
            now = time.perf_counter_ns()
            level, kind, raw = ancillary[0]
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
                sec, nsec = _TIMESPEC.unpack_from(raw)
                stamp = sec * 1_000_000_000 + nsec - (time.time_ns() - time.perf_counter_ns())
                if stamp > now:  # the offset sampled a few ns apart: never later than the read itself
                    stamp = now
                if stamp < self.floor_ns:
                    stamp = None  # a clock step: trust the read time instead
                else:
                    self.floor_ns = stamp
        self.exchange.data_received(data, stamp)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()


_TIMESPEC = struct.Struct("qq")
_ADDRESSES: dict[tuple[str, int], tuple[float, list[tuple]]] = {}  # (host, port) -> (resolved at, addresses)
_ADDRESS_TTL_S = 30.0


async def _addresses(loop: asyncio.AbstractEventLoop, host: str, port: int) -> list[tuple]:
    """getaddrinfo, remembered for a while: resolving every request would cost a thread hop each."""
    try:
        ip = ipaddress.ip_address(host)
        return [(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, (host, port))]
    except ValueError:
        pass
    cached = _ADDRESSES.get((host, port))
    if cached is not None and time.monotonic() - cached[0] < _ADDRESS_TTL_S:
        return cached[1]
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found = [(family, sockaddr) for family, _, _, _, sockaddr in infos]
    _ADDRESSES[(host, port)] = (time.monotonic(), found)
    return found


async def _connect_stamped(loop: asyncio.AbstractEventLoop, origin: Origin, exchange: Exchange) -> None:
    last_error: OSError | None = None
    for family, sockaddr in await _addresses(loop, origin.host, origin.port):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, sockaddr)
            await loop.sock_sendall(sock, exchange.request)
        except OSError as exc:
            sock.close()
            last_error = exc
            continue
        except BaseException:
            sock.close()
            raise
        exchange.reader = KernelStampedReader(sock, exchange, loop, time.perf_counter_ns())
        return
    raise last_error or OSError(f"no address for {origin.host}")


@functools.cache
def _default_tls() -> ssl.SSLContext:
    return ssl.create_default_context()  # loading the CA store costs milliseconds: once


async def open_exchange(origin: Origin, request: bytes, handler: ResponseHandler, connect_timeout_s: float,
                        ssl_context: ssl.SSLContext | None = None) -> Exchange:
    """Connect and send `request`; the response goes to `handler`. Await `.finished` for the outcome."""
    loop = asyncio.get_running_loop()
    exchange = Exchange(request, handler, loop)
    tls = (ssl_context or _default_tls()) if origin.scheme == "https" else None
    try:
        async with asyncio.timeout(connect_timeout_s):
            if tls is None and kernel_timestamps_wanted():
                await _connect_stamped(loop, origin, exchange)
            else:
                await loop.create_connection(lambda: exchange, origin.host, origin.port, ssl=tls,
                                             server_hostname=origin.host if tls else None)
    except TimeoutError:
        raise ConnectTimeout(f"no connection to {origin.host}:{origin.port} within {connect_timeout_s:g}s") \
            from None
    except OSError as exc:  # refused, unreachable, unknown host (gaierror), TLS failures (SSLError)
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise FileLimit(f"cannot open a socket: {exc.strerror or exc} (the client's file-descriptor limit: "
                            f"`ulimit -n`)") from None
        raise ConnectFailed(f"cannot connect to {origin.host}:{origin.port}: {exc.strerror or exc}") from None
    return exchange
