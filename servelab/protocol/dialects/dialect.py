"""The Dialect record: what one streaming API's requests and events look like to the client (protocol/dialects/)."""

from __future__ import annotations

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
    # The finish reasons of an answer that ended by itself (the model's end-of-sequence token, a stop sequence), not
    # at the limit: the client tokenizer cannot see that last token, which servers count (bench/request_figures.py)
    natural_stops: frozenset[str] = frozenset({"stop"})
