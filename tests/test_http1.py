"""The bench client's HTTP/1.1 layer against hand-written responses: every framing a server may use, and the
ways a response can be broken. Each server below writes exact bytes, so the test says what is on the wire."""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from servelab.bench.client import ClientOptions, Deadlines, RequestSpec, StreamClient
from servelab.protocol.http1 import Origin, build_request


def sse(*texts: str, done: bool = True) -> bytes:
    out = b""
    for i, t in enumerate(texts):
        finish = "stop" if i == len(texts) - 1 else None
        chunk = {"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": finish}]}
        out += b"data: " + json.dumps(chunk).encode() + b"\n\n"
    return out + (b"data: [DONE]\n\n" if done else b"")


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"


async def exchange(response: bytes | list[bytes], *, close: bool = True, deadlines: Deadlines | None = None,
                   headers: dict[str, str] | None = None, tls: ssl.SSLContext | None = None) -> tuple:
    """Serve `response` (written in the given pieces, 20 ms apart) to one client request; return the record
    and the request bytes the server received."""
    received = bytearray()
    pieces = response if isinstance(response, list) else [response]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.extend(await reader.readuntil(b"\r\n\r\n"))
        length = int(next(line.split(b":")[1] for line in received.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        received.extend(await reader.readexactly(length))
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.02)
        if close:
            writer.close()
        else:
            await asyncio.sleep(30)

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    async with server:
        opts = ClientOptions(deadlines=deadlines or Deadlines(idle_s=5, first_byte_s=5, total_s=10))
        async with StreamClient(f"{'https' if tls else 'http'}://127.0.0.1:{port}", opts) as client:
            spec = RequestSpec(endpoint="/v1/chat/completions", body={"model": "m", "messages": []},
                               headers=headers or {})
            record = await client.send(spec)
    return record, bytes(received)


def run(*args, **kwargs):
    return asyncio.run(exchange(*args, **kwargs))


def answer(record) -> str:
    return "".join(e.text for e in record.events)


@pytest.mark.parametrize("framing", ["chunked", "content-length", "close-delimited"])
def test_every_body_framing_gives_the_same_answer(framing) -> None:
    body = sse("Hel", "lo", "!")
    if framing == "chunked":
        response = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(body[:40], body[40:])
    elif framing == "content-length":
        response = HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body
    else:
        response = HEAD + b"\r\n" + body
    record, _ = run(response)
    assert record.ok, record.error_detail
    assert answer(record) == "Hello!"
    assert record.saw_done and record.finish_reason == "stop"


def test_a_close_delimited_body_without_done_ends_cleanly_after_finish_reason() -> None:
    record, _ = run(HEAD + b"\r\n" + sse("a", "b", done=False))
    assert record.ok and not record.saw_done and answer(record) == "ab"


def test_events_split_across_reads_keep_their_own_arrival_times() -> None:
    body = sse("one", "two")
    first_end = body.index(b"\n\n") + 2
    record, _ = run([HEAD + b"\r\n" + body[:first_end - 5], body[first_end - 5:first_end], body[first_end:]])
    assert record.ok and answer(record) == "onetwo"
    gap_ms = (record.events[1].t_ns - record.events[0].t_ns) / 1e6
    assert gap_ms > 10  # the second event arrived a 20 ms write later, not with the first


def test_gzip_bodies_are_decoded() -> None:
    body = gzip.compress(sse("zip", "ped"))
    response = HEAD + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    record, _ = run(response)
    assert record.ok, record.error_detail
    assert answer(record) == "zipped"


def test_a_body_that_says_gzip_but_is_not_is_a_parse_error() -> None:
    body = sse("not", "zipped")
    record, _ = run(HEAD + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert record.error_kind == "parse" and "could not be decoded" in record.error_detail


def test_an_unknown_content_encoding_is_a_clear_parse_error() -> None:
    record, _ = run(HEAD + b"Content-Encoding: br\r\n\r\n" + b"\x00\x01")
    assert record.error_kind == "parse" and "Content-Encoding 'br'" in record.error_detail


def test_an_interim_103_response_is_skipped() -> None:
    record, _ = run(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + HEAD + b"\r\n" + sse("ok"))
    assert record.ok and answer(record) == "ok"


def test_an_error_status_keeps_the_servers_message() -> None:
    body = json.dumps({"error": {"message": "model not loaded", "code": 503}}).encode()
    response = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" \
               % len(body) + body
    record, _ = run(response)
    assert record.error_kind == "http" and record.http_status == 503
    assert "model not loaded" in record.error_detail


def test_garbage_instead_of_http_is_a_parse_error() -> None:
    record, _ = run(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    assert record.error_kind == "parse" and "malformed HTTP response" in record.error_detail


def test_a_connection_closed_inside_a_chunked_body_is_a_disconnect() -> None:
    body = sse("a", "b")
    record, _ = run(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(body) + body[:30])
    assert record.error_kind == "disconnect"
    assert "connection lost after 0 events" in record.error_detail


def test_a_connection_closed_before_any_response_is_a_disconnect() -> None:
    record, _ = run(b"")
    assert record.error_kind == "disconnect" and "before the response headers" in record.error_detail


def test_idle_deadline_while_the_server_holds_the_connection_open() -> None:
    first = sse("a", done=False).split(b"\n\n")[0] + b"\n\n"
    record, _ = run(HEAD + b"\r\n" + first.replace(b'"stop"', b"null"), close=False,
                    deadlines=Deadlines(idle_s=0.3, first_byte_s=5, total_s=10))
    assert record.error_kind == "timeout_idle" and answer(record) == "a"


def test_the_request_on_the_wire() -> None:
    _, request = run(HEAD + b"\r\n" + sse("x"), headers={"X-Calibration-Id": "abc"})
    head, _, body = request.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/chat/completions HTTP/1.1"
    fields = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    assert fields["host"].startswith("127.0.0.1:") and fields["connection"] == "close"
    assert fields["x-calibration-id"] == "abc" and int(fields["content-length"]) == len(body)
    sent = json.loads(body)
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_a_header_with_a_line_break_is_refused_not_sent() -> None:
    record, request = run(HEAD + b"\r\n" + sse("x"), headers={"X-Evil": "a\r\nInjected: 1"})
    assert not record.ok and "line break" in record.error_detail
    assert request == b""


def test_origin_keeps_the_base_paths_prefix_and_default_ports() -> None:
    o = Origin.from_url("https://gateway.example/v1-proxy/")
    assert (o.scheme, o.host, o.port, o.prefix, o.host_header) == ("https", "gateway.example", 443, "/v1-proxy",
                                                                  "gateway.example")
    assert build_request(o, "/v1/completions", b"{}", {}).startswith(b"POST /v1-proxy/v1/completions HTTP/1.1")
    assert Origin.from_url("http://[::1]:8000").host_header == "[::1]:8000"
    with pytest.raises(ValueError):
        Origin.from_url("ftp://x")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_https_streams_through_tls_and_checks_the_certificate(tmp_path: Path, monkeypatch) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out",
                    str(cert)], check=True, capture_output=True)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    response = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(sse("sec", "ure"))
    # A certificate the client does not trust: a connect error that says why, never a silent downgrade.
    record, _ = run(response, tls=tls)
    assert record.error_kind == "connect" and "CERTIFICATE_VERIFY_FAILED" in record.error_detail
    # Trusted (as SSL_CERT_FILE makes it for Python's default context): the stream is read as over plain HTTP.
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    record, request = run(response, tls=tls)
    assert record.ok, record.error_detail
    assert answer(record) == "secure" and request.startswith(b"POST /v1/chat/completions HTTP/1.1")
