"""The calibration server: an OpenAI-compatible endpoint whose timing, format and faults are scripted.

It is the ground truth for servelab's client: it records, for every byte it writes, the monotonic time right
after the write, and serves those times at GET /calibration/truth/<id>. `time.perf_counter_ns` is
CLOCK_MONOTONIC, system-wide on Linux, so a client on the same host can compare its own timestamps directly.

Run it in its own process (`python -m servelab.calibration.server --port P`) so that it never shares an event
loop with the client under test; `servelab.calibration.start_calibration_server` does that for you.

Scheduling: every write has an absolute target time (receipt + ttft + i * itl) computed before the stream
starts; the loop sleeps until the target rather than for itl after each write, so lateness never accumulates.
All bytes are encoded before the headers go out, so a write costs only the write itself. asyncio timers are
only millisecond-precise (epoll rounds timeouts up), so the last `--spin-us` before a target is busy-waited;
the spin is skipped while several streams are active, where it would steal time from the others.

Measured lateness (recorded t_ns - target) over a 1000-event stream at itl 5 ms, on a shared 2-vCPU VM:
with the default 1 ms spin p50 55 us, p90 70 us, p99 0.18-0.21 ms; with --spin-us 0 p50 0.7 ms, p99 1.3 ms.
When other processes load the CPUs, p99 grows to ~5 ms: the schedule degrades, the recorded truth does not.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import HttpVersion11, web
from pydantic import ValidationError

from servelab.calibration.script import PlannedTokenEvent, Script, plan_token_events
from servelab.calibration.styles import Dialect, Endpoint, RequestOptions, dialect_for
from servelab.calibration.ticker import Ticker
from servelab.calibration.writes import Truth, Write
from servelab.quantiles import percentile

MODEL_ID = "calibration"
TRUTH_KEEP = 4096  # truths kept, oldest dropped first (a 1000-event truth holds ~150 KB)
STALL_HOLD_MAX_S = 3600.0  # a stalled stream is held until the client leaves, at most this long
SPIN_MAX_ACTIVE_STREAMS = 2  # above this many concurrent streams, sleep only (no busy-wait)
HTML_BODY = "<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1></body></html>\n"

Ending = Literal["complete", "stall", "disconnect", "in_band_error"]


# ----------------------------------------------------------------------------------------------------------
# The plan: every write of a stream with its bytes and its target time. Each write is encoded while the stream
# waits for the previous one's target, so a write costs only the write, and a 1000-event stream does not spend
# tens of milliseconds encoding up front (which would delay every other stream on the loop).
# ----------------------------------------------------------------------------------------------------------

@dataclass
class StreamPlan:
    writes: Iterator[Write]
    ending: Ending
    ending_due_ns: int  # when the ending (stall, disconnect, in-band error) takes effect


def _slot_ns(script: Script, slot: float) -> int:
    """Offset from receipt of token slot `slot`: ttft + slot * itl (fractional slots for mid-gap writes)."""
    return int((script.ttft_ms + slot * script.itl_ms) * 1e6)


def build_plan(script: Script, dialect: Dialect, events: list[PlannedTokenEvent]) -> StreamPlan:
    cut = next((n for n in (script.stall_after_events, script.disconnect_after_events,
                            script.in_band_error_after_events) if n is not None), None)
    ending: Ending = ("stall" if script.stall_after_events is not None else
                      "disconnect" if script.disconnect_after_events is not None else
                      "in_band_error" if script.in_band_error_after_events is not None else "complete")
    # A terminal fault takes effect when event `cut` would have been due (after the last event if cut >= n).
    ending_due = _slot_ns(script, min(cut, len(events)) if cut is not None else max(len(events) - 1, 0))
    return StreamPlan(_writes(script, dialect, events, cut, ending, ending_due), ending, ending_due)


def _writes(script: Script, dialect: Dialect, events: list[PlannedTokenEvent], cut: int | None, ending: Ending,
            ending_due: int) -> Iterator[Write]:
    sep = "\r\n" if script.crlf else "\n"

    def frame(payload: str) -> bytes:
        return f"data: {payload}{sep}{sep}".encode()

    padded = False
    slot = -1  # the last token slot whose writes have begun
    raw_at = script.raw_frame_after_events if script.raw_frame is not None else None
    for chunk in dialect.chunks(events):
        ev = chunk.event
        if ev is not None and cut is not None and ev.index >= cut:
            break
        if raw_at is not None and ev is not None and ev.index == raw_at:
            yield Write(script.raw_frame.encode(), _slot_ns(script, ev.index), "raw")
            raw_at = None
        if chunk.due_event is not None and chunk.due_event > slot:
            if script.sse_comments:  # a keep-alive in the middle of the gap before this slot
                mid = script.ttft_ms / 2 * 1e6 if chunk.due_event == 0 else _slot_ns(script, chunk.due_event - 0.5)
                yield Write(f": ping{sep}{sep}".encode(), int(mid), "comment")
            slot = chunk.due_event
        if ev is not None and ev.index == script.invalid_json_after_events:
            yield Write(frame('{"id": "calibration-truncated'), _slot_ns(script, ev.index), "invalid_json")
        body = chunk.body
        if ev is not None and script.big_event_bytes and not padded:
            body, padded = _padded(body, dialect, script.big_event_bytes), True
        due = None if chunk.due_event is None else _slot_ns(script, chunk.due_event)
        write = Write(frame(dialect.encode(body)), due, ev.kind if ev else chunk.kind, ev.tokens if ev else 0)
        if ev is not None and script.split_utf8:
            write.lead, write.data = _split_inside_character(write.data)
        if ev is not None and ev.index == script.invalid_utf8_after_events:
            write.data += b'data: {"choices":[{"index":0,"delta":{"content":"\xff"}}]}' + sep.encode() * 2
        yield write
    if raw_at is not None:  # past the last token event
        yield Write(script.raw_frame.encode(), None, "raw")
    late_garbage = script.invalid_json_after_events
    if ending == "complete" and late_garbage is not None and late_garbage >= len(events):  # after all tokens
        yield Write(frame('{"id": "calibration-truncated'), None, "invalid_json")
    if ending == "in_band_error":
        error = {"error": {"message": "calibration: scripted in-band error", "type": "InternalServerError",
                           "code": 500}}
        yield Write(frame(json.dumps(error)), ending_due, "error")
    if ending in ("complete", "in_band_error") and script.send_done:
        yield Write(frame("[DONE]"), None, "done")


def _padded(body: dict[str, Any], dialect: Dialect, size: int) -> dict[str, Any]:
    """The body with a filler field that makes its framed event at least `size` bytes. Clients must ignore
    unknown fields; one that reads SSE lines with a 64 KiB limit (aiohttp's readline) breaks here."""
    base = len(dialect.encode({**body, "calibration_padding": ""}).encode()) + len("data: \n\n")
    return {**body, "calibration_padding": "x" * max(size - base, 0)}


def _split_inside_character(data: bytes) -> tuple[bytes, bytes]:
    """Cut the bytes inside the first 4-byte UTF-8 sequence (after its first two bytes)."""
    at = next((i for i, b in enumerate(data) if b >= 0xF0), -1)
    return (data[:at + 2], data[at + 2:]) if at >= 0 else (b"", data)


# ----------------------------------------------------------------------------------------------------------
# The server
# ----------------------------------------------------------------------------------------------------------

class CalibrationServer:
    def __init__(self, default: Script | None = None, spin_us: float = 1000.0, writer: str = "precise"):
        self.default = default or Script()
        self.spin_ns = int(spin_us * 1000)
        self.ticker = Ticker() if writer in ("ticker", "auto") else None  # see ticker.py
        # auto: a stream that starts while at most SPIN_MAX_ACTIVE_STREAMS others run gets the precise writer,
        # whose spin before each write also keeps a virtual CPU from dozing off between events (on a VM an idle
        # vCPU can take milliseconds to wake); busier streams go to the ticker.
        self.ticker_only = writer == "ticker"
        self.truths: OrderedDict[str, Truth] = OrderedDict()
        self.active_streams = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/calibration/truth/{id}", self.truth)
        app.router.add_get("/calibration/summary", self.summary)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "servelab"}]})

    async def truth(self, request: web.Request) -> web.Response:
        truth = self.truths.get(request.match_info["id"])
        if truth is None:
            return _error(404, f"no calibration request with id {request.match_info['id']!r}", "NotFoundError")
        return web.json_response(truth.as_json())

    async def summary(self, request: web.Request) -> web.Response:
        """Aggregate truth over the requests received since `since_ns` (default: all kept): what any client,
        including one that cannot send X-Calibration-Id, should have measured."""
        since = int(request.query.get("since_ns", "0"))
        gaps_ms: list[float] = []
        requests = tokens = 0
        first_ns = last_ns = None
        for truth in self.truths.values():
            if truth.request_received_ns < since:
                continue
            requests += 1
            tokens += sum(n for _, _, n, _ in truth.events)
            first_ns = min(first_ns or truth.request_received_ns, truth.request_received_ns)
            if truth.events:
                last_ns = max(last_ns or 0, truth.events[-1][0])
            for (t0, _, _, _), (t1, _, n, _) in zip(truth.events, truth.events[1:]):
                gaps_ms.extend([(t1 - t0) / n / 1e6] * n)
        mean = sum(gaps_ms) / len(gaps_ms) if gaps_ms else None
        gaps_ms.sort()

        def pct(q: float) -> float | None:  # the definition servelab's figures use, so both sides compare alike
            return percentile(gaps_ms, q) if gaps_ms else None

        span_s = (last_ns - first_ns) / 1e9 if first_ns is not None and last_ns is not None else 0.0
        if request.query.get("raw"):  # for merging the accounts of several server processes (processes=N)
            return web.json_response({"requests": requests, "tokens": tokens, "gaps_ms": gaps_ms,
                                      "first_ns": first_ns, "last_ns": last_ns,
                                      "late_ms": self._lateness(since)})
        return web.json_response({"requests": requests, "tokens": tokens, "itl_ms_mean": mean,
                                  "itl_ms_p50": pct(50), "itl_ms_p90": pct(90), "itl_ms_p99": pct(99),
                                  "itl_samples": len(gaps_ms), "span_s": span_s,
                                  "tokens_s": tokens / span_s if span_s > 0 else None})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self.generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.generate(request, "completions")

    async def generate(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        t0 = time.perf_counter_ns()  # "request receipt": the handler starts once the headers are parsed
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            script = self.default.merged(body.get("calibration"))
        except (ValueError, ValidationError) as e:  # json.JSONDecodeError is a ValueError
            return _error(400, f"calibration: bad request: {e}", "BadRequestError")
        cal_id = request.headers.get("X-Calibration-Id") or uuid.uuid4().hex
        stream = bool(body.get("stream"))
        truth = Truth(cal_id, endpoint, stream, script.model_dump(), t0)
        self._keep(truth)
        headers = {"X-Calibration-Id": cal_id}

        if script.redirect_to is not None:
            truth.finish("redirect")
            return web.Response(status=302, headers={**headers, "Location": script.redirect_to})
        if script.http_status is not None:
            truth.finish("http_error")
            if script.retry_after is not None:
                headers["Retry-After"] = script.retry_after
            return _error(script.http_status, "calibration: scripted HTTP error", "InternalServerError", headers)
        if script.html:
            truth.finish("html")
            return web.Response(text=HTML_BODY, content_type="text/html", headers=headers)

        events = plan_token_events(script)
        dialect = dialect_for(script, RequestOptions.from_body(endpoint, body))
        if not stream:
            return await self.whole(request, script, dialect, events, truth, headers)
        plan = build_plan(script, dialect, events)
        self.active_streams += 1
        try:
            return await self.stream(request, plan, truth, headers)
        finally:
            self.active_streams -= 1

    async def whole(self, request: web.Request, script: Script, dialect: Dialect,
                    events: list[PlannedTokenEvent], truth: Truth, headers: dict[str, str]) -> web.StreamResponse:
        """Non-streaming: the whole completion once the last event would have gone out."""
        due = truth.request_received_ns + _slot_ns(script, max(len(events) - 1, 0))
        if script.stall_after_events is not None:
            await self.hold(request, truth)
            return web.Response(status=204)  # never seen: the client is gone by now
        await self.sleep_until(due)
        if script.disconnect_after_events is not None:
            return self.abort(request, truth)
        resp = web.Response(text=dialect.encode(dialect.completion_body(events)), content_type="application/json",
                            headers=headers)
        await resp.prepare(request)
        await resp.write_eof()
        truth.headers_sent_ns = time.perf_counter_ns()
        truth.finish("complete")
        return resp

    async def stream(self, request: web.Request, plan: StreamPlan, truth: Truth,
                     headers: dict[str, str]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           **headers})
        await resp.prepare(request)
        truth.headers_sent_ns = time.perf_counter_ns()
        t0 = truth.request_received_ns
        try:
            transport = request.transport
            busy = self.ticker_only or self.active_streams > SPIN_MAX_ACTIVE_STREAMS
            if self.ticker is not None and busy and request.version >= HttpVersion11 and transport is not None:
                await self.ticker.stream(transport, plan.writes, truth)  # HTTP/1.1: aiohttp made the body chunked
            for write in plan.writes:  # the precise writer (with the ticker, every write is already out)
                if write.lead:
                    await resp.write(write.lead)
                if write.due_ns is not None:
                    await self.sleep_until(t0 + write.due_ns)
                await resp.write(write.data)
                truth.record(write, time.perf_counter_ns())
            if plan.ending == "stall":
                await self.sleep_until(t0 + plan.ending_due_ns)
                await self.hold(request, truth)
                return resp
            if plan.ending == "disconnect":
                await self.sleep_until(t0 + plan.ending_due_ns)
                return self.abort(request, truth)
            await resp.write_eof()
        except ConnectionError:  # the client went away (aiohttp raises ClientConnectionResetError)
            truth.finish("client_gone")
            return resp
        truth.finish("in_band_error" if plan.ending == "in_band_error" else "complete")
        return resp

    async def sleep_until(self, target_ns: int) -> None:
        spin = self.spin_ns if self.active_streams <= SPIN_MAX_ACTIVE_STREAMS else 0
        remaining = target_ns - time.perf_counter_ns()
        if remaining > spin:
            await asyncio.sleep((remaining - spin) / 1e9)
        while time.perf_counter_ns() < target_ns:  # busy-wait the last stretch: asyncio wakes up to 1 ms late
            pass

    async def hold(self, request: web.Request, truth: Truth) -> None:
        """Stall: send nothing more, keep the connection open until the client leaves (or a long cap)."""
        truth.outcome = "stalled"
        deadline = time.monotonic() + STALL_HOLD_MAX_S
        while time.monotonic() < deadline:
            transport = request.transport
            if transport is None or transport.is_closing():
                break
            await asyncio.sleep(0.05)
        truth.finish("stalled")

    def abort(self, request: web.Request, truth: Truth) -> web.StreamResponse:
        """Close the TCP connection without ending the HTTP response (no terminating chunk)."""
        if request.transport is not None:
            request.transport.abort()
        truth.control_events.append((time.perf_counter_ns(), "disconnect"))
        truth.finish("disconnected")
        return web.Response(status=204)  # never written: the transport is gone

    def _lateness(self, since: int) -> list[float]:
        """How late each token write went out against its target (ms), for requests received since `since`: the
        server's own lag, which says whether the server kept its schedule (selftest: which side was the limit)."""
        return [(t - target) / 1e6 for truth in self.truths.values() if truth.request_received_ns >= since
                for t, target, _, _ in truth.events if target is not None]

    def _keep(self, truth: Truth) -> None:
        self.truths[truth.id] = truth
        self.truths.move_to_end(truth.id)
        while len(self.truths) > TRUTH_KEEP:
            self.truths.popitem(last=False)


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> web.Response:
    """An OpenAI-style error body, as vLLM and llama.cpp send it."""
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": status}},
                             status=status, headers=headers)


