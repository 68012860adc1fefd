"""Chunk shapes, copied field by field (and key order) from real engines, one dialect per usage style.

    usage_style        chat dialect                        completions dialect
    separate_chunk     vLLM 0.33                           vLLM 0.33
    continuous         vLLM 0.33 + continuous_usage_stats  vLLM 0.33 + continuous_usage_stats
    llamacpp_timings   llama.cpp server                    llama.cpp server
    last_chunk         transformers serve 5.24             llama.cpp server (usage rides on the finish chunk)
    none               llama-cpp-python 0.3.36             llama-cpp-python 0.3.36

Like the real engines, a dialect sends the optional extras only when the request asks for them, so a client
that forgets to ask is caught here too:
- vLLM: the final `choices: []` usage chunk needs `stream_options.include_usage`; per-chunk usage needs
  `include_usage` *and* `continuous_usage_stats` (vLLM ignores the latter alone). The `separate_chunk` style
  ignores `continuous_usage_stats`, as a server without it (SGLang before it, llama.cpp chat) would.
- llama.cpp: per-chunk `timings` (with the running `predicted_n`) need `"timings_per_token": true`; chat usage
  needs `include_usage`; completions always carry usage on the finish chunk, whatever was asked.
- transformers serve always puts usage on the finish chunk and ignores `stream_options`.
- llama-cpp-python never streams usage.

Sources: llama.cpp shapes were captured on the wire from the embedded xllamacpp 2026.10 server (llama.cpp
commit 0c1e570). The others follow the research notes (shared/research/engines.md §0.5, §2.5, §4, §6;
env.md §1–§3) and the engines' response models as remembered from source: vLLM's pydantic models dumped with
`exclude_unset`, transformers' openai-typed models dumped with `exclude_none`, llama-cpp-python's plain dicts
through `json.dumps`. Key order follows each engine's serializer; it matters only to clients that should not
depend on it.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from servelab.calibration.script import PlannedTokenEvent, Script

Endpoint = Literal["chat", "completions"]
ChunkKind = Literal["role", "token", "finish", "usage"]


@dataclass(frozen=True)
class RequestOptions:
    """What the request asked for that changes the response's shape."""

    endpoint: Endpoint
    model: str
    include_usage: bool = False  # stream_options.include_usage
    continuous_usage_stats: bool = False  # stream_options.continuous_usage_stats (vLLM)
    timings_per_token: bool = False  # llama.cpp extension

    @classmethod
    def from_body(cls, endpoint: Endpoint, body: dict[str, Any]) -> RequestOptions:
        stream_options = body.get("stream_options")
        stream_options = stream_options if isinstance(stream_options, dict) else {}
        return cls(endpoint=endpoint, model=str(body.get("model") or "calibration"),
                   include_usage=bool(stream_options.get("include_usage")),
                   continuous_usage_stats=bool(stream_options.get("continuous_usage_stats")),
                   timings_per_token=bool(body.get("timings_per_token")))


@dataclass(frozen=True)
class Chunk:
    """One `data:` event before framing. `due_event` says when it goes out: None = right after the headers,
    k = together with token event k (just before it for a role chunk, just after it otherwise)."""

    kind: ChunkKind
    body: dict[str, Any]
    due_event: int | None
    event: PlannedTokenEvent | None = None


