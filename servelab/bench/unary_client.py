"""Non-streamed requests (embeddings, rerank): one JSON request in, one RequestRecord out, never an exception.

`EndpointClient` is the StreamClient (bench/client.py) that also sends these: a RequestSpec with `expect` set is
sent here, every other one streams as before. It shares the stream client's connection, auth headers, TLS, error
kinds, Retry-After and cancellation bookkeeping, and its deadlines (docs/metrics.md#non-streamed):

- connect, as for streams;
- first byte: until the response's status line (the server computes the whole answer before it sends any of it);
- idle: the longest time without a byte after that;
- total: the whole request.

One timer per request checks them, re-armed only when it fires. The answer is read whole, up to ANSWER_MAX bytes
(an error body up to the stream client's 64 KiB), then checked against `expect`: an embedding per input, all of
one dimension (the run's, which the workload measured before the run), finite numbers, not all zeros, no two
bit-identical (the inputs always differ); one finite score per rerank document with a valid index. A wrong answer fails its request with a detail that says what was wrong.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import orjson

from servelab.bench.client import (_ERROR_BODY_MAX, MAX_PLAUSIBLE_TOKENS, RequestSpec, StreamClient, _error_text,
                                   _Failure, _StreamState, parse_retry_after)
from servelab.protocol.chunks import error_message
from servelab.protocol.http1 import HTTPError, build_request, open_exchange
from servelab.records import RequestRecord, Usage

ANSWER_MAX = 64 << 20  # an answer's body: 64 inputs of dimension 4096 are ~5 MB of JSON
_EXCERPT = 200
_ALL_FINITE = object()
WrongAnswer = _Failure  # what the answer checks raise: `.detail` says what was wrong (also the workloads' probes)


class EndpointClient(StreamClient):
    """Streams, and non-streamed JSON requests for the specs that say what their answer must be (`expect`)."""

    async def send(self, spec: RequestSpec, scheduled_ns: int | None = None) -> RequestRecord:
        if spec.expect is None:
            return await super().send(spec, scheduled_ns)
        assert self._headers is not None, "use EndpointClient as an async context manager"
        payload = orjson.dumps(spec.body)
        record = RequestRecord(index=spec.index, tag=spec.tag, warmup=spec.warmup, endpoint=spec.endpoint,
                               stream=False, input_tokens=spec.input_tokens, items=spec.expect.get("items"),
                               scheduled_ns=scheduled_ns, t_send_ns=time.perf_counter_ns())
        state = _StreamState()  # what a cancellation records: no events, no usage
        key = id(record)
        self.in_flight[key] = (asyncio.current_task(), record, state)
        try:
            answer = await self._exchange(payload, spec, record)
            record.usage = check_answer(answer, spec.expect)
            record.ok = True
        except _Failure as f:
            record.error_kind, record.error_detail = f.kind, f.detail
            record.http_status = f.status or record.http_status
            record.retry_after_s = f.retry_after_s
        except asyncio.CancelledError:
            if self.in_flight.pop(key, None) is not None:
                self._record_cancelled(record, state)
            raise
        except BaseException:
            if self.in_flight.pop(key, None) is not None:
                self._record_cancelled(record, state, "interrupted")
            raise
        self.in_flight.pop(key, None)
        if record.t_end_ns is None:
            record.t_end_ns = time.perf_counter_ns()
        self._keep_collector_pauses_short()
        return record

    async def _exchange(self, payload: bytes, spec: RequestSpec, record: RequestRecord) -> Any:
        d = self.options.deadlines
        assert self._headers is not None
        headers = {**self._headers, "Accept": "application/json", **spec.headers}
        t0 = time.perf_counter_ns()
        first_byte_limit, total_limit = t0 + int(d.first_byte_s * 1e9), t0 + int(d.total_s * 1e9)
        idle_ns = int(d.idle_s * 1e9)
        try:
            request = build_request(self._origin, spec.endpoint, payload, headers)
        except ValueError as exc:
            raise _Failure("http", f"cannot send the request: {exc}") from None
        handler = _AnswerHandler(record)
        try:
            exchange = await open_exchange(self._origin, request, handler,
                                           min(d.connect_s, d.first_byte_s, d.total_s), self._tls)
        except HTTPError as exc:
            raise _Failure(exc.kind, str(exc)) from None  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None

        def check_deadline() -> None:
            nonlocal timer
            if record.t_headers_ns is None:
                limit, kind, deadline_s = first_byte_limit, "timeout_first_byte", d.first_byte_s
            else:
                limit, kind, deadline_s = handler.last_read_ns + idle_ns, "timeout_idle", d.idle_s
            if limit >= total_limit:
                limit, kind, deadline_s = total_limit, "timeout_total", d.total_s
            now = time.perf_counter_ns()
            if now < limit:
                timer = loop.call_later((limit - now) / 1e9, check_deadline)
                return
            exchange.abort(_Failure(kind, f"{kind.removeprefix('timeout_').replace('_', ' ')} deadline passed "
                                          f"after {(now - t0) / 1e9:.1f}s ({handler.received:,} bytes of the "
                                          f"answer received; the deadline is {deadline_s:g} s)"))

        check_deadline()
        try:
            await exchange.finished
        except HTTPError as exc:
            detail = (f"connection lost after {handler.received:,} bytes of the answer: {exc}"
                      if exc.kind == "disconnect" else str(exc))
            raise _Failure(exc.kind, detail, record.http_status) from None  # type: ignore[arg-type]
        except (_Failure, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the response did to the handler costs this request only
            raise _Failure("parse", f"the answer could not be read ({type(exc).__name__}: {exc})") from None
        finally:
            if timer is not None:
                timer.cancel()
            timer = None
            check_deadline = None  # noqa: F841 - clears the closure cell (see StreamClient._stream)
            exchange.close()
            exchange = None  # noqa: F841
        record.t_end_ns = handler.end_ns or time.perf_counter_ns()
        return handler.answer


class _AnswerHandler:
    """Receives one response: the whole body, bounded, parsed as JSON at its end."""

    __slots__ = ("record", "body", "limit", "retry_after", "location", "received", "last_read_ns", "end_ns",
                 "answer")

    def __init__(self, record: RequestRecord):
        self.record = record
        self.body = bytearray()
        self.limit = ANSWER_MAX
        self.retry_after: float | None = None
        self.location: str | None = None
        self.received = 0
        self.last_read_ns = 0
        self.end_ns: int | None = None
        self.answer: Any = None

    def on_head(self, status: int, headers: dict[str, str], now_ns: int) -> None:
        self.record.t_headers_ns = self.last_read_ns = now_ns
        self.record.http_status = status
        if 300 <= status < 400:
            self.location = headers.get("Location")
        if status in (429, 503):
            self.retry_after = parse_retry_after(headers.get("Retry-After"))
        if status >= 300:
            self.limit = _ERROR_BODY_MAX

    def on_body(self, data: bytes, now_ns: int) -> bool:
        self.last_read_ns = now_ns
        self.received += len(data)
        self.body += data[:self.limit - len(self.body)]
        if len(self.body) >= self.limit:
            status = self.record.http_status or 0
            if status >= 300:
                raise self._status_failure()  # enough of an error body for its message
            raise _Failure("parse", f"the answer grew past {ANSWER_MAX >> 20} MiB; the rest was not read", status)
        return False

    def on_end(self, now_ns: int) -> None:
        self.end_ns = now_ns
        status = self.record.http_status or 0
        if status >= 300:
            raise self._status_failure()
        try:
            self.answer = orjson.loads(bytes(self.body))
        except orjson.JSONDecodeError:
            text = " ".join(bytes(self.body).decode("utf-8", "replace").split())
            raise _Failure("parse", f"the answer is not JSON: {text[:_EXCERPT]!r}", status) from None

    def _status_failure(self) -> _Failure:
        status, raw = self.record.http_status or 0, bytes(self.body)
        if status < 400:
            where = f"to {self.location!r}" if self.location else "without a Location header"
            return _Failure("http", f"HTTP {status}: a redirect {where}; servelab does not follow redirects, give "
                                    f"the URL it points to", status)
        detail = f"HTTP {status}: {_error_text(raw) or 'no body'}"
        if self.retry_after is not None:
            detail += f" (Retry-After: {self.retry_after:g} s)"
        return _Failure("http", detail, status, self.retry_after)


# ---- what a right answer is ----

def check_answer(answer: Any, expect: dict[str, Any]) -> Usage | None:
    """The answer's usage when it is right for `expect`; raises _Failure saying what is wrong otherwise."""
    if isinstance(answer, dict) and answer.get("error") is not None:
        raise _Failure("in_band", f"the answer is an error: {error_message(answer['error'])[:_EXCERPT]}")
    if expect.get("kind") == "embeddings":
        check_embeddings(answer, expect["items"], expect.get("dimension"))
    else:
        check_scores(answer, expect["items"])
    return read_usage(answer)


