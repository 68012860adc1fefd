"""What the typed-event dialects (Responses, Messages) share: reading an event's type, a count, an error."""

from __future__ import annotations

from typing import Any

from servelab.protocol.chunks import ChunkView, MalformedChunk, _excerpt, error_message

NOTHING = ChunkView()  # an event that carries nothing a benchmark reads: one shared, never-modified view


def event_type(obj: Any) -> str:
    """The event's `type`: typed events name themselves in their data (the `event:` line repeats it, or is left
    out by some servers), so the data is what is read."""
    if obj.__class__ is not dict:
        raise MalformedChunk(f"the event is not a JSON object: {_excerpt(obj)}")
    kind = obj.get("type")
    if kind.__class__ is not str:
        raise MalformedChunk(f"the event has no string `type`: {_excerpt(obj)}")
    return kind


def text_of(obj: dict[str, Any], field: str, where: str) -> str:
    value = obj.get(field)
    if value.__class__ is not str:
        raise MalformedChunk(f"{where}'s `{field}` is not a string: {_excerpt(value)}")
    return value


def count(value: Any) -> int | None:
    """A token count as JSON carries it: an int, or an integral float (10^30 arrives as one, and is kept so the
    client's bound fails the request); anything else is no count."""
    if value.__class__ is int:
        return value
    if value.__class__ is float and value.is_integer():
        return int(value)
    return None


def running_count(obj: dict[str, Any]) -> tuple[int | None, int | None]:
    """llama.cpp's `timings` (predicted_n: generated so far; cache_n: prompt tokens from its cache), which it adds
    to Responses events as to chat chunks (with timings_per_token on deltas, always on response.completed)."""
    timings = obj.get("timings")
    if timings.__class__ is not dict:
        return None, None
    cache_n = timings.get("cache_n")
    return count(timings.get("predicted_n")), cache_n if cache_n.__class__ is int and cache_n >= 0 else None


def error_view(err: Any, fallback: Any) -> ChunkView:
    """An error event's message: `err` when it is an error object or string, else the whole event."""
    if isinstance(err, dict) or (isinstance(err, str) and err):
        return ChunkView(error=error_message(err))
    return ChunkView(error=" ".join(str(fallback).split())[:300])