@dataclass
class Dialect:
    """The shared stream sequence: [role] tokens... [finish] [usage]. Subclasses fill in the shapes."""

    script: Script
    opts: RequestOptions
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    # Engine traits the sequence depends on.
    finish_on_last_token: bool = False  # vLLM: the last token's chunk carries finish_reason
    role_at_headers: bool = False  # transformers serve: the role chunk goes out before generation starts
    ensure_ascii: bool = False  # json.dumps escaping of non-ASCII (llama-cpp-python's default json.dumps)
    separators: tuple[str, str] = (",", ":")

    def __post_init__(self) -> None:
        prefix = "chatcmpl-" if self.opts.endpoint == "chat" else "cmpl-"
        self.id = self.id or prefix + secrets.token_hex(16)

    # ---- the sequence ----
    def chunks(self, events: list[PlannedTokenEvent]) -> Iterator[Chunk]:
        """The chunks in wire order, built lazily so a long stream is encoded as it goes, not all up front."""
        if self.opts.endpoint == "chat" and self.script.role_chunk:
            yield Chunk("role", self.role_chunk(), None if self.role_at_headers else 0)
        for ev in events:
            last = ev.index == len(events) - 1
            finish = self.script.finish_reason if (last and self.finish_on_last_token) else None
            yield Chunk("token", self.token_chunk(ev, finish), ev.index, ev)
        done_at = max(len(events) - 1, 0)
        if not (events and self.finish_on_last_token):
            yield Chunk("finish", self.finish_chunk(self.script.total_tokens), done_at)
        usage = self.usage_chunk(self.script.total_tokens)
        if usage is not None:
            yield Chunk("usage", usage, done_at)

    def encode(self, body: dict[str, Any]) -> str:
        if self.separators == (",", ":") and not self.ensure_ascii:
            # Compact JSON as json.dumps writes it with these options (small floats may be spelled 0.00001, not
            # 1e-05: the same number), ~10x cheaper: at hundreds of streams encoding was the server's top cost.
            return orjson.dumps(body).decode()
        return json.dumps(body, ensure_ascii=self.ensure_ascii, separators=self.separators)

    # ---- shapes, per engine ----
    def role_chunk(self) -> dict[str, Any]:
        raise NotImplementedError

    def token_chunk(self, ev: PlannedTokenEvent, finish: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def finish_chunk(self, completion_tokens: int) -> dict[str, Any]:
        raise NotImplementedError

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any] | None:
        return None

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        p = self.script.prompt_tokens
        return {"prompt_tokens": p, "completion_tokens": completion_tokens, "total_tokens": p + completion_tokens}

    def completion_body(self, events: list[PlannedTokenEvent]) -> dict[str, Any]:
        """The non-streaming response: one body with everything and usage."""
        answer = "".join(e.text for e in events if e.kind == "answer")
        reasoning = "".join(e.text for e in events if e.kind == "reasoning")
        if self.opts.endpoint == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": answer}
            if reasoning:
                message[self.script.reasoning_field] = reasoning
            choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": self.script.finish_reason}
        else:
            choice = {"index": 0, "text": reasoning + answer, "logprobs": None,
                      "finish_reason": self.script.finish_reason}
        obj = "chat.completion" if self.opts.endpoint == "chat" else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.opts.model,
                "choices": [choice], "usage": self.usage(self.script.total_tokens)}

    # ---- helpers ----
    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.opts.endpoint == "chat" else "text_completion"

    def delta(self, ev: PlannedTokenEvent) -> dict[str, Any]:
        key = "content" if ev.kind == "answer" else self.script.reasoning_field
        return {key: ev.text}


class VllmDialect(Dialect):
    """vLLM 0.33 (`entrypoints/openai/chat_completion/serving.py`, `completion/serving.py`): pydantic models
    dumped with exclude_unset, so only the fields vLLM sets appear; `stop_reason` only on the finishing choice.
    SGLang's separate usage chunk has the same layout (its chunks also carry nulls such as `matched_stop`)."""

    def __init__(self, script: Script, opts: RequestOptions, continuous: bool):
        super().__init__(script, opts, finish_on_last_token=True)
        self.per_chunk_usage = continuous and opts.include_usage and opts.continuous_usage_stats

    def envelope(self, choices: list[dict[str, Any]], running: int | None) -> dict[str, Any]:
        body = {"id": self.id, "object": self.chunk_object, "created": self.created, "model": self.opts.model,
                "choices": choices}
        if running is not None and self.per_chunk_usage:
            body["usage"] = self.usage(running)
        return body

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        p = self.script.prompt_tokens  # vLLM's UsageInfo field order
        return {"prompt_tokens": p, "total_tokens": p + completion_tokens, "completion_tokens": completion_tokens}

    def choice(self, payload: dict[str, Any], finish: str | None) -> dict[str, Any]:
        if self.opts.endpoint == "chat":
            c: dict[str, Any] = {"index": 0, "delta": payload, "logprobs": None, "finish_reason": finish}
            if finish is not None:
                c["stop_reason"] = None
            return c
        return {"index": 0, "text": payload.get("text", ""), "logprobs": None, "finish_reason": finish,
                "stop_reason": None}

    def role_chunk(self) -> dict[str, Any]:
        return self.envelope([self.choice({"role": "assistant", "content": ""}, None)], 0)

    def token_chunk(self, ev: PlannedTokenEvent, finish: str | None) -> dict[str, Any]:
        payload = self.delta(ev) if self.opts.endpoint == "chat" else {"text": ev.text}
        return self.envelope([self.choice(payload, finish)], ev.completion_tokens_after)

    def finish_chunk(self, completion_tokens: int) -> dict[str, Any]:
        payload = {"content": ""} if self.opts.endpoint == "chat" else {"text": ""}
        return self.envelope([self.choice(payload, self.script.finish_reason)], completion_tokens)

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any] | None:
        if not self.opts.include_usage:
            return None
        return {"id": self.id, "object": self.chunk_object, "created": self.created, "model": self.opts.model,
                "choices": [], "usage": self.usage(completion_tokens)}


