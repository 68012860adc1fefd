"""verify against a server that floods, stalls or misbehaves below HTTP (issue 27): bounded like bench (peak RSS
under 300 MB, the bound and what was seen in the check's reason), stopping after two silent deadlines in a row,
naming redirects instead of following them, and one-line reasons naming what the server sent instead of library
errors with a status the server never sent. Every server here is a loopback one the test starts
(tests/faulty_server.py: GETs get a model list, each POST gets the scripted fault)."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import zlib
from typing import Any

import pytest

from faulty_server import FaultyServer, huge_header_line, many_headers, never_answers
from peak_rss import run_measured
from servelab.verify import verify

SERVELAB = [sys.executable, "-m", "servelab.cli"]
NO_LIBRARY_ERRORS = ("ClientResponseError", "ClientPayloadError", "message=", "url=")


# ---------------------------------------------------------------------------------------------------------------
# Faults: each writes its answer to one POST, until the client goes
# ---------------------------------------------------------------------------------------------------------------

async def gzip_bomb(reader, writer, head, status: bytes = b"200 OK", inflated: int = 1 << 30) -> None:
    """A gzip body of zeros that inflates to `inflated` bytes (~1 MB on the wire for 1 GB)."""
    writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                 b"Connection: close\r\n\r\n")
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    for _ in range(inflated >> 20):
        writer.write(packer.compress(block))
        await writer.drain()
    writer.write(packer.flush())
    await writer.drain()


async def sse_line(reader, writer, head, size: int = 32 << 20, newline: bool = True) -> None:
    """One SSE event whose data line is `size` bytes (ended, or never ended and the connection closed)."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: ")
    block = b"a" * (1 << 20)
    for _ in range(size >> 20):
        writer.write(block)
        await writer.drain()
    if newline:
        writer.write(b"\n\n")
    await writer.drain()


async def line_without_newline(reader, writer, head) -> None:
    await sse_line(reader, writer, head, size=64 << 20, newline=False)


