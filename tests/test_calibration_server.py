"""The calibration server does what its script says: bytes, token counts, usage, timing and every fault.

One server process serves the whole module (each request carries its own script). Tests read the wire with
aiohttp and parse SSE themselves, so these tests do not depend on servelab's client.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from servelab.calibration import Script, count_tokens, start_calibration_server, token_text
from servelab.calibration.script import plan_token_events

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ASK_EVERYTHING = {"stream_options": {"include_usage": True, "continuous_usage_stats": True},
                  "timings_per_token": True}


@pytest.fixture(scope="module")
def cal():
    with start_calibration_server() as handle:
        yield handle


# ------------------------------------------------------------------------------------------------------------
# Reading the wire
# ------------------------------------------------------------------------------------------------------------

@dataclass
class SseEvent:
    t_ns: int  # client receive time of the read that completed the event
    data: str | None  # the data: payload, or None for a comment block
    comment: str | None = None

    def json(self) -> dict[str, Any]:
        return json.loads(self.data or "")


@dataclass
class Received:
    status: int
    content_type: str
    t_sent_ns: int
    reads: list[tuple[int, bytes]] = field(default_factory=list)
    error: BaseException | None = None

    @property
    def raw(self) -> bytes:
        return b"".join(chunk for _, chunk in self.reads)

    def events(self) -> list[SseEvent]:
        """SSE events, decoded incrementally (a UTF-8 character may be split across reads)."""
        decoder = codecs.getincrementaldecoder("utf-8")()
        buffer, out = "", []
        for t_ns, chunk in self.reads:
            buffer += decoder.decode(chunk)
            buffer = buffer.replace("\r\n", "\n")
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                if block.startswith(":"):
                    out.append(SseEvent(t_ns, None, block[1:].strip()))
                else:
                    assert block.startswith("data: "), block[:80]
                    out.append(SseEvent(t_ns, block[len("data: "):]))
        assert buffer == "", f"trailing bytes that are not a complete event: {buffer[:80]!r}"
        return out

    def data(self) -> list[str]:
        return [e.data for e in self.events() if e.data is not None]

    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(d) for d in self.data() if d != "[DONE]"]


async def _post(url: str, path: str, body: dict[str, Any], cal_id: str | None = None,
                stop_after_s: float | None = None) -> Received:
    headers = {"X-Calibration-Id": cal_id} if cal_id else {}
    async with aiohttp.ClientSession() as session:
        t_sent = time.perf_counter_ns()
        async with session.post(url + path, json=body, headers=headers) as resp:
            got = Received(resp.status, resp.headers.get("Content-Type", ""), t_sent)
            try:
                async with asyncio.timeout(stop_after_s):
                    async for chunk in resp.content.iter_any():
                        got.reads.append((time.perf_counter_ns(), chunk))
            except (aiohttp.ClientError, TimeoutError) as e:
                got.error = e
            return got


def post(url: str, path: str, body: dict[str, Any], **kw: Any) -> Received:
    return asyncio.run(_post(url, path, body, **kw))


def stream_body(endpoint: str, script: dict[str, Any], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "calibration", "stream": True, "max_tokens": 64, "calibration": script, **extra}
    if endpoint == CHAT:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    return body


def texts(chunks: list[dict[str, Any]], field_name: str) -> str:
    """Concatenated delta.<field> (chat) or text (completions) over all chunks."""
    out = []
    for c in chunks:
        for choice in c.get("choices", []):
            value = choice.get("delta", {}).get(field_name) if "delta" in choice else choice.get(field_name)
            out.append(value or "")
    return "".join(out)


def expected_text(kind: str, n: int, multibyte: bool = False) -> str:
    return "".join(token_text(kind, i, multibyte) for i in range(n))  # type: ignore[arg-type]


def tokens_in(chunk: dict[str, Any]) -> int:
    """Tokens carried by one chunk, counted from its texts (content, reasoning or completion text)."""
    strings = [v for ch in chunk.get("choices", []) for v in (ch.get("delta") or {"text": ch.get("text")}).values()
               if isinstance(v, str)]
    counts = count_tokens("".join(strings))
    return counts.answer + counts.reasoning


def token_chunks(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in chunks if tokens_in(c)]


# ------------------------------------------------------------------------------------------------------------
# Script
# ------------------------------------------------------------------------------------------------------------

def test_events_group_reasoning_then_answer_and_never_mix_kinds():
    events = plan_token_events(Script(reasoning_tokens=5, output_tokens=9, tokens_per_event=4))
    assert [(e.kind, e.tokens) for e in events] == [("reasoning", 4), ("reasoning", 1), ("answer", 4),
                                                    ("answer", 4), ("answer", 1)]
    assert [e.completion_tokens_after for e in events] == [4, 5, 9, 13, 14]
    assert events[2].text == " a0 a1 a2 a3"


def test_token_texts_count_back_in_both_variants():
    text = expected_text("reasoning", 3, True) + expected_text("answer", 12, True)
    assert len(text.encode()) > len(text)  # really multi-byte
    assert count_tokens(text).reasoning == 3 and count_tokens(text).answer == 12


def test_script_rejects_unknown_keys_and_two_terminal_faults():
    with pytest.raises(ValueError):
        Script.model_validate({"ttft": 5})
    with pytest.raises(ValueError):
        Script(stall_after_events=1, disconnect_after_events=2)


# ------------------------------------------------------------------------------------------------------------
# Formats: every usage style, both endpoints, 1 and 4 tokens per event
# ------------------------------------------------------------------------------------------------------------

STYLES = ["separate_chunk", "last_chunk", "none", "continuous", "llamacpp_timings"]


@pytest.mark.parametrize("tokens_per_event", [1, 4])
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
def test_stream_matches_script(cal, endpoint, style, tokens_per_event):
    script = {"ttft_ms": 5, "itl_ms": 1, "reasoning_tokens": 5, "output_tokens": 9, "prompt_tokens": 7,
              "tokens_per_event": tokens_per_event, "usage_style": style, "send_done": style != "last_chunk"}
    got = post(cal.url, endpoint, stream_body(endpoint, script, **ASK_EVERYTHING))
    assert got.status == 200 and got.content_type.startswith("text/event-stream") and got.error is None
    data = got.data()
    assert (data[-1] == "[DONE]") == (style != "last_chunk") and data.count("[DONE]") <= 1
    chunks = got.chunks()  # every other data line is JSON

    if endpoint == CHAT:
        assert texts(chunks, "content") == expected_text("answer", 9)
        assert texts(chunks, "reasoning_content") == expected_text("reasoning", 5)
        assert chunks[0]["object"] == "chat.completion.chunk"
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    else:
        assert texts(chunks, "text") == expected_text("reasoning", 5) + expected_text("answer", 9)
        assert all(c["object"] == "text_completion" for c in chunks)
    carrying = token_chunks(chunks)
    assert len(carrying) == math.ceil(5 / tokens_per_event) + math.ceil(9 / tokens_per_event)
    assert sum(tokens_in(c) for c in carrying) == 14
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch.get("finish_reason")]
    assert finishes == ["length"]

    usages = [c["usage"] for c in chunks if c.get("usage")]
    expected_usage = {"prompt_tokens": 7, "completion_tokens": 14, "total_tokens": 21}
    if style == "none":
        assert usages == []
    else:
        assert {k: usages[-1][k] for k in expected_usage} == expected_usage
    last_with_usage = next((c for c in reversed(chunks) if c.get("usage")), None)
    if style in ("separate_chunk", "continuous") or (style == "llamacpp_timings" and endpoint == CHAT):
        assert last_with_usage is chunks[-1] and chunks[-1]["choices"] == []  # a separate usage chunk
    if style == "last_chunk" or (style == "llamacpp_timings" and endpoint == COMPLETIONS):
        assert last_with_usage is chunks[-1] and chunks[-1]["choices"][0]["finish_reason"] == "length"
    if style == "separate_chunk":
        assert len(usages) == 1
    running = 0
    for c in chunks:  # per-chunk running counts agree with the text received so far
        running += tokens_in(c) if c["choices"] else 0
        if style == "continuous":
            assert c["usage"]["completion_tokens"] == running
        if style == "llamacpp_timings" and c in carrying:
            assert c["timings"]["predicted_n"] == running


def test_extras_only_when_the_request_asks_like_the_engines(cal):
    script = {"ttft_ms": 1, "itl_ms": 0, "output_tokens": 4}
    plain = post(cal.url, CHAT, stream_body(CHAT, {**script, "usage_style": "separate_chunk"}))
    assert not any("usage" in c for c in plain.chunks())
    usage_only = post(cal.url, CHAT, stream_body(CHAT, {**script, "usage_style": "continuous"},
                                                 stream_options={"include_usage": True}))
    assert [bool(c.get("usage")) for c in usage_only.chunks()] == [False] * 5 + [True]  # vLLM: final chunk only
    no_timings = post(cal.url, CHAT, stream_body(CHAT, {**script, "usage_style": "llamacpp_timings"}))
    assert [("timings" in c) for c in no_timings.chunks()] == [False] * 5 + [True]  # only the finish chunk
    completions = post(cal.url, COMPLETIONS, stream_body(COMPLETIONS, {**script, "usage_style": "last_chunk"}))
    assert completions.chunks()[-1]["usage"]["completion_tokens"] == 4  # llama.cpp: always, unasked


def test_reasoning_field_and_role_chunk_follow_the_script(cal):
    got = post(cal.url, CHAT, stream_body(CHAT, {"ttft_ms": 1, "itl_ms": 0, "reasoning_tokens": 2, "output_tokens": 1,
                                                 "reasoning_field": "reasoning", "role_chunk": False}))
    chunks = got.chunks()
    assert texts(chunks, "reasoning") == " r0 r1" and texts(chunks, "reasoning_content") == ""
    assert all("role" not in ch.get("delta", {}) for c in chunks for ch in c["choices"])


def test_transformers_role_chunk_arrives_before_generation(cal):
    got = post(cal.url, CHAT, stream_body(CHAT, {"ttft_ms": 150, "itl_ms": 1, "output_tokens": 1,
                                                 "usage_style": "last_chunk"}), cal_id="tf-role")
    first, token = got.events()[0], got.events()[1]
    assert first.json()["choices"][0]["delta"] == {"role": "assistant"}
    assert (token.t_ns - first.t_ns) / 1e6 > 100  # the role chunk came with the headers, not with the token


def test_non_stream_returns_the_whole_completion_after_the_last_event_time(cal):
    script = {"ttft_ms": 30, "itl_ms": 10, "reasoning_tokens": 2, "output_tokens": 5, "tokens_per_event": 2}
    body = {**stream_body(CHAT, script), "stream": False}
    got = post(cal.url, CHAT, body)
    elapsed_ms = (got.reads[-1][0] - got.t_sent_ns) / 1e6
    assert elapsed_ms >= 30 + 3 * 10  # 4 events: ttft + 3 gaps
    result = json.loads(got.raw)
    assert result["object"] == "chat.completion"
    assert result["choices"][0]["message"]["content"] == expected_text("answer", 5)
    assert result["choices"][0]["message"]["reasoning_content"] == expected_text("reasoning", 2)
    assert result["usage"] == {"prompt_tokens": 8, "total_tokens": 15, "completion_tokens": 7}


# ------------------------------------------------------------------------------------------------------------
# Timing truth
# ------------------------------------------------------------------------------------------------------------

def test_truth_records_scheduled_times_that_the_client_can_compare(cal):
    got = post(cal.url, CHAT, stream_body(CHAT, {"ttft_ms": 60, "itl_ms": 8, "output_tokens": 20,
                                                 "tokens_per_event": 2}), cal_id="timing")
    truth = cal.truth("timing")
    assert truth["outcome"] == "complete" and truth["stream"] is True
    events = truth["events"]
    assert [e["tokens"] for e in events] == [2] * 10 and {e["kind"] for e in events} == {"answer"}
    assert truth["request_received_ns"] < truth["headers_sent_ns"] < events[0]["t_ns"] < truth["completed_ns"]

    # Bounds are loose on purpose (a busy CI machine adds tens of ms); the measured accuracy on a quiet machine is
    # tens of microseconds, see the module docstring of servelab.calibration.server.
    ttft_ms = (events[0]["t_ns"] - truth["request_received_ns"]) / 1e6
    assert 60 <= ttft_ms < 80
    mean_gap_ms = (events[-1]["t_ns"] - events[0]["t_ns"]) / 1e6 / (len(events) - 1)
    assert abs(mean_gap_ms - 8) < 2
    late_ms = [(e["t_ns"] - e["target_ns"]) / 1e6 for e in events]
    assert all(0 <= x < 20 for x in late_ms)  # never early, and lateness does not accumulate

    # Same clock on both sides: the client saw each token event just after the server wrote it.
    received = [e.t_ns for e in got.events() if e.data and e.data != "[DONE]" and tokens_in(e.json())]
    assert len(received) == len(events)
    delays_ms = [(r - e["t_ns"]) / 1e6 for r, e in zip(received, events, strict=True)]
    # The server stamps right *after* its write returns, so on a busy machine the client may read first: a
    # slightly negative delay is the server being descheduled between write and stamp, not a clock problem.
    # Only the median is bounded: a loaded machine delays single reads by tens of ms either way.
    assert -2 < statistics.median(delays_ms) < 10


def test_truth_for_an_unknown_id_is_404(cal):
    got = post(cal.url, "/v1/completions", {"calibration": {"nope": 1}})
    assert got.status == 400 and "nope" in json.loads(got.raw)["error"]["message"]

    async def get(path: str) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s, s.get(cal.url + path) as r:
            return r.status, await r.json()
    assert asyncio.run(get("/calibration/truth/never-sent"))[0] == 404
    assert asyncio.run(get("/health")) == (200, {"status": "ok"})
    status, models = asyncio.run(get("/v1/models"))
    assert status == 200 and [m["id"] for m in models["data"]] == ["calibration"]


def test_server_default_script_is_merged_under_the_request():
    with start_calibration_server(Script(output_tokens=3, ttft_ms=1, itl_ms=0, usage_style="none")) as other:
        got = post(other.url, CHAT, stream_body(CHAT, {"output_tokens": 2}))
    assert other.proc.poll() is not None  # stopped on leaving the with block
    chunks = got.chunks()
    assert texts(chunks, "content") == " a0 a1" and not any("usage" in c for c in chunks)


# ------------------------------------------------------------------------------------------------------------
# Faults
# ------------------------------------------------------------------------------------------------------------

def test_stall_sends_nothing_more_and_holds_the_connection(cal):
    got = post(cal.url, CHAT, stream_body(CHAT, {"ttft_ms": 5, "itl_ms": 5, "output_tokens": 10,
                                                 "stall_after_events": 3}), cal_id="stall", stop_after_s=1.2)
    assert isinstance(got.error, TimeoutError)  # still open after 1.2 s: no end of stream, no error
    assert len(token_chunks(got.chunks())) == 3
    silent_s = (time.perf_counter_ns() - got.reads[-1][0]) / 1e9
    assert silent_s >= 1.0
    deadline = time.monotonic() + 2
    while cal.truth("stall")["outcome"] != "stalled" or cal.truth("stall")["completed_ns"] is None:
        assert time.monotonic() < deadline, "the server did not notice the client leaving"
        time.sleep(0.05)


def test_disconnect_breaks_the_payload(cal):
    got = post(cal.url, COMPLETIONS, stream_body(COMPLETIONS, {"ttft_ms": 1, "itl_ms": 2, "output_tokens": 10,
                                                               "disconnect_after_events": 4}))
    assert isinstance(got.error, (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError))
    assert len(token_chunks(got.chunks())) == 4


def test_http_status_comes_with_an_openai_error_body(cal):
    got = post(cal.url, CHAT, stream_body(CHAT, {"http_status": 503}))
    assert got.status == 503 and got.content_type.startswith("application/json")
    error = json.loads(got.raw)["error"]
    assert error["code"] == 503 and error["message"] and error["type"]


def test_html_answers_200_text_html(cal):
    got = post(cal.url, CHAT, stream_body(CHAT, {"html": True}))
    assert got.status == 200 and got.content_type.startswith("text/html") and got.raw.startswith(b"<html")


def test_invalid_json_is_one_bad_line_in_an_otherwise_complete_stream(cal):
    got = post(cal.url, CHAT, stream_body(CHAT, {"ttft_ms": 1, "itl_ms": 1, "output_tokens": 5,
                                                 "invalid_json_after_events": 2}))
    bad = []
    for d in got.data():
        try:
            json.loads(d) if d != "[DONE]" else None
        except json.JSONDecodeError:
            bad.append(d)
    assert len(bad) == 1 and got.data()[-1] == "[DONE]"
    parsed = [json.loads(d) for d in got.data() if d not in bad and d != "[DONE]"]
    assert texts(parsed, "content") == expected_text("answer", 5)
    assert texts(parsed[:3], "content") == " a0 a1" and bad[0] == got.data()[3]  # role, a0, a1, then the bad line


def test_in_band_error_ends_a_200_stream(cal):
    got = post(cal.url, CHAT, stream_body(CHAT, {"ttft_ms": 1, "itl_ms": 1, "output_tokens": 5,
                                                 "in_band_error_after_events": 2}), cal_id="in-band")
    assert got.status == 200
    chunks = got.chunks()
    assert "error" in chunks[-1] and {"message", "type", "code"} <= set(chunks[-1]["error"])
    assert texts(chunks[:-1], "content") == " a0 a1" and got.data()[-1] == "[DONE]"
    assert not any(ch.get("finish_reason") for c in chunks[:-1] for ch in c["choices"])
    assert cal.truth("in-band")["outcome"] == "in_band_error"


def test_comments_arrive_between_events(cal):
    got = post(cal.url, CHAT, stream_body(CHAT, {"ttft_ms": 20, "itl_ms": 20, "output_tokens": 3,
                                                 "sse_comments": True}), cal_id="comments")
    events = got.events()
    assert [e.comment for e in events if e.comment is not None] == ["ping"] * 3
    assert texts(got.chunks(), "content") == " a0 a1 a2"
    truth = cal.truth("comments")
    comment_times = [c["t_ns"] for c in truth["control_events"] if c["kind"] == "comment"]
    token_times = [e["t_ns"] for e in truth["events"]]
    assert comment_times[0] < token_times[0] < comment_times[1] < token_times[1] < comment_times[2] < token_times[2]


def test_crlf_line_endings(cal):
    got = post(cal.url, CHAT, stream_body(CHAT, {"ttft_ms": 1, "itl_ms": 0, "output_tokens": 3, "crlf": True,
                                                 "sse_comments": True}))
    assert b"\r\n\r\n" in got.raw and b"\n" not in got.raw.replace(b"\r\n", b"")
    assert texts(got.chunks(), "content") == " a0 a1 a2"


def test_big_event_arrives_intact(cal):
    got = post(cal.url, CHAT, stream_body(CHAT, {"ttft_ms": 1, "itl_ms": 1, "output_tokens": 3,
                                                 "big_event_bytes": 70_000}))
    sizes = [len(d.encode()) for d in got.data()]
    assert max(sizes) > 65_536 and sum(s > 65_536 for s in sizes) == 1
    assert texts(got.chunks(), "content") == " a0 a1 a2"


def test_split_utf8_reaches_the_client_split_and_decodes_incrementally(cal):
    got = post(cal.url, CHAT, stream_body(CHAT, {"ttft_ms": 10, "itl_ms": 15, "output_tokens": 4,
                                                 "split_utf8": True}))
    undecodable_alone = 0
    for _, chunk in got.reads:
        try:
            chunk.decode("utf-8")
        except UnicodeDecodeError:
            undecodable_alone += 1
    assert undecodable_alone >= 2  # at least one split lands at the client on each side of the cut
    content = texts(got.chunks(), "content")  # Received.events() decodes incrementally
    assert content == expected_text("answer", 4, multibyte=True) and count_tokens(content).answer == 4


def test_summary_reports_the_gaps_the_server_wrote() -> None:
    """The aggregate truth any client can be compared against, without sending a calibration id."""
    import time
    import urllib.request

    from servelab.calibration import Script, start_calibration_server

    with start_calibration_server(Script(ttft_ms=1, itl_ms=4, output_tokens=20, tokens_per_event=2)) as cal:
        since = time.perf_counter_ns()
        body = json.dumps({"model": "calibration", "prompt": "x", "stream": True}).encode()
        for _ in range(2):
            req = urllib.request.Request(cal.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                r.read()
        with urllib.request.urlopen(f"{cal.url}/calibration/summary?since_ns={since}", timeout=10) as r:
            summary = json.loads(r.read())
    assert summary["requests"] == 2 and summary["tokens"] == 40
    assert summary["itl_samples"] == 2 * 18  # 9 gaps per request, 2 tokens each
    assert 1.5 < summary["itl_ms_mean"] < 6  # 4 ms per event of 2 tokens: ~2 ms per token, loose on a busy box
    assert summary["itl_ms_p50"] <= summary["itl_ms_p90"] <= summary["itl_ms_p99"]
    assert 1.5 < summary["itl_ms_p50"] < 6
    # tokens per second over the span from the first receipt to the last write
    assert summary["tokens_s"] == pytest.approx(40 / summary["span_s"])


@pytest.mark.parametrize("writer", ["precise", "ticker"])
def test_a_client_that_leaves_mid_stream_is_recorded_as_gone(writer: str) -> None:
    """The client reads a few events and closes: the truth says `client_gone`, keeps what went out before, and
    the server goes on serving (with the ticker, the stream is dropped from the shared timer's heap)."""
    import socket
    import urllib.request

    with start_calibration_server(writer=writer) as handle:
        host, port = handle.url.removeprefix("http://").split(":")
        body = json.dumps(stream_body(CHAT, {"output_tokens": 200, "itl_ms": 10})).encode()
        request = (f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                   f"X-Calibration-Id: leaver\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(request)
            received = b""
            while received.count(b"data: ") < 5:
                received += sock.recv(65536)
        deadline = time.monotonic() + 10
        truth = handle.truth("leaver")
        while truth["outcome"] == "in_progress" and time.monotonic() < deadline:
            time.sleep(0.05)
            truth = handle.truth("leaver")
        assert truth["outcome"] == "client_gone"
        assert 4 <= len(truth["events"]) < 200  # what was written before the close, not the whole script
        with urllib.request.urlopen(f"{handle.url}/health", timeout=5) as r:
            assert r.status == 200


def test_separate_cpus_puts_the_server_apart_and_gives_this_process_its_cpus_back() -> None:
    import os
    import subprocess
    import sys

    from servelab.calibration import separate_cpus

    before = os.sched_getaffinity(0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with separate_cpus(child.pid) as pinning:
            if len(before) < 2:
                assert pinning is None
            else:
                assert os.sched_getaffinity(child.pid) == set(pinning["server_cpus"])
                assert os.sched_getaffinity(0) == set(pinning["client_cpus"])
                assert not set(pinning["server_cpus"]) & set(pinning["client_cpus"])
        assert os.sched_getaffinity(0) == before
    finally:
        child.kill()
        child.wait()
