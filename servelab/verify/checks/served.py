"""Shared by the checks of endpoints beyond chat (embeddings, rerank, structured output, Responses, Messages): telling
a server that does not serve an endpoint (a skip, in its own words) from one that serves it badly, and reading the
typed event streams (`event:` + `data:` lines) of the Responses and Messages APIs."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from servelab.verify.checks.registry import CheckFailed, Findings
from servelab.verify.http import BadResponse, RawReply, StreamReply, one_line

# 404/405: no such route; 501: llama.cpp's answer for an endpoint its flags left off ("Start it with `--embeddings`").
UNSERVED_STATUSES = (404, 405, 501)
_STATUS_OF_BAD_RESPONSE = re.compile(r"^HTTP (\d{3}) from ")


def server_words(text: str, limit: int = 200) -> str:
    """The error message a server gave, from OpenAI's {"error": {"message"}}, FastAPI's {"detail"} or a bare
    {"message"}; else the body itself, on one line."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        for said in (error.get("message") if isinstance(error, dict) else error, body.get("detail"),
                     body.get("message")):
            if isinstance(said, str) and said.strip():
                return one_line(said, limit)
    return one_line(text, limit) or "(empty body)"


def unserved(reply: RawReply, what: str, *, refusals_skip: bool = False) -> str | None:
    """Why the server does not serve `what`, quoting it, when its status says so: 404, 405, 501, and with
    `refusals_skip` any 4xx (a server that has the route but refuses the feature, e.g. llama.cpp with --embeddings
    on a model without pooling). None for a 2xx; CheckFailed for any other status."""
    if 200 <= reply.status < 300:
        return None
    if reply.status in UNSERVED_STATUSES or (refusals_skip and 400 <= reply.status < 500):
        return f"the server does not serve {what}: HTTP {reply.status}: {server_words(reply.text)}"
    raise CheckFailed(f"HTTP {reply.status} for {what}: {server_words(reply.text)}")


def status_of(exc: BadResponse) -> int | None:
    """The HTTP status a streamed request was answered with, when that (not the transport) was the problem."""
    match = _STATUS_OF_BAD_RESPONSE.match(str(exc))
    return int(match.group(1)) if match else None


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_token_counts(usage: Any, findings: Findings, where: str, names: tuple[str, ...]) -> dict[str, int] | None:
    """The integer counts `names` of a usage object; a fail (and None) when it is missing or any count is not an
    integer."""
    if not isinstance(usage, dict):
        findings.fail(f"{where} has no usage object")
        return None
    counts = {name: usage.get(name) for name in names}
    bad = [f"{name}={value!r}" for name, value in counts.items()
           if not isinstance(value, int) or isinstance(value, bool) or value < 0]
    if bad:
        findings.fail(f"{where} usage needs non-negative integer counts, got {', '.join(bad)}")
        return None
    return counts  # type: ignore[return-value]


# ---- typed event streams (Responses, Messages) ---------------------------------------------------------------------


def read_typed_events(reply: StreamReply, findings: Findings) -> list[dict[str, Any]]:
    """The JSON objects of a stream whose events name their type twice, in an `event:` line and in the data's
    `type` (OpenAI's Responses API and Anthropic's Messages API both send it so). Faults are recorded in `findings`:
    a data that is not a JSON object or has no type fails, an `event:` name that differs from the type fails, a
    missing `event:` line is a warning (clients that dispatch on it would see nothing)."""
    if reply.content_type != "text/event-stream":
        findings.warn(f"content type is {reply.content_type}, not text/event-stream")
    if reply.disconnect:
        findings.fail(f"the connection broke after {len(reply.events)} events ({reply.disconnect})")
    if reply.undecodable:
        findings.fail("the stream is not valid UTF-8")
    typed: list[dict[str, Any]] = []
    not_json: list[int] = []
    no_event_line = 0
    done_lines = 0
    for number, event in enumerate(reply.events, 1):
        if event.data.strip() == "[DONE]":
            done_lines += 1
            continue
        try:
            data = json.loads(event.data)
        except json.JSONDecodeError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            not_json.append(number)
            continue
        if event.event is None:
            no_event_line += 1
        elif event.event != data["type"]:
            findings.fail(f"event {number} is named {event.event!r} in its `event:` line but its data says type "
                          f"{data['type']!r}")
        typed.append(data)
    if not_json:
        findings.fail(f"{len(not_json)} event(s) are not JSON objects with a `type` "
                      f"(event {', '.join(map(str, not_json[:5]))})")
    if no_event_line:
        findings.warn(f"{no_event_line} of {len(reply.events)} event(s) have no `event:` line naming their type")
    if done_lines:
        findings.note("a `data: [DONE]` line ends the stream (not part of this API; clients ignore it)")
    return typed


def order_of(types: list[str]) -> str:
    """The event types in order, runs of one type collapsed ("a, b ×5, c"), for a reason."""
    runs: list[list[Any]] = []
    for name in types:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return ", ".join(name if count == 1 else f"{name} ×{count}" for name, count in runs)