class LlamaCppDialect(Dialect):
    """llama.cpp server (`tools/server/server-task.cpp`), as captured on the wire. Chat: role chunk with
    `content: null`, a separate finish chunk with `delta: {}`, then with include_usage a `choices: []` chunk
    with usage and the final timings (without include_usage the finish chunk carries the timings). Completions:
    the finish chunk (`text: ""`) carries usage and timings. `timings_per_token` adds timings to every token
    chunk; `timings.predicted_n` is the running count of generated tokens."""

    SYSTEM_FINGERPRINT = "b0-unknown"

    def __post_init__(self) -> None:
        # llama.cpp names completions "chatcmpl-..." too, with 32 alphanumerics.
        self.id = self.id or "chatcmpl-" + secrets.token_urlsafe(24).replace("-", "x").replace("_", "y")[:32]
        super().__post_init__()

    def timings(self, predicted_n: int) -> dict[str, Any]:
        p, s = max(self.script.prompt_tokens, 1), self.script
        predicted_ms = max(predicted_n - 1, 0) * s.itl_ms if predicted_n > 1 else 0.001
        per_token = predicted_ms / predicted_n if predicted_n > 1 else 0.0
        return {"cache_n": 0, "prompt_n": p, "prompt_ms": s.ttft_ms, "prompt_per_token_ms": s.ttft_ms / p,
                "prompt_per_second": 1e3 * p / s.ttft_ms if s.ttft_ms else 0.0, "predicted_n": predicted_n,
                "predicted_ms": predicted_ms, "predicted_per_token_ms": per_token,
                "predicted_per_second": 1e3 / per_token if per_token else 0.0}

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        p = self.script.prompt_tokens
        return {"completion_tokens": completion_tokens, "prompt_tokens": p, "total_tokens": p + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": 0}}

    def chat(self, choices: list[dict[str, Any]], **tail: Any) -> dict[str, Any]:
        return {"choices": choices, "created": self.created, "id": self.id, "model": self.opts.model,
                "system_fingerprint": self.SYSTEM_FINGERPRINT, "object": self.chunk_object, **tail}

    def completion(self, text: str, finish: str | None, **tail: Any) -> dict[str, Any]:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
        return {"choices": [choice], "created": self.created, "model": self.opts.model,
                "system_fingerprint": self.SYSTEM_FINGERPRINT, "object": self.chunk_object, **tail}

    def role_chunk(self) -> dict[str, Any]:
        return self.chat([{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}])

    def token_chunk(self, ev: PlannedTokenEvent, finish: str | None) -> dict[str, Any]:
        count = ev.completion_tokens_after
        if self.script.bogus_running_count is not None and ev.index >= 1:
            count = self.script.bogus_running_count
        extra = {"timings": self.timings(count)} if self.opts.timings_per_token else {}
        if self.opts.endpoint == "chat":
            return self.chat([{"finish_reason": None, "index": 0, "delta": self.delta(ev)}], **extra)
        return self.completion(ev.text, None, id=self.id, **extra)

    def finish_chunk(self, completion_tokens: int) -> dict[str, Any]:
        timings = self.timings(completion_tokens)
        if self.opts.endpoint == "chat":
            extra = {} if self.opts.include_usage else {"timings": timings}
            return self.chat([{"finish_reason": self.script.finish_reason, "index": 0, "delta": {}}], **extra)
        return self.completion("", self.script.finish_reason, usage=self.usage(completion_tokens), id=self.id,
                               timings=timings)

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any] | None:
        if self.opts.endpoint != "chat" or not self.opts.include_usage:
            return None
        return self.chat([], usage=self.usage(completion_tokens), timings=self.timings(completion_tokens))


