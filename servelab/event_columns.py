"""How a record's token events are written: as columns, not one object per event (docs/output.md#events).

A streamed answer of 256 tokens used to take 256 JSON objects, each with its receive time, kind, token count and
text: ~66 bytes per token on disk. Written as columns it is the first event's time, the gaps after it (integer
nanoseconds, so nothing is rounded), the token counts (one number when every event carried the same count), the
kinds as runs (`[["reasoning", 12], ["answer", 244]]`) and the answer's and the reasoning's whole text once
each, not a copy per event:

    "events": {"t0": 81723004511, "dt": [9811203, 10002411, ...], "tokens": 1,
               "kinds": [["answer", 256]], "text": {"answer": "...", "reasoning": ""}}

Per-event text is kept only when asked (`--keep-events-text`, or the context key `events_text`): then "text"
is the list of each event's text. Reading accepts this form and the older list of event objects alike.
"""

from __future__ import annotations

from typing import Any

def encode(events: list, answer_text: str, reasoning_text: str, per_event_text: bool) -> dict[str, Any]:
    """The columns of `events` (TokenEvent objects, in arrival order)."""
    if not events:
        return {"t0": None, "dt": [], "tokens": [], "kinds": [],
                "text": [] if per_event_text else {"answer": answer_text, "reasoning": reasoning_text}}
    # Written as each request ends, inside the client's event loop: C-level passes (count) where it can.
    times = [e.t_ns for e in events]
    tokens = [e.tokens for e in events]
    kind_of = [e.kind for e in events]
    if kind_of.count(kind_of[0]) == len(kind_of):
        kinds: list[list] = [[kind_of[0], len(kind_of)]]
    else:
        kinds = []
        for kind in kind_of:
            if kinds and kinds[-1][0] == kind:
                kinds[-1][1] += 1
            else:
                kinds.append([kind, 1])
    return {"t0": times[0], "dt": [b - a for a, b in zip(times, times[1:])],
            "tokens": tokens[0] if tokens.count(tokens[0]) == len(tokens) else tokens,
            "kinds": kinds,
            "text": [e.text for e in events] if per_event_text
            else {"answer": answer_text, "reasoning": reasoning_text}}


def decode(columns: dict[str, Any]) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
    """(event dicts, (answer text, reasoning text) when the text was kept whole, else None)."""
    t0 = columns.get("t0")
    dt = columns.get("dt") or []
    kinds = columns.get("kinds") or []
    n = (1 + len(dt)) if t0 is not None else 0
    if sum(count for _, count in kinds) != n:
        raise ValueError(f"events: {n} times but {sum(c for _, c in kinds)} kinds")
    tokens = columns.get("tokens", 1)
    counts = [tokens] * n if isinstance(tokens, int) else list(tokens)
    if len(counts) != n:
        raise ValueError(f"events: {n} times but {len(counts)} token counts")
    text = columns.get("text")
    per_event = text if isinstance(text, list) else None
    if per_event is not None and len(per_event) != n:
        raise ValueError(f"events: {n} times but {len(per_event)} texts")
    events: list[dict[str, Any]] = []
    t = t0
    i = 0
    for kind, count in kinds:
        for _ in range(count):
            if i:
                t += dt[i - 1]
            events.append({"t_ns": t, "kind": kind, "tokens": counts[i],
                           "text": per_event[i] if per_event is not None else ""})
            i += 1
    whole = None
    if isinstance(text, dict):
        whole = (text.get("answer") or "", text.get("reasoning") or "")
    return events, whole
