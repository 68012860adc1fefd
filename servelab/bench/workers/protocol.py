"""What a coordinator and its workers say to each other: length-prefixed frames over one TCP connection.

A frame is a 4-byte big-endian length, then a JSON header (an array: the message kind first) and, for a record,
a newline and the record's own JSON as `RequestRecord.model_dump_json()` wrote it, so neither side re-encodes a
record field by field. Messages:

    worker -> coordinator   ["hello", {id, token, host, pid, boot_id, python, servelab}]
                            ["pong", seq, worker_now_ns]
                            ["rec", request_id] + "\\n" + record JSON (every request sent ends as one, cancelled
                                                                        ones included)
                            ["unsent", request_id]   (cancelled while held for its scheduled time: never sent)
    coordinator -> worker   ["config", {url, client options}]
                            ["ping", seq]
                            ["req", request_id, spec, scheduled_ns | null]   (scheduled_ns on the worker's clock)
                            ["cancel", request_id]
                            ["quit"]

Times in a record are the worker's own monotonic clock; the coordinator moves them onto its own by the offset
it measured (clock.py), a constant per worker, so every duration inside a record is exactly what the worker
measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import struct
from typing import Any

import orjson

from servelab.bench.client import RequestSpec
from servelab.records import RequestRecord

_LEN = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024  # a record of a very long answer is big; anything larger is a broken peer


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol."""


def frame(header: list[Any], payload: bytes | None = None) -> bytes:
    body = orjson.dumps(header)
    if payload is not None:
        body += b"\n" + payload
    return _LEN.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> tuple[list[Any], bytes | None]:
    """The next (header, payload) from `reader`; raises asyncio.IncompleteReadError at end of stream."""
    size = _LEN.unpack(await reader.readexactly(4))[0]
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size:,} bytes")
    body = await reader.readexactly(size)
    head, sep, payload = body.partition(b"\n")
    try:
        header = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"unreadable frame header: {exc}") from None
    if not isinstance(header, list) or not header or not isinstance(header[0], str):
        raise ProtocolError(f"frame header is not [kind, ...]: {head[:80]!r}")
    return header, (payload if sep else None)


# ---- requests ----

def encode_spec(spec: RequestSpec) -> dict[str, Any]:
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}


def decode_spec(data: dict[str, Any]) -> RequestSpec:
    names = {f.name for f in dataclasses.fields(RequestSpec)}
    return RequestSpec(**{k: v for k, v in data.items() if k in names})


# ---- records ----

def encode_record(record: RequestRecord) -> bytes:
    """The record whole: every event with its own text (`events_text`), so the coordinator holds what the worker
    held (a later token recount, a multi-turn history and records.jsonl read the same as from one process)."""
    return record.model_dump_json(context={"events_text": True}).encode()


TIME_FIELDS = ("scheduled_ns", "t_send_ns", "t_headers_ns", "t_end_ns")


def decode_record(payload: bytes, shift_ns: int = 0) -> RequestRecord:
    """A record from a worker, its times moved by `shift_ns` (coordinator clock = worker clock - offset): every
    absolute time moves by the same integer, so every difference inside the record is unchanged."""
    record = RequestRecord.model_validate_json(payload)
    if shift_ns:
        for key in TIME_FIELDS:
            value = getattr(record, key)
            if value is not None:
                setattr(record, key, value - shift_ns)
        record.events = [e._replace(t_ns=e.t_ns - shift_ns) for e in record.events]
    return record
