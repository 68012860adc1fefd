"""The streaming client: one request in, one RequestRecord out, never an exception.

Layers: protocol/http1.py moves bytes (one HTTP/1.1 exchange, the body handed over as it arrives); this module
gives them meaning (SSE events, the record); the endpoint's dialect (protocol/dialects/: chat/completions chunks,
Responses events, Messages events) reads each event and shapes the request; bench/tokens.py counts tokens once the
stream ended.

Timing: `perf_counter_ns()` right after each socket read returns; every event completed by that read gets that
time. The per-event path runs inside the protocol's data_received callback: parse SSE, parse JSON, append a
tuple. No task wakes up per event.

Deadlines (all per request): connect, first byte (until the first event that carries a token), idle (the longest
time without an SSE data event after that: `: ping` comments and bytes that complete no event do not count, so a
server that only sends keep-alives is idle), total. One timer per request checks them, re-armed only when it fires
(a read does not touch it), and whichever fires is recorded as the error kind, so a stalled stream costs `idle_s`,
not hours.

One bad response costs one request, never the run: whatever the bytes are (a chunk of the wrong shape, an
implausible token count, an `event: error`, a redirect, an endless event, a decompression bomb), `send` returns
a failed record that says what arrived.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import gc
import html
import json
import math
import re
import ssl
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import orjson

from servelab.protocol.chunks import MalformedChunk, error_message
from servelab.protocol.dialects import Dialect, dialect_for
from servelab.protocol.http1 import HTTPError, Origin, build_request, open_exchange
from servelab.protocol.sse import SSEDecodeError, SSEParser
from servelab.bench.tokens import RawChunk, count_tokens
from servelab.bench.tool_calls import ToolCallJoiner, judge_answer
from servelab.records import ErrorKind, RequestRecord, Usage

_EXCERPT = 300
_HTML = re.compile(r"\s*<(!doctype|html)", re.IGNORECASE)
_HEAD = re.compile(r"<(head|script|style)\b.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>")
_ERROR_BODY_MAX = 64 * 1024  # of an error body, kept for its message; reading stops there
# A server's token count above this is not a count (no request generates more): the request fails instead of
# sizing anything by it. With max_tokens, the bound is twice max_tokens plus some slack for engines that count
# more than they were asked for (an end-of-sequence token, reasoning).
MAX_PLAUSIBLE_TOKENS = 10_000_000
RETRY_AFTER_MAX_S = 600.0  # a Retry-After further away than this is read as this


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
    conversation: int | None = None  # multi-turn workloads: the conversation and its turn (1-based)
    turn: int | None = None
    images: int | None = None  # chat with images: how many the request carries and their pixels, summed
    image_pixels: int | None = None
    image_sizes: str | None = None  # each image's "WxH", comma-separated ("?" where unknown)
    # Bytes of the body held by this request alone (a synthetic image's data URL; a string shared with other
    # requests, as a dataset image's, is not counted): what an open-loop level's prebuilt schedule holds in memory
    own_bytes: int = 0
    # A non-streamed request (embeddings, rerank): what a right answer holds, e.g. {"kind": "embeddings",
    # "items": 4, "dimension": 576}; bench/unary_client.py sends it and checks the answer. None: a stream.
    expect: dict[str, Any] | None = None


class _StreamState:
    """What the hot loop accumulates for one stream. A plain slotted object: setting a pydantic field costs
    ~10x more, and this is touched once per event."""

    __slots__ = ("chunks", "usage", "finish_reason", "events", "saw_done", "last_event_ns", "max_count",
                 "max_tokens", "cache_n", "read", "merge_usage", "ends_with", "what", "tools", "finish_ns")

    def __init__(self, max_tokens: int | None = None, dialect: Dialect | None = None) -> None:
        dialect = dialect or dialect_for("/v1/chat/completions")
        self.read, self.merge_usage, self.ends_with = dialect.read, dialect.merge_usage, dialect.ends_with
        self.what = f"a {dialect.name} stream event" if dialect.ends_with else "an OpenAI streaming chunk"
        self.chunks: list[RawChunk] = []
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.events = 0  # SSE data events, [DONE] excluded
        self.saw_done = False
        self.last_event_ns = 0  # when the last SSE data event arrived: the idle deadline counts from it
        self.max_tokens = max_tokens
        self.max_count = plausible_token_bound(max_tokens)
        self.cache_n: int | None = None  # llama.cpp's timings.cache_n: prompt tokens reused from its cache
        self.tools: ToolCallJoiner | None = None  # the stream's tool calls, once a delta carried one
        self.finish_ns: int | None = None  # when the event that carried the first finish_reason arrived

    def on_event(self, data: str, now_ns: int, event: str | None = None) -> bool:
        """Handle one SSE event; True when the stream is finished ([DONE], or the dialect's end event)."""
        if event is not None:
            if event == "error":
                raise _Failure("in_band", f"the stream sent an `event: error`: {_event_error_text(data)}")
            if event == "ping":  # Anthropic's keep-alive: like a `: ping` comment, it does not end idleness
                return False
        if data == "[DONE]":
            self.last_event_ns = now_ns
            if self.ends_with:  # not these streams' end: before their end event (after it nothing is read)
                raise _Failure("disconnect", f"the stream sent [DONE] after {self.events} events, before "
                                             f"{self.ends_with}")
            self.saw_done = True
            return True
        try:
            obj = orjson.loads(data)  # ~3x faster than json on these small objects: the client's biggest cost
        except orjson.JSONDecodeError:
            raise _Failure("parse", f"event is not JSON: {data[:_EXCERPT]!r}") from None
        try:
            view = self.read(obj)
        except MalformedChunk as exc:
            raise _Failure("parse", f"event {self.events + 1} is not {self.what}: {exc}") from None
        if view.keep_alive:  # a keep-alive in a data event (Messages' data-only ping): as a `: ping` comment
            return False
        self.events += 1
        self.last_event_ns = now_ns
        if view.error is not None:
            raise _Failure("in_band", view.error)
        if view.usage is not None:
            completion = view.usage.completion_tokens
            if completion is not None and not 0 <= completion <= self.max_count:
                raise _Failure("parse", self._implausible("usage.completion_tokens", completion))
            merge = self.merge_usage
            self.usage = view.usage if merge is None or self.usage is None else merge(self.usage, view.usage)
        if view.finish_reason is not None:
            self.finish_reason = view.finish_reason
            if self.finish_ns is None:
                self.finish_ns = now_ns
        if view.cache_n is not None:
            self.cache_n = view.cache_n
        count = view.running_count
        if count is not None and not 0 <= count <= self.max_count:
            raise _Failure("parse", self._implausible("running token count", count))
        pieces = view.tool_calls
        if pieces is not None:
            if self.tools is None:
                self.tools = ToolCallJoiner()
            self.tools.add(pieces, now_ns)
            self.chunks.append(RawChunk(now_ns, view.answer, view.reasoning, count, True))
        elif view.answer or view.reasoning or count is not None:
            self.chunks.append(RawChunk(now_ns, view.answer, view.reasoning, count))
        if view.end:
            self.saw_done = True
            return True
        return False

    def _implausible(self, what: str, value: int) -> str:
        asked = f"max_tokens {self.max_tokens:,}" if self.max_tokens is not None else "no max_tokens"
        shown = f"{value:,}" if abs(value) < 10**19 else f"{float(value):.3g}"
        return (f"the server's {what} ({shown}) is not a plausible token count for a request with {asked} "
                f"(bound {self.max_count:,}); it was not used")


def basic_auth(url: str) -> str | None:
    """The Authorization header for the user and password in `url` (http://user:pass@host), or None. aiohttp
    sends the same on the set-up probes; the streams' own HTTP layer (http1.py) takes only host and port."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return None
    pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")


ANTHROPIC_VERSION = "2023-06-01"  # the Messages API version whose event stream protocol/dialects/messages.py reads


def dialect_headers(dialect: Dialect, api_key: str | None) -> dict[str, str]:
    """What a dialect's requests carry besides the client's headers. Messages: Anthropic's `anthropic-version`, and
    the key as `x-api-key` too, as Anthropic asks; the bearer stays, since vLLM's --api-key reads only
    `Authorization` on every /v1 route (llama.cpp reads either)."""
    if dialect.name != "messages":
        return {}
    return {"anthropic-version": ANTHROPIC_VERSION, **({"x-api-key": api_key} if api_key else {})}


def plausible_token_bound(max_tokens: int | None) -> int:
    """The largest token count a server may report for one request before it is read as nonsense."""
    if isinstance(max_tokens, int) and max_tokens > 0:
        return min(max(2 * max_tokens, max_tokens + 1024), MAX_PLAUSIBLE_TOKENS)
    return MAX_PLAUSIBLE_TOKENS


def _event_error_text(data: str) -> str:
    """What an `event: error` said: its message when the data is a JSON error, else the data itself."""
    try:
        obj = json.loads(data)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        inner = obj.get("error", obj)
        if isinstance(inner, (dict, str)) and (not isinstance(inner, dict) or inner.get("message")
                                               or inner.get("error")):
            return error_message(inner)[:_EXCERPT]
    return " ".join(data.split())[:_EXCERPT] or "no data"


@dataclass
class _Failure(Exception):
    kind: ErrorKind
    detail: str
    status: int | None = None
    retry_after_s: float | None = None


@dataclass
class ClientOptions:
    deadlines: Deadlines = field(default_factory=Deadlines)
    # Sent as a bearer token, on /v1/messages also as Anthropic's x-api-key (dialect_headers); never written anywhere
    api_key: str | None = None
    stream_extras: dict[str, Any] = field(default_factory=dict)  # engine-specific request fields
    include_usage: bool = True


class StreamClient:
    """Sends streaming requests and records them. Use as an async context manager."""

    def __init__(self, base_url: str, options: ClientOptions | None = None):
        self.base_url = base_url.rstrip("/")
        self.options = options or ClientOptions()
        self._origin = Origin.from_url(self.base_url)
        self._basic = basic_auth(self.base_url)  # credentials in the URL: on every request, as the probes send them
        self._headers: dict[str, str] | None = None
        self._tls: ssl.SSLContext | None = None
        # Requests that were in flight when their task was cancelled (Ctrl-C): each is recorded here with
        # error_kind "cancelled" and whatever it had received, since send() cannot return it.
        self.cancelled: list[RequestRecord] = []
        # Every send under way: its task (held here, so that a task nothing else refers to cannot be
        # garbage-collected while pending, which closes its coroutine without a CancelledError and loses its
        # record) and its record and stream state (so a send that never got to record itself is still
        # recorded as cancelled: `abandoned`).
        self.in_flight: dict[int, tuple[asyncio.Task | None, RequestRecord, _StreamState]] = {}
        self._frozen_at = 0.0

    async def __aenter__(self) -> StreamClient:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                   "Accept-Encoding": "gzip, deflate"}
        if self.options.api_key:
            headers["Authorization"] = f"Bearer {self.options.api_key}"
        elif self._basic:
            headers["Authorization"] = self._basic
        self._headers = headers
        self._keep_collector_pauses_short()  # everything alive before the first request, e.g. imported modules
        if self._origin.scheme == "https":
            self._tls = ssl.create_default_context()  # loading the CA store costs milliseconds: once per client
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._headers = None
        self.abandoned()
        if self._frozen_at:
            gc.unfreeze()  # what was frozen (records, mostly) is the collector's again
            self._frozen_at = 0.0

    # What a Sender (bench/sender.py) says besides `send`: this process sends, each request at its time.
    dispatch_lead_ns = 0
    processes = 1

    @property
    def local_pids(self) -> list[int]:
        return []  # no other process sends

    def provenance(self) -> list:
        return []  # no workers: this process sent every request

    def abandoned(self) -> list[RequestRecord]:
        """Record as cancelled every send still registered as in flight whose task has ended (or that has no
        task): one whose coroutine was closed without a CancelledError. They join `cancelled`, where the load
        modes and the runner take them from. Called when the client closes; safe to call any time."""
        taken: list[RequestRecord] = []
        for key, (task, record, state) in list(self.in_flight.items()):
            if task is None or task.done():
                del self.in_flight[key]
                self._record_cancelled(record, state, "its task ended without finishing the request")
                taken.append(record)
        return taken

    def _record_cancelled(self, record: RequestRecord, state: _StreamState, why: str | None = None) -> None:
        record.error_kind = "cancelled"
        record.error_detail = f"cancelled after {state.events} events" + (f" ({why})" if why else "")
        record.ok = False
        _finish_record(record, state)
        self.cancelled.append(record)

    def _keep_collector_pauses_short(self) -> None:
        """Python's full collection scans every object alive, and a run's records are many: at a few hundred
        streams one took 23 ms on this machine, during which no socket is read, so events queue and are read
        (and timed) together. Every quarter second, what is alive then moves to the permanent generation
        (gc.freeze(), O(1)), so a collection scans only what is younger. Young garbage is still collected as
        usual; garbage cycles that outlive a freeze wait until the client closes."""
        now = time.monotonic()
        if now - self._frozen_at >= 0.25:
            gc.freeze()
            self._frozen_at = now

    def build_body(self, spec: RequestSpec, dialect: Dialect | None = None) -> dict[str, Any]:
        body = dict(spec.body)
        body["stream"] = True
        dialect = dialect or dialect_for(spec.endpoint)
        if not dialect.engine_fields:
            return body  # the engine's extra fields would not reach it on this endpoint (protocol/dialects/)
        extras = dict(self.options.stream_extras)
        if not dialect.stream_options:  # usage always comes on this endpoint; stream_options is chat/completions'
            extras.pop("stream_options", None)
            return body | {k: v for k, v in extras.items() if k not in body}
        stream_options = {**(extras.pop("stream_options", None) or {}), **(body.get("stream_options") or {})}
        if self.options.include_usage:
            stream_options.setdefault("include_usage", True)
        if stream_options:
            body["stream_options"] = stream_options
        for key, value in extras.items():
            body.setdefault(key, value)  # what the workload set explicitly wins over the engine's extras
        return body

    async def send(self, spec: RequestSpec, scheduled_ns: int | None = None) -> RequestRecord:
        assert self._headers is not None, "use StreamClient as an async context manager"
        dialect = dialect_for(spec.endpoint)
        body = self.build_body(spec, dialect)
        payload = orjson.dumps(body)
        sampling = {k: body[k] for k in ("temperature", "top_p", "top_k", "seed", "ignore_eos", "min_tokens")
                    if k in body}
        record = RequestRecord(index=spec.index, tag=spec.tag, warmup=spec.warmup, endpoint=spec.endpoint,
                               input_tokens=spec.input_tokens, max_tokens=body.get(dialect.max_tokens_field),
                               sampling=sampling, scheduled_ns=scheduled_ns, conversation=spec.conversation,
                               turn=spec.turn, images=spec.images, image_pixels=spec.image_pixels,
                               image_sizes=spec.image_sizes,
                               t_send_ns=time.perf_counter_ns())
        state = _StreamState(record.max_tokens if isinstance(record.max_tokens, int) else None, dialect)
        key = id(record)
        self.in_flight[key] = (asyncio.current_task(), record, state)
        try:
            headers = dialect_headers(dialect, self.options.api_key)
            await self._stream(payload, spec.endpoint, record, state, {**headers, **spec.headers}
                               if headers else spec.headers)
            record.ok = True
        except _Failure as f:
            record.error_kind, record.error_detail, record.http_status = f.kind, f.detail, f.status or \
                record.http_status
            record.retry_after_s = f.retry_after_s
        except asyncio.CancelledError:
            if self.in_flight.pop(key, None) is not None:
                self._record_cancelled(record, state)
            raise
        except BaseException:
            # Not a cancellation: the coroutine closed (GeneratorExit, a task garbage-collected while pending) or
            # the process is being interrupted (KeyboardInterrupt). The request was in flight: keep it.
            if self.in_flight.pop(key, None) is not None:
                self._record_cancelled(record, state, "interrupted")
            raise
        self.in_flight.pop(key, None)
        _finish_record(record, state)
        judge_answer(record, body, state.tools, state.finish_ns)  # tools and structured output, when declared
        self._keep_collector_pauses_short()
        return record

    async def _stream(self, payload: bytes, endpoint: str, record: RequestRecord, state: _StreamState,
                      headers: dict[str, str]) -> None:
        d = self.options.deadlines
        t0 = time.perf_counter_ns()
        first_byte_limit, total_limit = t0 + int(d.first_byte_s * 1e9), t0 + int(d.total_s * 1e9)
        idle_ns = int(d.idle_s * 1e9)
        try:
            request = build_request(self._origin, endpoint, payload, {**self._headers, **headers}
                                    if headers else self._headers)
        except ValueError as exc:
            raise _Failure("http", f"cannot send the request: {exc}") from None
        handler = _StreamHandler(record, state)
        try:
            exchange = await open_exchange(self._origin, request, handler, min(d.connect_s, d.first_byte_s,
                                                                                d.total_s), self._tls)
        except HTTPError as exc:
            raise _Failure(exc.kind, str(exc)) from None  # type: ignore[arg-type]

        chunks = state.chunks
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None

        def check_deadline() -> None:
            nonlocal timer
            # Until the first token: the first-byte deadline (a role chunk sent with the headers does not end it:
            # prefill of a long prompt can take longer than any idle gap); then the idle gap since the last SSE data
            # event (comments such as `: ping` do not reset it); never past the total.
            if not chunks:
                limit, kind = first_byte_limit, "timeout_first_byte"
            else:
                limit, kind = state.last_event_ns + idle_ns, "timeout_idle"
            if limit >= total_limit:
                limit, kind = total_limit, "timeout_total"
            now = time.perf_counter_ns()
            if now < limit:
                # Before the first token, look again within one idle period: the idle deadline starts with it.
                wake = limit if chunks else min(limit, now + idle_ns)
                timer = loop.call_later((wake - now) / 1e9, check_deadline)
                return
            waited = (now - t0) / 1e9
            deadline_s = {"timeout_first_byte": d.first_byte_s, "timeout_idle": d.idle_s}.get(kind, d.total_s)
            exchange.abort(_Failure(kind, f"{kind.removeprefix('timeout_').replace('_', ' ')} deadline passed "
                                          f"after {waited:.1f}s ({state.events} events received; the deadline "
                                          f"is {deadline_s:g} s)"))

        check_deadline()
        try:
            await exchange.finished
        except HTTPError as exc:
            detail = f"connection lost after {state.events} events: {exc}" if exc.kind == "disconnect" else str(exc)
            raise _Failure(exc.kind, detail, record.http_status) from None  # type: ignore[arg-type]
        except SSEDecodeError as exc:
            raise _Failure("parse", str(exc)) from None
        except (_Failure, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the response did to the handler costs this request only
            raise _Failure("parse", f"the response could not be read ({type(exc).__name__}: {exc}) after "
                                    f"{state.events} events") from None
        finally:
            if timer is not None:
                timer.cancel()
            # check_deadline refers to itself (it schedules itself) and to its timer, whose handle refers back to
            # it: cycles that hold the exchange and the whole stream. Cut them, so they are freed now by reference
            # counting: the client freezes older generations (_keep_collector_pauses_short), and frozen cyclic
            # garbage was never collected (~4 MB/s of memory on a 64-stream run).
            timer = None
            check_deadline = None  # noqa: F841 - clears the closure cell
            exchange.close()
            # a failure's traceback holds this frame, whose `exchange` holds the failure (its `finished`)
            exchange = None  # noqa: F841
        record.t_end_ns = time.perf_counter_ns()


class _StreamHandler:
    """Receives one response from the exchange: SSE events into the stream state, or an error body."""

    __slots__ = ("record", "state", "parser", "error_body", "content_type", "location", "retry_after")

    def __init__(self, record: RequestRecord, state: _StreamState):
        self.record, self.state = record, state
        self.parser = SSEParser()
        self.error_body: bytearray | None = None  # collected instead of parsed: an error status or not a stream
        self.content_type = ""
        self.location: str | None = None  # a redirect's Location
        self.retry_after: float | None = None  # a 429's or 503's Retry-After, in seconds

    def on_head(self, status: int, headers: dict[str, str], now_ns: int) -> None:
        self.record.t_headers_ns = now_ns
        self.record.http_status = status
        self.content_type = headers.get("Content-Type", "")
        if 300 <= status < 400:
            self.location = headers.get("Location")
        if status in (429, 503):
            self.retry_after = parse_retry_after(headers.get("Retry-After"))
        if status >= 300 or "text/event-stream" not in self.content_type:
            self.error_body = bytearray()

    def on_body(self, data: bytes, now_ns: int) -> bool:
        if self.error_body is not None:
            self.error_body += data[:_ERROR_BODY_MAX - len(self.error_body)]
            if len(self.error_body) >= _ERROR_BODY_MAX:
                raise self._body_failure()  # enough for its message: the rest is not read
            return False
        on_event = self.state.on_event
        try:
            events = self.parser.feed(data)
        except SSEDecodeError as exc:
            for ev in exc.events:  # what the same read completed before the bad event counts
                if on_event(ev.data, now_ns, ev.event):
                    return True
            raise
        for ev in events:
            if on_event(ev.data, now_ns, ev.event):
                return True
        return False

    def _body_failure(self) -> _Failure:
        status, raw = self.record.http_status or 0, bytes(self.error_body or b"")
        if 300 <= status < 400:
            where = f"to {self.location!r}" if self.location else "without a Location header"
            return _Failure("http", f"HTTP {status}: a redirect {where}; servelab does not follow redirects, "
                                    f"give the URL it points to", status)
        if status >= 400:
            detail = f"HTTP {status}: {_error_text(raw) or 'no body'}"
            if self.retry_after is not None:
                detail += f" (Retry-After: {self.retry_after:g} s)"
            return _Failure("http", detail, status, self.retry_after)
        return _Failure("parse", _not_a_stream(raw, self.content_type), status)

    def on_end(self, now_ns: int) -> None:
        if self.error_body is not None:
            raise self._body_failure()
        state = self.state
        try:
            events = self.parser.close()
        except SSEDecodeError as exc:
            for ev in exc.events:
                if state.on_event(ev.data, now_ns, ev.event):
                    return
            raise
        for ev in events:
            if state.on_event(ev.data, now_ns, ev.event):
                return
        if state.ends_with and not state.saw_done:
            had = f" (its stop reason {state.finish_reason!r} had arrived)" if state.finish_reason else ""
            raise _Failure("disconnect", f"connection closed after {state.events} events, before "
                                         f"{state.ends_with}{had}")
        if state.finish_reason is None:
            raise _Failure("disconnect", f"connection closed after {state.events} events, before any "
                                         "finish_reason or [DONE]")
        # A clean end after finish_reason is a complete answer even without [DONE] (transformers serve never
        # sends it); `saw_done` keeps the deviation visible.


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), at most RETRY_AFTER_MAX_S; None when
    absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S)


def _finish_record(record: RequestRecord, state: _StreamState) -> None:
    if record.t_end_ns is None:
        record.t_end_ns = time.perf_counter_ns()
    record.chunks, record.saw_done, record.finish_reason = state.events, state.saw_done, state.finish_reason
    record.usage = state.usage
    if state.cache_n is not None and (record.usage is None or record.usage.cached_tokens is None):
        # llama.cpp builds without usage.prompt_tokens_details report the reuse only in timings.cache_n
        record.usage = (record.usage or Usage()).model_copy(update={"cached_tokens": state.cache_n})
    record.events, record.count_method = count_tokens(state.chunks, state.usage)


def _error_text(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
        if isinstance(obj, dict) and "error" in obj:
            return error_message(obj["error"])[:_EXCERPT]
        if isinstance(obj, dict) and "detail" in obj:
            return str(obj["detail"])[:_EXCERPT]
    except ValueError:
        pass
    if _HTML.match(text):  # an HTML error page (a proxy, python -m http.server): its words, not its markup
        text = html.unescape(_TAG.sub(" ", _HEAD.sub(" ", text)))
    return " ".join(text.split())[:_EXCERPT]


def _not_a_stream(raw: bytes, ctype: str) -> str:
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