class TransformersDialect(Dialect):
    """transformers serve 5.24 chat (`cli/serving`): openai-typed chunks dumped with exclude_none, so no
    `finish_reason: null` and no `logprobs`; `system_fingerprint: ""`. The role chunk is yielded before
    generation starts (so it arrives long before the first token), and the last chunk carries finish_reason and
    usage together. It never sends [DONE]: script `send_done: false` to copy that too."""

    def __init__(self, script: Script, opts: RequestOptions):
        super().__init__(script, opts, role_at_headers=True)

    def envelope(self, choice: dict[str, Any], **tail: Any) -> dict[str, Any]:
        return {"id": self.id, "choices": [choice], "created": self.created, "model": self.opts.model,
                "object": "chat.completion.chunk", "system_fingerprint": "", **tail}

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        p = self.script.prompt_tokens  # openai CompletionUsage field order
        return {"completion_tokens": completion_tokens, "prompt_tokens": p, "total_tokens": p + completion_tokens}

    def role_chunk(self) -> dict[str, Any]:
        return self.envelope({"delta": {"role": "assistant"}, "index": 0})

    def token_chunk(self, ev: PlannedTokenEvent, finish: str | None) -> dict[str, Any]:
        return self.envelope({"delta": self.delta(ev), "index": 0})

    def finish_chunk(self, completion_tokens: int) -> dict[str, Any]:
        return self.envelope({"delta": {}, "finish_reason": self.script.finish_reason, "index": 0},
                             usage=self.usage(completion_tokens))


class LlamaCppPythonDialect(Dialect):
    """llama-cpp-python 0.3.36 (`llama_cpp/llama_chat_format.py`, `llama.py`): plain dicts through json.dumps
    (spaces after separators, non-ASCII escaped), no usage while streaming. Chat: role chunk
    `delta: {"role": "assistant"}`, a finish chunk with `delta: {}`. Raw UTF-8 is kept when the script asks
    for split_utf8, since escaped text cannot be split inside a character."""

    def __init__(self, script: Script, opts: RequestOptions):
        super().__init__(script, opts, ensure_ascii=not script.split_utf8, separators=(", ", ": "))

    def envelope(self, choice: dict[str, Any]) -> dict[str, Any]:
        if self.opts.endpoint == "chat":
            return {"id": self.id, "model": self.opts.model, "created": self.created,
                    "object": "chat.completion.chunk", "choices": [choice]}
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.opts.model,
                "choices": [choice]}

    def choice(self, payload: dict[str, Any], finish: str | None) -> dict[str, Any]:
        if self.opts.endpoint == "chat":
            return {"index": 0, "delta": payload, "logprobs": None, "finish_reason": finish}
        return {"text": payload.get("text", ""), "index": 0, "logprobs": None, "finish_reason": finish}

    def role_chunk(self) -> dict[str, Any]:
        return self.envelope(self.choice({"role": "assistant"}, None))

    def token_chunk(self, ev: PlannedTokenEvent, finish: str | None) -> dict[str, Any]:
        payload = self.delta(ev) if self.opts.endpoint == "chat" else {"text": ev.text}
        return self.envelope(self.choice(payload, None))

    def finish_chunk(self, completion_tokens: int) -> dict[str, Any]:
        payload: dict[str, Any] = {} if self.opts.endpoint == "chat" else {"text": ""}
        return self.envelope(self.choice(payload, self.script.finish_reason))


def dialect_for(script: Script, opts: RequestOptions) -> Dialect:
    """The engine dialect that a usage style copies, for this endpoint (see the table at the top)."""
    style = script.usage_style
    if style in ("separate_chunk", "continuous"):
        return VllmDialect(script, opts, continuous=style == "continuous")
    if style == "llamacpp_timings" or (style == "last_chunk" and opts.endpoint == "completions"):
        return LlamaCppDialect(script, opts)
    if style == "last_chunk":
        return TransformersDialect(script, opts)
    return LlamaCppPythonDialect(script, opts)
