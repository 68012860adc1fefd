"""Stream dialects: how one streaming API's request is shaped and how its events are read.

The client (bench/client.py) is the same for every API: HTTP, SSE, deadlines, the record. What differs per API is
small and lives here, one module per dialect, chosen by the endpoint's path:

- chat.py       OpenAI `/v1/chat/completions` and `/v1/completions` chunks (protocol/chunks.py), ended by `[DONE]`
- responses.py  OpenAI's Responses API, `/v1/responses`: typed events, ended by response.completed
- messages.py   Anthropic's Messages API, `/v1/messages`: typed events, ended by message_stop

Each reads one JSON-decoded event into a ChunkView (answer text, reasoning text, usage, the finish, whether the
event ends the stream) with plain dict lookups: the per-event path stays as cheap as the chat chunks' (no pydantic
model per event). docs/metrics.md#dialects defines what each dialect's TTFT, ITL and token counts are read from.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from servelab.protocol.chunks import ChunkView
from servelab.records import Usage


@dataclass(eq=False)  # one object per dialect, compared by identity (and a test may swap its reader)
class Dialect:
    name: str  # what --endpoint calls it
    path: str  # the endpoint servelab sends it to
    read: Callable[[Any], ChunkView]  # one event's JSON; raises MalformedChunk for a shape it cannot read
    # How a usage seen on a later event combines with the one held (None: the later replaces it, as chat chunks'
    # cumulative usage does; Messages sends input tokens first and output tokens last).
    merge_usage: Callable[[Usage, Usage], Usage] | None
    ends_with: str  # the event whose arrival makes a stream complete, in words; "" : finish_reason is enough
    max_tokens_field: str  # the request field that bounds the answer's length
    # Whether the engine-specific request fields (ignore_eos, min_tokens, timings_per_token) reach the engine on
    # this endpoint: sent only where they are read, so a fixed output length is never assumed where it is ignored.
    engine_fields: bool
    stream_options: bool  # OpenAI's stream_options.include_usage: a chat/completions field, usage is always sent
    # Chat messages in, the request's fields out: {"messages": …}, {"input": …}, {"system": …, "messages": …}
    content_fields: Callable[[list[dict[str, Any]]], dict[str, Any]]
    takes_prompt: bool = False  # a bare prompt string (completions) rather than chat messages


def _registry() -> dict[str, Dialect]:
    from servelab.protocol.dialects import chat, messages, responses

    return {d.name: d for d in (chat.CHAT, chat.COMPLETIONS, responses.RESPONSES, messages.MESSAGES)}


DIALECTS: dict[str, Dialect] = {}


def dialects() -> dict[str, Dialect]:
    """Every dialect by its --endpoint name."""
    if not DIALECTS:
        DIALECTS.update(_registry())
    return DIALECTS


@functools.cache  # a handful of paths per run; called once per request
def dialect_for(endpoint: str) -> Dialect:
    """The dialect of a request path: the one whose path it ends with; for any other path (a proxy's own route),
    completions: a prompt string in, OpenAI chunks out, as servelab sent before it had dialects."""
    by_path = sorted(dialects().values(), key=lambda d: -len(d.path))
    for dialect in by_path:
        if endpoint.endswith(dialect.path) or endpoint.endswith(dialect.path.removeprefix("/v1")):
            return dialect
    return dialects()["completions"]
