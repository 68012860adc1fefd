"""An incremental Server-Sent Events parser that works on raw bytes as they come off the socket.

It follows the WHATWG event-stream rules where engines rely on them and tolerates what engines actually send:
- lines end in \n, \r\n or a lone \r (a \r\n split across two reads is one line end, not two);
- `:` lines are comments (keep-alive pings), counted but not events;
- several `data:` lines in one event are joined with \n; events of any size (no 64 KB line limit);
- UTF-8 is decoded per complete event, so a multi-byte character split across reads is never corrupted;
- at end of stream, an event without the final blank line is still delivered (`close()`);
- an event may be large, but not without bound: one that grows past MAX_EVENT_BYTES (a server that never sends
  the blank line, or a decompression bomb) is an error, not a process that runs out of memory;
- an event that is not valid UTF-8 raises SSEDecodeError, which carries the events the same read completed
  before it (`.events`), so what arrived intact is never dropped with it.
"""

from __future__ import annotations

from typing import NamedTuple


MAX_EVENT_BYTES = 16 * 1024 * 1024  # one event's data (and a line without its end) may grow to this


class SSEDecodeError(ValueError):
    """An event's data was not valid UTF-8, or an event grew past MAX_EVENT_BYTES. `events`: the events completed
    by the same read before the bad one, in order (the caller still owes them to its reader)."""

    def __init__(self, message: str, events: list[SSEEvent] | None = None):
        super().__init__(message)
        self.events: list[SSEEvent] = events or []


class SSEEvent(NamedTuple):  # a tuple: the cheapest immutable record to build once per event
    data: str
    event: str | None = None
    id: str | None = None


class SSEParser:
    __slots__ = ("_tail", "_data", "_size", "_event", "_id", "_pending_cr", "comments")

    def __init__(self) -> None:
        self._tail = b""  # an incomplete last line
        self._data: list[bytes] = []
        self._size = 0  # bytes in _data
        self._event: str | None = None
        self._id: str | None = None
        self._pending_cr = False  # the previous read ended in \r: a leading \n now belongs to it
        self.comments = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume bytes; return the events they completed (possibly none)."""
        if not self._tail and not self._data and not self._pending_cr and chunk.endswith(b"\n\n"):
            fast = self._feed_whole_events(chunk)
            if fast is not None:
                return fast
        if self._pending_cr:
            self._pending_cr = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
        buf = self._tail + chunk if self._tail else chunk
        if b"\r" in buf:
            # A trailing \r already ends a line (waiting for a possible \n would delay the event).
            self._pending_cr = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._tail = lines.pop()
        events: list[SSEEvent] = []
        data = self._data
        try:
            for line in lines:
                # The two lines every OpenAI stream is made of, handled inline (this runs once per line).
                if not line:
                    if data:
                        self._dispatch(events)
                        data = self._data
                    else:
                        self._event = None
                elif line.startswith(b"data:"):
                    data.append(line[6:] if line[5:6] == b" " else line[5:])
                    self._size += len(line)
                else:
                    self._line(line, events)
            if self._size > MAX_EVENT_BYTES or len(self._tail) > MAX_EVENT_BYTES:
                raise SSEDecodeError(f"an event grew past {MAX_EVENT_BYTES // (1024 * 1024)} MiB without ending")
        except SSEDecodeError as exc:
            exc.events = events
            raise
        return events

    def _feed_whole_events(self, chunk: bytes) -> list[SSEEvent] | None:
        """The common read: whole `data: …` events and nothing else (no CR, comments, fields or multi-line
        data). Handled in one split; anything else returns None and takes the general path, before any state
        has changed."""
        if b"\r" in chunk:
            return None
        events: list[SSEEvent] = []
        event_id = self._id
        for block in chunk[:-2].split(b"\n\n"):
            if not block.startswith(b"data: ") or b"\n" in block:
                return None
            try:
                events.append(SSEEvent(block[6:].decode("utf-8"), None, event_id))
            except UnicodeDecodeError as exc:
                raise SSEDecodeError(f"event data is not valid UTF-8 at byte {exc.start}", events) from exc
        self._event = None
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: deliver a final event that lacked its blank line."""
        events: list[SSEEvent] = []
        try:
            if self._tail:
                self._line(self._tail, events)
                self._tail = b""
            if self._data:
                self._dispatch(events)
        except SSEDecodeError as exc:
            exc.events = events
            raise
        return events

    def _line(self, line: bytes, events: list[SSEEvent]) -> None:
        if not line:
            if self._data:
                self._dispatch(events)
            else:
                self._event = None
            return
        if line[0] == 0x3A:  # b":"
            self.comments += 1
            return
        field, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            self._data.append(value)
            self._size += len(value)
        elif field == b"event":
            self._event = value.decode("utf-8", "replace")
        elif field == b"id":
            self._id = value.decode("utf-8", "replace")
        # "retry" and unknown fields are ignored, as the spec says.

    def _dispatch(self, events: list[SSEEvent]) -> None:
        raw = b"\n".join(self._data)
        self._data = []
        self._size = 0
        event, self._event = self._event, None
        try:
            data = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SSEDecodeError(f"event data is not valid UTF-8 at byte {exc.start}") from exc
        events.append(SSEEvent(data=data, event=event, id=self._id))
