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

from servelab.protocol.dialects import chat, messages, responses
from servelab.protocol.dialects.dialect import Dialect

DIALECTS: dict[str, Dialect] = {d.name: d for d in (chat.CHAT, chat.COMPLETIONS, responses.RESPONSES,
                                                     messages.MESSAGES)}  # by their --endpoint names


def dialects() -> dict[str, Dialect]:
    """Every dialect by its --endpoint name."""
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
