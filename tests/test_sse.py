"""The SSE parser on byte streams split at every possible offset, and on what engines really send."""

from __future__ import annotations

import json

import pytest

from servelab.protocol.sse import SSEDecodeError, SSEEvent, SSEParser


def parse_all(pieces: list[bytes]) -> list[SSEEvent]:
    p = SSEParser()
    events: list[SSEEvent] = []
    for piece in pieces:
        events.extend(p.feed(piece))
    events.extend(p.close())
    return events


def every_split(stream: bytes):
    """The stream cut in two at every offset, and cut into single bytes."""
    for i in range(len(stream) + 1):
        yield [stream[:i], stream[i:]]
    yield [bytes([b]) for b in stream]


LLAMACPP_STREAM = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"The"}}]}\n\n'
    b'data: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}]}\n\n'
    b'data: {"choices":[],"usage":{"completion_tokens":2,"prompt_tokens":43,"total_tokens":45}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_every_split_gives_the_same_events(newline: bytes) -> None:
    stream = LLAMACPP_STREAM.replace(b"\n", newline)
    expected = [e.data for e in parse_all([stream])]
    assert len(expected) == 5 and expected[-1] == "[DONE]"
    assert json.loads(expected[1])["choices"][0]["delta"]["content"] == "The"
    for pieces in every_split(stream):
        assert [e.data for e in parse_all(pieces)] == expected


def test_crlf_split_between_cr_and_lf_is_one_line_end() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\r") == []
    # The \n completing the \r\n must not count as a second (blank) line that would dispatch early...
    assert p.feed(b"\n") == []
    # ...the real blank line does.
    assert [e.data for e in p.feed(b"\r\n")] == ["a"]


def test_event_is_delivered_as_soon_as_its_blank_line_arrives() -> None:
    p = SSEParser()
    assert [e.data for e in p.feed(b"data: x\n\n")] == ["x"]
    assert [e.data for e in p.feed(b"data: y\r\r")] == ["y"]  # lone CR endings, no waiting for a possible LF


def test_comments_and_pings_are_counted_not_delivered() -> None:
    p = SSEParser()
    events = p.feed(b": ping\n\ndata: 1\n\n:keep-alive\ndata: 2\n\n")
    assert [e.data for e in events] == ["1", "2"]
    assert p.comments == 2


def test_multi_line_data_and_fields() -> None:
    events = parse_all([b"event: error\nid: 7\ndata: line one\ndata:line two\nretry: 10\n\n"])
    assert events == [SSEEvent(data="line one\nline two", event="error", id="7")]


def test_event_larger_than_64kb() -> None:
    big = "x" * 200_000
    stream = f'data: {{"t":"{big}"}}\n\n'.encode()
    pieces = [stream[i:i + 4096] for i in range(0, len(stream), 4096)]
    events = parse_all(pieces)
    assert len(events) == 1 and json.loads(events[0].data)["t"] == big


def test_utf8_split_across_reads_is_decoded_intact() -> None:
    stream = 'data: {"c":"héllo 🙂 wörld"}\n\n'.encode()
    for pieces in every_split(stream):
        events = parse_all(pieces)
        assert json.loads(events[0].data)["c"] == "héllo 🙂 wörld"


def test_missing_final_blank_line_is_delivered_on_close() -> None:
    p = SSEParser()
    assert p.feed(b"data: last") == []
    assert [e.data for e in p.close()] == ["last"]


def test_invalid_utf8_is_an_error_not_garbage() -> None:
    with pytest.raises(SSEDecodeError):
        parse_all([b"data: \xff\xfe\n\n"])


def test_space_after_colon_is_optional_and_only_one_is_stripped() -> None:
    assert [e.data for e in parse_all([b"data:a\n\ndata:  b\n\n"])] == ["a", " b"]
