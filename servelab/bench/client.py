"""The streaming client: one request in, one RequestRecord out, never an exception.

Layers: bench/http1.py moves bytes (one HTTP/1.1 exchange, the body handed over as it arrives); this module
gives them meaning (SSE events, OpenAI chunks, the record); bench/tokens.py counts tokens once the stream ended.

Timing: `perf_counter_ns()` right after each socket read returns; every event completed by that read gets that
time. The per-event path runs inside the protocol's data_received callback: parse SSE, parse JSON, append a
tuple. No task wakes up per event.

Deadlines (all per request): connect, first byte (until the first event that carries a token), idle (the longest
gap between two reads after that), total. One timer per request checks them, re-armed only when it fires (a read
does not touch it), and whichever fires is recorded as the error kind, so a stalled stream costs `idle_s`, not
hours.
"""

from __future__ import annotations

import asyncio
import gc
import html
import json
import re
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from servelab.bench.chunks import error_message, read_chunk
from servelab.bench.http1 import HTTPError, Origin, build_request, open_exchange
from servelab.bench.sse import SSEDecodeError, SSEParser
from servelab.bench.tokens import RawChunk, count_tokens
from servelab.records import ErrorKind, RequestRecord, Usage

_EXCERPT = 300
_HTML = re.compile(r"\s*<(!doctype|html)", re.IGNORECASE)
_HEAD = re.compile(r"<(head|script|style)\b.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>")
_ERROR_BODY_MAX = 64 * 1024  # of an error body, kept for its message


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
    """Sends streaming requests and records them. Use as an async context manager."""

    def __init__(self, base_url: str, options: ClientOptions | None = None):
        self.base_url = base_url.rstrip("/")
        self.options = options or ClientOptions()
        self._origin = Origin.from_url(self.base_url)
        self._headers: dict[str, str] | None = None
        self._tls: ssl.SSLContext | None = None
        # Requests that were in flight when their task was cancelled (Ctrl-C): each is recorded here with
        # error_kind "cancelled" and whatever it had received, since send() cannot return it.
        self.cancelled: list[RequestRecord] = []
        self._frozen_at = 0.0

    async def __aenter__(self) -> StreamClient:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                   "Accept-Encoding": "gzip, deflate"}
        if self.options.api_key:
            headers["Authorization"] = f"Bearer {self.options.api_key}"
        self._headers = headers
        self._keep_collector_pauses_short()  # everything alive before the first request, e.g. imported modules
        if self._origin.scheme == "https":
            self._tls = ssl.create_default_context()  # loading the CA store costs milliseconds: once per client
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._headers = None
        if self._frozen_at:
            gc.unfreeze()  # what was frozen (records, mostly) is the collector's again
            self._frozen_at = 0.0

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
        assert self._headers is not None, "use StreamClient as an async context manager"
        body = self.build_body(spec)
        payload = orjson.dumps(body)
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
        except asyncio.CancelledError:
            record.error_kind, record.error_detail = "cancelled", f"cancelled after {state.events} events"
            _finish_record(record, state)
            self.cancelled.append(record)
            raise
        _finish_record(record, state)
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
            # prefill of a long prompt can take longer than any idle gap); then the idle gap; never past the total.
            if not chunks:
                limit, kind = first_byte_limit, "timeout_first_byte"
            else:
                limit, kind = exchange.last_read_ns + idle_ns, "timeout_idle"
            if limit >= total_limit:
                limit, kind = total_limit, "timeout_total"
            now = time.perf_counter_ns()
            if now < limit:
                # Before the first token, look again within one idle period: the idle deadline starts with it.
                wake = limit if chunks else min(limit, now + idle_ns)
                timer = loop.call_later((wake - now) / 1e9, check_deadline)
                return
            waited = (now - t0) / 1e9
            exchange.abort(_Failure(kind, f"{kind.removeprefix('timeout_').replace('_', ' ')} deadline passed "
                                          f"after {waited:.1f}s ({state.events} events received)"))

        check_deadline()
        try:
            await exchange.finished
        except HTTPError as exc:
            detail = f"connection lost after {state.events} events: {exc}" if exc.kind == "disconnect" else str(exc)
            raise _Failure(exc.kind, detail, record.http_status) from None  # type: ignore[arg-type]
        except SSEDecodeError as exc:
            raise _Failure("parse", str(exc)) from None
        finally:
            if timer is not None:
                timer.cancel()
            exchange.close()
        record.t_end_ns = time.perf_counter_ns()


class _StreamHandler:
    """Receives one response from the exchange: SSE events into the stream state, or an error body."""

    __slots__ = ("record", "state", "parser", "error_body", "content_type")

    def __init__(self, record: RequestRecord, state: _StreamState):
        self.record, self.state = record, state
        self.parser = SSEParser()
        self.error_body: bytearray | None = None  # collected instead of parsed: an error status or not a stream
        self.content_type = ""

    def on_head(self, status: int, headers: dict[str, str], now_ns: int) -> None:
        self.record.t_headers_ns = now_ns
        self.record.http_status = status
        self.content_type = headers.get("Content-Type", "")
        if status >= 400 or "text/event-stream" not in self.content_type:
            self.error_body = bytearray()

    def on_body(self, data: bytes, now_ns: int) -> bool:
        if self.error_body is not None:
            if len(self.error_body) < _ERROR_BODY_MAX:
                self.error_body += data
            return False
        on_event = self.state.on_event
        for ev in self.parser.feed(data):
            if on_event(ev.data, now_ns):
                return True
        return False

    def on_end(self, now_ns: int) -> None:
        if self.error_body is not None:
            status, raw = self.record.http_status or 0, bytes(self.error_body)
            if status >= 400:
                raise _Failure("http", f"HTTP {status}: {_error_text(raw) or 'no body'}", status)
            raise _Failure("parse", _not_a_stream(raw, self.content_type), status)
        state = self.state
        for ev in self.parser.close():
            if state.on_event(ev.data, now_ns):
                return
        if state.finish_reason is None:
            raise _Failure("disconnect", f"connection closed after {state.events} events, before any "
                                         "finish_reason or [DONE]")
        # A clean end after finish_reason is a complete answer even without [DONE] (transformers serve never
        # sends it); `saw_done` keeps the deviation visible.


def _finish_record(record: RequestRecord, state: _StreamState) -> None:
    if record.t_end_ns is None:
        record.t_end_ns = time.perf_counter_ns()
    record.chunks, record.saw_done, record.finish_reason = state.events, state.saw_done, state.finish_reason
    record.usage = state.usage
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