def check_embeddings(answer: Any, items: int, dimension: int | None) -> int:
    """One finite vector per input, each index once, all of `dimension` (when known) or of one dimension. Returns
    the dimension."""
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        raise _Failure("parse", f"the answer has no `data` list of embeddings: {_shape(answer)}")
    if len(data) != items:
        raise _Failure("parse", f"{len(data)} embeddings for {items} inputs")
    seen: set[int] = set()
    vectors: list[tuple[int, list[Any]]] = []
    for position, item in enumerate(data):
        index = item.get("index", position) if isinstance(item, dict) else None
        vector = item.get("embedding") if isinstance(item, dict) else None
        if not _is_index(index, items) or index in seen:
            raise _Failure("parse", f"embedding {position} has index {index!r}: each input's index 0-{items - 1} "
                                    f"must appear once")
        seen.add(index)
        if not isinstance(vector, list) or not vector:
            raise _Failure("parse", f"embedding {position} is not a non-empty list of numbers "
                                    f"({type(vector).__name__})")
        if dimension is None:
            dimension = len(vector)
        if len(vector) != dimension:
            raise _Failure("parse", f"embedding {position} has dimension {len(vector)}, not the run's {dimension}")
        if not _all_finite(vector):
            bad = next((x for x in vector if not _is_number(x)), _ALL_FINITE)
            raise _Failure("parse", f"embedding {position} holds {bad!r}, not a finite number")
        if not any(vector):
            raise _Failure("parse", f"embedding {position} is all zeros: no vector describes its input")
        vectors.append((position, vector))
    _refuse_identical(vectors)
    assert dimension is not None
    return dimension


