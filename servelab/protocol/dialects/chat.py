"""OpenAI chat/completions and completions chunks: what servelab read before it had dialects (protocol/chunks.py).

A stream is complete once a chunk carried finish_reason; `[DONE]` after it is expected but not required
(transformers serve never sends it). Usage arrives cumulative, so the last one seen replaces the others."""

from __future__ import annotations

from typing import Any

from servelab.protocol.chunks import read_chunk
from servelab.protocol.dialects.dialect import Dialect


def chat_fields(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"messages": messages}


def prompt_fields(messages: list[dict[str, Any]]) -> dict[str, Any]:
    raise ValueError("chat messages cannot be sent to the completions endpoint")


CHAT = Dialect(name="chat", path="/v1/chat/completions", read=read_chunk, merge_usage=None, ends_with="",
               max_tokens_field="max_tokens", engine_fields=True, stream_options=True, content_fields=chat_fields)
COMPLETIONS = Dialect(name="completions", path="/v1/completions", read=read_chunk, merge_usage=None, ends_with="",
                      max_tokens_field="max_tokens", engine_fields=True, stream_options=True,
                      content_fields=prompt_fields, takes_prompt=True)
