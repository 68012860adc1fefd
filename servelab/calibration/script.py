"""What a calibration response does: its timing, its token counts, its wire format and its faults.

A `Script` is the whole ground truth of one response before it happens. The server turns it into a list of
token events (this module) and then into bytes and times (server.py); the client under test sees only the bytes.

Token texts are deterministic and self-delimiting so that a test can count tokens from the text alone:
answer token i is " a{i}" and reasoning token i is " r{i}". With `split_utf8` every token also carries a 2-byte
and a 4-byte UTF-8 character (" a{i}é🙂"), so that the server can cut a multi-byte sequence across TCP writes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from servelab.records import TokenKind

UsageStyle = Literal["separate_chunk", "last_chunk", "none", "continuous", "llamacpp_timings"]
ReasoningField = Literal["reasoning_content", "reasoning"]

# Appended to every token text when `split_utf8` is on: "é" is 2 bytes, "🙂" is 4 bytes in UTF-8.
MULTIBYTE_SUFFIX = "é🙂"


class Script(BaseModel):
    """One scripted response. Sent by a client as `"calibration": {...}` in the request body (merged over the
    server's default), so one server can play many scenarios. Unknown keys are rejected: a typo in a test should
    fail loudly, not silently fall back to a default.

    Token events: reasoning tokens first, then answer tokens, each grouped `tokens_per_event` at a time; event i
    is due at ttft_ms + i * itl_ms after receipt. A non-streaming request is answered whole when the last event
    would have been due. `http_status`, `html`, stall and disconnect apply to both; the other faults shape a
    stream and are ignored without one.
    """

    model_config = ConfigDict(extra="forbid")

    # ---- timing (all measured from the moment the server received the request) ----
    ttft_ms: float = Field(50.0, ge=0, description="request receipt -> first token event")
    itl_ms: float = Field(10.0, ge=0, description="gap between consecutive token events")

    # ---- content ----
    output_tokens: int = Field(16, ge=0, description="answer tokens")
    reasoning_tokens: int = Field(0, ge=0, description="reasoning tokens, all emitted before the answer")
    tokens_per_event: int = Field(1, ge=1, description="tokens per SSE event; the last of each kind may carry fewer")
    reasoning_field: ReasoningField = "reasoning_content"
    prompt_tokens: int = Field(8, ge=0, description="reported in usage")
    finish_reason: Literal["stop", "length"] = "length"

    # ---- format (see styles.py for which engine each usage style copies) ----
    usage_style: UsageStyle = "separate_chunk"
    send_done: bool = True  # transformers serve never sends `data: [DONE]`
    role_chunk: bool = True  # chat only: a first chunk with delta.role and no content

    # ---- faults (event counts refer to token events; None/False = off) ----
    stall_after_events: int | None = Field(None, ge=0, description="stop sending, keep the connection open")
    disconnect_after_events: int | None = Field(None, ge=0, description="abort the connection")
    http_status: int | None = Field(None, ge=400, le=599, description="answer this status with an OpenAI error body")
    in_band_error_after_events: int | None = Field(None, ge=0, description="send data: {\"error\": ...} and end")
    html: bool = False  # answer 200 text/html, as a misconfigured proxy does
    invalid_json_after_events: int | None = Field(None, ge=0, description="one data: line that is not JSON")
    sse_comments: bool = False  # `: ping` comment lines in the middle of every gap
    crlf: bool = False  # \r\n line endings (llama-cpp-python's sse-starlette does this)
    big_event_bytes: int | None = Field(None, ge=1, description="pad the first token event to at least this size")
    split_utf8: bool = False  # multi-byte token texts, each event's bytes cut inside a UTF-8 sequence
    # One extra SSE frame written verbatim (e.g. 'data: {"choices":[1]}\n\n', or 'event: error\ndata: {...}\n\n')
    # just before token event `raw_frame_after_events` (after the last one if that is past the end).
    raw_frame: str | None = None
    raw_frame_after_events: int = Field(1, ge=0)
    # Token event k's write also carries, after it, one event whose data is not valid UTF-8 (a 0xff byte): the
    # good event and the bad one arrive in the same read.
    invalid_utf8_after_events: int | None = Field(None, ge=0)
    # llamacpp_timings: from the second token event on, `timings.predicted_n` reports this number instead of the
    # running count (a server whose counter jumped to nonsense).
    bogus_running_count: int | None = Field(None, ge=0)
    # With http_status (429, 503): a Retry-After header with this value.
    retry_after: str | None = None
    # Answer 302 Found with this Location (and no body), as a proxy in front of the engine might.
    redirect_to: str | None = None

    @model_validator(mode="after")
    def _one_terminal_fault(self) -> Script:
        terminal = [name for name in ("stall_after_events", "disconnect_after_events", "in_band_error_after_events")
                    if getattr(self, name) is not None]
        if len(terminal) > 1:
            raise ValueError(f"at most one of {terminal} can be set: each one ends the stream")
        return self

    def merged(self, overrides: dict[str, Any] | None) -> Script:
        """This script with the request's `calibration` keys laid over it (validated again)."""
        if overrides is None:
            return self
        if not isinstance(overrides, dict):
            raise ValueError("`calibration` must be a JSON object")
        return Script.model_validate({**self.model_dump(), **overrides})

    @property
    def total_tokens(self) -> int:
        return self.reasoning_tokens + self.output_tokens


def token_text(kind: TokenKind, index: int, multibyte: bool = False) -> str:
    """The text of token `index` (0-based within its kind)."""
    text = f" {'a' if kind == 'answer' else 'r'}{index}"
    return text + MULTIBYTE_SUFFIX if multibyte else text


@dataclass(frozen=True)
class TokenCounts:
    answer: int
    reasoning: int


_TOKEN_RE = re.compile(r" ([ar])\d+")


def count_tokens(text: str) -> TokenCounts:
    """Count answer and reasoning tokens in text built from `token_text` (either variant)."""
    kinds = _TOKEN_RE.findall(text)
    return TokenCounts(answer=kinds.count("a"), reasoning=kinds.count("r"))


@dataclass(frozen=True)
class PlannedTokenEvent:
    """One SSE event that carries tokens: its position in the stream and its text."""

    index: int  # position among all token events; the event is due at ttft + index * itl
    kind: TokenKind
    tokens: int
    text: str
    completion_tokens_after: int  # running count of generated tokens once this event is out


def plan_token_events(script: Script) -> list[PlannedTokenEvent]:
    """Group the reasoning tokens, then the answer tokens, into events of `tokens_per_event`.

    An event never mixes kinds: the reasoning phase ends with a possibly short event, as the answer does.
    """
    events: list[PlannedTokenEvent] = []
    running = 0
    for kind, total in (("reasoning", script.reasoning_tokens), ("answer", script.output_tokens)):
        for start in range(0, total, script.tokens_per_event):
            n = min(script.tokens_per_event, total - start)
            text = "".join(token_text(kind, i, script.split_utf8) for i in range(start, start + n))
            running += n
            events.append(PlannedTokenEvent(len(events), kind, n, text, running))
    return events
