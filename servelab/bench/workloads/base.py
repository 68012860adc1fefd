"""What every workload shares: the output-length settings, the request body, and the workload interface.

A workload turns a request number into a RequestSpec, cheaply and synchronously: open-loop senders call it in
their hot path. Anything slow (reading a file, asking the server's tokenizer) happens once, in `prepare`, before
the load starts. `describe()` is written into every result's `workload` field, so two runs can be compared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

from servelab.bench.client import RequestSpec
from servelab.bench.workloads.prompt_tokens import PromptTokenCounter
from servelab.protocol.dialects import dialect_for

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"  # OpenAI's Responses API (protocol/dialects/responses.py)
MESSAGES = "/v1/messages"  # Anthropic's Messages API (protocol/dialects/messages.py)
STREAM_ENDPOINTS = {"chat": CHAT, "completions": COMPLETIONS, "responses": RESPONSES, "messages": MESSAGES}

Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class OutputSpec:
    """How long answers should be, and how sure we want to be of it.

    `ignore_eos` asks for exactly `max_tokens` tokens, `min_tokens` for at least that many; each is sent only to
    engines known to honour it (an engine that ignores an unknown field would make the request look honoured).
    Every record keeps what was sent in `sampling`, and metrics warns per request when it was not honoured.
    """

    max_tokens: int = 128
    ignore_eos: bool = True
    min_tokens: int | None = None
    temperature: float = 0.0

    def describe(self, accepts_ignore_eos: bool, accepts_min_tokens: bool) -> dict[str, Any]:
        d = asdict(self)
        d["ignore_eos"] = self.ignore_eos and accepts_ignore_eos
        d["min_tokens"] = self.min_tokens if accepts_min_tokens else None
        if self.min_tokens is not None and not accepts_min_tokens:
            d["min_tokens_not_sent"] = "the engine is not known to honour min_tokens on this endpoint"
        return d


def build_body(model: str, endpoint: str, content: str | Messages, output: OutputSpec, *,
               max_tokens: int | None = None, accepts_ignore_eos: bool = False,
               accepts_min_tokens: bool = False) -> dict[str, Any]:
    """The request body in the endpoint's dialect (without the streaming fields, which the client adds).

    `content` is a prompt string or chat messages; a prompt sent to a chat-like endpoint (chat, Responses,
    Messages) becomes one user message, and the dialect shapes the messages (Responses: `input`; Messages:
    `messages` with the system prompt apart in `system`) and names the length bound (`max_tokens`, or the
    Responses API's `max_output_tokens`). `max_tokens` overrides the spec's (a dataset line's own length);
    `min_tokens` never exceeds it. ignore_eos and min_tokens go only where the dialect carries engine fields.
    """
    dialect = dialect_for(endpoint)
    limit = max_tokens if max_tokens is not None else output.max_tokens
    body: dict[str, Any] = {"model": model, dialect.max_tokens_field: limit, "temperature": output.temperature}
    if dialect.takes_prompt:
        if isinstance(content, list):
            raise ValueError("chat messages cannot be sent to the completions endpoint")
        body["prompt"] = content
    else:
        body.update(dialect.content_fields(content if isinstance(content, list)
                                           else [{"role": "user", "content": content}]))
    if output.ignore_eos and accepts_ignore_eos and dialect.engine_fields:
        body["ignore_eos"] = True
    if output.min_tokens is not None and accepts_min_tokens and dialect.engine_fields:
        body["min_tokens"] = min(output.min_tokens, limit)
    return body


def takes_messages(endpoint: str) -> bool:
    """Whether the endpoint takes chat messages (chat, Responses, Messages) and applies the chat template."""
    return not dialect_for(endpoint).takes_prompt


def chat_or_prompt(endpoint: str, text: str) -> str | Messages:
    """What a prompt text becomes on `endpoint`: what the server's template (or not) is applied to."""
    return [{"role": "user", "content": text}] if takes_messages(endpoint) else text


class WorkloadSource(Protocol):
    """The interface every workload offers (the default story workload included)."""

    endpoint: str

    async def prepare(self, counter: PromptTokenCounter | None, needed: int | None = None) -> None:
        """Slow work before the load: read files, measure prompts with the server's tokenizer. `needed`: how
        many requests the plan will build, when known."""
        ...

    def request(self, index: int, model: str, *, tag: str = "", warmup: bool = False,
                accepts_ignore_eos: bool = False, accepts_min_tokens: bool = False) -> RequestSpec:
        ...

    def describe(self, accepts_ignore_eos: bool, accepts_min_tokens: bool = False) -> dict[str, Any]:
        ...