# ----------------------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m servelab.calibration.server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = any free port")
    p.add_argument("--reuse-port", action="store_true",
                   help="SO_REUSEPORT: several server processes share the port, the kernel spreading connections "
                        "over them (start_calibration_server(processes=N)); each also listens on a port of its own "
                        "for /calibration/truth and /calibration/summary, since a truth is held by the process that "
                        "served the request")
    p.add_argument("--default-script", default=None, help="JSON object: the Script used when a request has none")
    p.add_argument("--writer", choices=("precise", "ticker", "auto"), default="precise",
                   help="precise: a timer per stream, spin before each write; ticker: one timer for all streams "
                        "(cheap, ~1 ms schedule precision; for client-ceiling measurements); auto: precise while "
                        f"at most {SPIN_MAX_ACTIVE_STREAMS} streams run, the ticker beyond")
    p.add_argument("--spin-us", type=float, default=1000.0,
                   help="busy-wait this long before each target time (0 = rely on asyncio timers alone)")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    default = Script.model_validate_json(args.default_script) if args.default_script else Script()
    runner = web.AppRunner(CalibrationServer(default, args.spin_us, args.writer).app(), access_log=None,
                           shutdown_timeout=1.0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_port=args.reuse_port or None)
    await site.start()
    port = runner.addresses[0][1]
    own = port
    if args.reuse_port:  # this process's own port: its truths, whichever process the kernel gave a request to
        mine = web.TCPSite(runner, args.host, 0)
        await mine.start()
        own = runner.addresses[-1][1]
    gc.freeze()  # startup objects never need collecting; keeps collector pauses short during streams
    # The first stdout line is the contract with start_calibration_server: it reads the port from it.
    print(f"LISTENING {args.host} {port}" + (f" {own}" if args.reuse_port else ""), flush=True)
    print(f"calibration server on http://{args.host}:{port}", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        # asyncio's own loop, not uvloop: its transport.write sends before returning, so the time taken right
        # after it is when the bytes reached the kernel. uvloop queues small writes until the end of the loop
        # iteration, which would make every recorded write time early.
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