async def tiny_events(reader, writer, head, count: int = 20_000_000) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
    block = b"data: {}\n\n" * 10_000
    for _ in range(count // 10_000):
        writer.write(block)
        await writer.drain()


async def bomb_with_500(reader, writer, head) -> None:
    await gzip_bomb(reader, writer, head, status=b"500 Internal Server Error")


def raw_answer(data: bytes):
    async def fault(reader, writer, head) -> None:
        writer.write(data)
        await writer.drain()
    return fault


# ---------------------------------------------------------------------------------------------------------------
# `servelab verify` in a subprocess, its own peak RSS (tests/peak_rss.py)
# ---------------------------------------------------------------------------------------------------------------

def run_verify(url: str, *more: str, timeout: float = 240) -> tuple[int, dict[str, Any], float, float, str]:
    """(exit code, the --json result, wall seconds, peak RSS in MB, stderr): the peak is verify's own
    (tests/peak_rss.py), never the test process's."""
    argv = [*SERVELAB, "verify", url, "--model", "m", "--json", *more]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            code, wall, peak_mb = run_measured(argv, timeout, out, err)
        except AssertionError as exc:
            err.seek(0)
            raise AssertionError(f"{exc}: {err.read()[-2000:]!r}") from None
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode(errors="replace")
    result = json.loads(stdout) if stdout.strip().startswith("{") else {}
    return code, result, wall, peak_mb, stderr


def reasons(result: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["reason"] for c in result.get("checks", [])}


FLOODS = {
    # fault, the chat check's reason (the check that reads a plain answer), the stream check's
    "gzip_bomb_1gb": (gzip_bomb, "answer inflated past 16 MiB: a compressed body that never ends", None),
    "gzip_bomb_1gb_http_500": (bomb_with_500, "answer inflated past 16 MiB: a compressed body that never ends",
                               None),
    "sse_line_32mb": (sse_line, None, "a line of the stream grew past 1 MiB without its end"),
    "line_64mb_without_newline": (line_without_newline, None, "a line of the stream grew past 1 MiB without its end"),
    "tiny_events": (tiny_events, None, "the stream sent more than 100,000 events"),
    "header_256mb": (huge_header_line, "the response headers grew past 64 KiB", "the response headers grew past"),
    "headers_2_million": (many_headers, "more than 128 headers", "more than 128 headers"),
}


@pytest.mark.parametrize("name", list(FLOODS))
def test_verify_under_a_flood_stays_under_300_mb_and_names_the_bound(name: str) -> None:
    # Before (issue 27): a 1 GB gzip bomb took verify to 5.2 GB RSS (8.3 GB with HTTP 500), a 32 MB SSE line to
    # 766 MB, a 64 MB line without newline to 450 MB, many tiny events to 472 MB.
    fault, chat_reason, stream_reason = FLOODS[name]
    with FaultyServer(fault) as srv:
        code, result, wall, peak_mb, stderr = run_verify(srv.url, "--timeout", "30")  # every check
    assert code == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    got = reasons(result)
    assert set(got) >= {"chat", "chat_stream"}, got
    if chat_reason:
        assert chat_reason in got["chat"], got
    if stream_reason:
        assert stream_reason in got["chat_stream"], got
    for reason in got.values():
        assert "timed out" not in reason and not any(s in reason for s in NO_LIBRARY_ERRORS), got
    assert peak_mb < 300, f"{name}: peak RSS {peak_mb:.0f} MB"
    assert wall < 120


def test_the_sdk_check_is_skipped_once_an_answer_went_past_the_bounds() -> None:
    with FaultyServer(gzip_bomb) as srv:
        checks = {c.id: c for c in verify(srv.url, model="m", only=["chat", "openai_sdk"]).checks}
    assert checks["chat"].outcome == "fail"
    assert checks["openai_sdk"].outcome == "skip"
    assert checks["openai_sdk"].reason.startswith("not run against a hostile server: an earlier check's answer "
                                                  "went past verify's bounds (answer inflated past 16 MiB")


@pytest.mark.parametrize("fault,expected", [
    (gzip_bomb, "answer inflated past 16 MiB: a compressed body that never ends"),
    (sse_line, "answer larger than 16 MiB: the rest was not read")])
def test_the_sdk_check_alone_reads_through_the_same_bound(fault, expected: str) -> None:
    # Before: the SDK's httpx inflated the whole body (1 GB here) and kept a plain answer whole.
    pytest.importorskip("openai")
    with FaultyServer(fault) as srv:
        code, result, wall, peak_mb, stderr = run_verify(srv.url, "--timeout", "30", "--only", "openai_sdk")
    sdk = reasons(result)["openai_sdk"]
    assert code == 1 and sdk.startswith("plain: the SDK raised ") and expected in sdk, sdk
    assert "Traceback" not in stderr and "asynchronous generator" not in stderr, stderr[-2000:]
    assert peak_mb < 300, f"peak RSS {peak_mb:.0f} MB"


# ---------------------------------------------------------------------------------------------------------------
# A server that stopped answering
# ---------------------------------------------------------------------------------------------------------------

def test_a_server_that_never_answers_ends_verify_after_two_deadlines() -> None:
    # Before: every one of the 18 checks waited out its own deadline (442 s at the default 30 s).
    with FaultyServer(never_answers) as srv:
        code, result, wall, _, stderr = run_verify(srv.url, "--timeout", "2")
    assert code == 1, stderr[-3000:]
    checks = {c["id"]: c for c in result["checks"]}
    timed_out = [i for i, c in checks.items() if c["reason"] == "timed out after 2s"]
    assert timed_out == ["chat", "chat_stream"], checks
    stopped = "the server stopped answering: 2 requests in a row reached the first-byte deadline of 2 s"
    rest = [c for i, c in checks.items() if i not in ("models", "chat", "chat_stream")]
    assert rest and all(c["outcome"] == "skip" and c["reason"] == stopped for c in rest), rest
    assert checks["models"]["outcome"] == "pass"
    assert wall < 4 * 2 + 6, f"{wall:.1f} s"


async def token_then_pings(reader, writer, head) -> None:
    """A first token, then only keep-alive comments: bytes keep coming, the answer never grows."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                 b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "4"}}]}\n\n')
    await writer.drain()
    for _ in range(600):
        await asyncio.sleep(0.1)
        writer.write(b": ping\n\n")
        await writer.drain()


def test_streams_that_only_send_keep_alive_comments_stop_verify_after_two_deadlines() -> None:
    started = time.monotonic()
    with FaultyServer(token_then_pings) as srv:
        checks = {c.id: c for c in verify(srv.url, model="m", check_timeout_s=2,
                                          only=["chat_stream", "stream_framing", "concurrency"]).checks}
    assert checks["chat_stream"].reason == "timed out after 2s"
    assert checks["stream_framing"].reason == "timed out after 2s"
    assert checks["concurrency"].outcome == "skip"
    assert checks["concurrency"].reason.startswith("the server stopped answering: 2 requests in a row reached the "
                                                   "deadline of 2 s with the server silent")
    assert time.monotonic() - started < 4 * 2 + 4


def test_one_slow_check_between_answers_does_not_stop_verify() -> None:
    # A deadline passed once, then an answer: the count starts over, nothing is skipped for it.
    posts = {"n": 0}

    async def first_hangs(reader, writer, head) -> None:
        posts["n"] += 1
        if posts["n"] == 1:
            await reader.read()
            return
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno")
        await writer.drain()
    with FaultyServer(first_hangs) as srv:
        checks = {c.id: c for c in verify(srv.url, model="m", check_timeout_s=1,
                                          only=["chat", "chat_stream", "max_tokens"]).checks}
    assert checks["chat"].reason == "timed out after 1s"
    assert checks["chat_stream"].reason.startswith("HTTP 500")
    assert checks["max_tokens"].reason.startswith("HTTP 500")


# ---------------------------------------------------------------------------------------------------------------
# Redirects and what the server sent, named
# ---------------------------------------------------------------------------------------------------------------

def chat_reason(fault) -> str:
    with FaultyServer(fault) as srv:
        (chat,) = [c for c in verify(srv.url, model="m", only=["chat"], check_timeout_s=20).checks
                   if c.id == "chat"]
    assert chat.outcome == "fail"
    assert "\n" not in chat.reason and not any(s in chat.reason for s in NO_LIBRARY_ERRORS), chat.reason
    return chat.reason


def test_a_redirect_is_named_and_never_followed() -> None:
    # Before: verify followed the 302, turning the POST into a GET, and reported the 404 of /elsewhere.
    fault = raw_answer(b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\nConnection: close"
                       b"\r\n\r\n")
    with FaultyServer(fault) as srv:
        (chat,) = [c for c in verify(srv.url, model="m", only=["chat"]).checks if c.id == "chat"]
        assert not any(h.startswith(b"GET /elsewhere") for h in srv.heads)
    assert chat.reason == "HTTP 302 redirect to /elsewhere: servelab does not follow redirects"


MALFORMED = {
    "bad_chunk_size": (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"ZZZ\r\n", "the server sent a malformed chunked body (chunk size b'ZZZ')"),
    "garbage_status_line": (b"HTTP/1.1 abc\r\n\r\n",
                            "the server sent a malformed response head (Invalid status code): status line "
                            "b'HTTP/1.1 abc'"),
    "not_http": (b"SSH-2.0-OpenSSH_9.6\r\n", "the server's reply is not HTTP: it began b'SSH-2.0-OpenSSH_9.6'"),
    "unknown_content_encoding": (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: br\r\n"
                                 b"Content-Length: 2\r\n\r\n{}",
                                 "the server sent Content-Encoding 'br', which servelab cannot decode"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_reply_is_one_line_naming_what_the_server_sent(name: str) -> None:
    # Before: `ClientResponseError: 400, message="Invalid character in chunk size: …", url=…`, a status the
    # server never sent; the same for the others.
    data, expected = MALFORMED[name]
    assert chat_reason(raw_answer(data)) == expected


@pytest.mark.parametrize("fault,expected", [(huge_header_line, "the response headers grew past 64 KiB"),
                                            (many_headers, "more than 128 headers")])
def test_huge_or_many_headers_are_named_by_their_bound(fault, expected: str) -> None:
    reason = chat_reason(fault)
    assert expected in reason and "400" not in reason, reason


def test_url_credentials_and_the_api_key_still_reach_every_request() -> None:
    # verify's requests no longer go through aiohttp, which set Basic auth from the URL by itself.
    async def ok(reader, writer, head) -> None:
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno")
        await writer.drain()
    with FaultyServer(ok) as srv:
        url = srv.url.replace("http://", "http://alice:s%40cret@")
        verify(url, model="m", only=["models", "chat"])
        basic = [h for h in srv.heads if b"Authorization: Basic YWxpY2U6c0BjcmV0" in h]  # alice:s@cret
        assert len(basic) == len(srv.heads) >= 2, srv.heads
    with FaultyServer(ok) as srv:
        verify(srv.url, model="m", only=["models", "chat"], api_key="k-123")
        assert all(b"Authorization: Bearer k-123" in h for h in srv.heads) and len(srv.heads) >= 2