def _all_finite(vector: list[Any]) -> bool:
    """Every item a finite number, at C speed (a 64x4096 answer in a few ms, not tens): a string or None in it
    raises TypeError, which is a no. JSON's true and false pass (Python's bools are ints)."""
    try:
        return all(map(math.isfinite, vector))
    except TypeError:
        return False


def _refuse_identical(vectors: list[tuple[int, list[Any]]]) -> None:
    """Different inputs (the workload's texts always differ) must not share a bit-identical vector: a server that
    answers every input with one vector (a cache, a broken pooling) is wrong. Compared by a cheap key first."""
    by_key: dict[tuple[Any, ...], list[tuple[int, list[Any]]]] = {}
    for position, vector in vectors:
        key = (vector[0], vector[len(vector) // 2], vector[-1])
        for other, seen in by_key.get(key, ()):
            if seen == vector:
                raise _Failure("parse", f"embeddings {other} and {position} are identical for different inputs")
        by_key.setdefault(key, []).append((position, vector))


def check_scores(answer: Any, documents: int) -> None:
    """One finite score per document, each document's index once, in llama.cpp's and vLLM's `results`, vLLM's
    score `data`, or SGLang's bare list."""
    if isinstance(answer, list):
        results = answer
    elif isinstance(answer, dict) and isinstance(answer.get("results"), list):
        results = answer["results"]
    elif isinstance(answer, dict) and isinstance(answer.get("data"), list):
        results = answer["data"]
    else:
        raise _Failure("parse", f"the answer has no `results` or `data` list of scores: {_shape(answer)}")
    if len(results) != documents:
        raise _Failure("parse", f"{len(results)} scores for {documents} documents")
    seen: set[int] = set()
    for position, item in enumerate(results):
        if not isinstance(item, dict):
            raise _Failure("parse", f"result {position} is not an object")
        index = item.get("index")
        score = item.get("relevance_score", item.get("score"))
        if not _is_index(index, documents) or index in seen:
            raise _Failure("parse", f"result {position} has index {index!r}: each document's index "
                                    f"0-{documents - 1} must appear once")
        seen.add(index)
        if not _is_number(score):
            raise _Failure("parse", f"result {position} (document {index}) has score {score!r}, not a finite "
                                    f"number")


def read_usage(answer: Any) -> Usage | None:
    """The answer's `usage`; for SGLang's rerank list, which has none, its results' `meta_info.prompt_tokens`
    summed (each the tokens of one query-document pair the engine scored), when every result has one."""
    if isinstance(answer, list):
        return _sglang_rerank_usage(answer)
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):
        return None
    counts: dict[str, int | None] = {}
    for name in ("prompt_tokens", "total_tokens"):
        value = usage.get(name)
        if value is None:
            counts[name] = None
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_PLAUSIBLE_TOKENS:
            shown = f"{value:,}" if isinstance(value, int) and abs(value) < 10**19 else repr(value)[:40]
            raise _Failure("parse", f"the server's usage.{name} ({shown}) is not a plausible token count; it was "
                                    f"not used")
        counts[name] = value
    return Usage(prompt_tokens=counts["prompt_tokens"], total_tokens=counts["total_tokens"])


def _sglang_rerank_usage(results: list[Any]) -> Usage | None:
    counts = [r.get("meta_info", {}).get("prompt_tokens") if isinstance(r, dict)
              and isinstance(r.get("meta_info"), dict) else None for r in results]
    if not counts or any(c is None for c in counts):
        return None
    if any(not isinstance(c, int) or isinstance(c, bool) or not 0 <= c <= MAX_PLAUSIBLE_TOKENS for c in counts):
        bad = next(c for c in counts if not isinstance(c, int) or isinstance(c, bool)
                   or not 0 <= c <= MAX_PLAUSIBLE_TOKENS)
        raise _Failure("parse", f"the server's meta_info.prompt_tokens ({repr(bad)[:40]}) is not a plausible token "
                                f"count; it was not used")
    return Usage(prompt_tokens=sum(counts), total_tokens=None)


def _is_index(value: Any, n: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < n


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shape(answer: Any) -> str:
    if isinstance(answer, dict):
        return "an object with " + (", ".join(f"`{k}`" for k in list(answer)[:6]) or "no keys")
    return f"a {type(answer).__name__}"
