"""Turn the chunks of one stream into token events, and say how they were counted.

Counting never assumes one chunk is one token unless nothing better exists, and then says so:
1. server_per_chunk: every text-bearing chunk carried the server's running count of generated tokens
   (llama.cpp `timings.predicted_n`, `continuous_usage_stats`), so each event's tokens are the difference between
   consecutive counts. Tokens the server counted without sending text (the end-of-sequence token, bytes held back
   until a UTF-8 character completes) become events with empty text at the time they were reported, so the sum
   equals the server's `completion_tokens`.
2. chunk_count: one token per text-bearing chunk, labelled as such. After the run, `recount_with_tokenizer`
   replaces it by client_tokenizer counts wherever a tokenizer is available (bench/tokenizer.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from servelab.records import CountMethod, RequestRecord, TokenEvent, TokenKind, Usage

if TYPE_CHECKING:
    from servelab.bench.tokenizer import Tokenizer


class RawChunk(NamedTuple):
    t_ns: int
    answer: str
    reasoning: str
    running_count: int | None
    # the chunk carried tool-call pieces (delta.tool_calls): its tokens are the call's, counted with the answer's
    # but with no text of their own (docs/metrics.md#tool-calls)
    tool: bool = False


def count_tokens(chunks: list[RawChunk], usage: Usage | None) -> tuple[list[TokenEvent], CountMethod]:
    events = _from_running_counts(chunks, usage)
    if events is not None:
        return events, "server_per_chunk"
    return _one_per_chunk(chunks), "chunk_count"


def _from_running_counts(chunks: list[RawChunk], usage: Usage | None) -> list[TokenEvent] | None:
    text_chunks = [c for c in chunks if c.answer or c.reasoning or c.tool]
    # A tool-call piece without a count (llama.cpp's Responses output_item.added, which names the call, has no
    # timings) is not a reason to distrust the others: its tokens are in the next count's increase.
    if not any(c.running_count is not None for c in text_chunks) \
            or any(c.running_count is None for c in text_chunks if not c.tool):
        return None
    events: list[TokenEvent] = []
    counted = 0
    last_kind: TokenKind = "answer"
    for c in chunks:
        if c.running_count is None:
            continue
        increase = c.running_count - counted
        if increase < 0:
            return None  # a count that goes backwards is not a running count: do not trust any of it
        counted = c.running_count
        if c.reasoning and c.answer:
            # Engines send reasoning and answer in separate chunks; if one ever mixes them we cannot split the
            # count exactly, so the reasoning part gets one token and the answer the rest.
            r = 1 if increase >= 2 else 0
            events.append(TokenEvent(t_ns=c.t_ns, kind="reasoning", tokens=r, text=c.reasoning))
            events.append(TokenEvent(t_ns=c.t_ns, kind="answer", tokens=increase - r, text=c.answer))
            last_kind = "answer"
        elif c.reasoning or c.answer:
            last_kind = "reasoning" if c.reasoning else "answer"
            events.append(TokenEvent(t_ns=c.t_ns, kind=last_kind, tokens=increase, text=c.reasoning or c.answer))
        elif c.tool:
            last_kind = "answer"
            events.append(TokenEvent(t_ns=c.t_ns, kind="answer", tokens=increase, text=""))
        elif increase > 0:
            events.append(TokenEvent(t_ns=c.t_ns, kind=last_kind, tokens=increase, text=""))
    final = usage.completion_tokens if usage else None
    if final is not None and final > counted and chunks:
        # The final usage reports tokens no chunk counted (e.g. usage arrived in a choices-less chunk).
        events.append(TokenEvent(t_ns=chunks[-1].t_ns, kind=last_kind, tokens=final - counted, text=""))
    return events


def _one_per_chunk(chunks: list[RawChunk]) -> list[TokenEvent]:
    events: list[TokenEvent] = []
    for c in chunks:
        if c.reasoning:
            events.append(TokenEvent(t_ns=c.t_ns, kind="reasoning", tokens=1, text=c.reasoning))
        if c.answer:
            events.append(TokenEvent(t_ns=c.t_ns, kind="answer", tokens=1, text=c.answer))
        elif c.tool:  # a tool-call piece: one token, as a text chunk is one, and no text
            events.append(TokenEvent(t_ns=c.t_ns, kind="answer", tokens=1, text=""))
    return events


def assign_tokens(event_texts: list[str], token_ends: list[int]) -> list[int]:
    """Tokens per event, given where each token of the concatenated text ends: a token belongs to the event in
    which its last character arrived."""
    counts: list[int] = []
    i = 0
    position = 0
    for text in event_texts:
        position += len(text)
        n = 0
        while i < len(token_ends) and token_ends[i] <= position:
            n += 1
            i += 1
        counts.append(n)
    if counts and i < len(token_ends):
        counts[-1] += len(token_ends) - i  # a tokenizer that reports past the text: keep the total exact
    return counts


async def recount_with_tokenizer(records: list[RequestRecord], tokenizer: Tokenizer) -> int:
    """Replace one-per-chunk counts by the tokenizer's, for every record that has nothing better.
    Returns how many records were recounted."""
    # A tool-call answer keeps its one-per-piece count: its tokens are the call's, which no text here holds.
    todo = [r for r in records if r.count_method == "chunk_count" and r.events and not r.tool_calls]
    if not todo:
        return 0
    texts: list[str] = []
    for r in todo:
        for kind in ("answer", "reasoning"):
            texts.append("".join(e.text for e in r.events if e.kind == kind))
    ends = await tokenizer.token_ends(texts)
    for n, r in enumerate(todo):
        new_events: list[TokenEvent] = []
        per_kind = {"answer": ends[2 * n], "reasoning": ends[2 * n + 1]}
        for kind, kind_ends in per_kind.items():
            evs = [e for e in r.events if e.kind == kind]
            for e, k in zip(evs, assign_tokens([e.text for e in evs], kind_ends)):
                new_events.append(e._replace(tokens=k))
        new_events.sort(key=lambda e: (e.t_ns, e.kind != "reasoning"))  # reasoning first on a tie
        r.events = new_events
        r.count_method = "client_tokenizer"
    return len(todo)
