"""What the calibration server writes, and its record of when each write went out.

Both writers use these, the precise one (server.py) and the one-timer one (ticker.py), so they sit below both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Write:
    data: bytes
    due_ns: int | None  # offset from receipt; None = as soon as the previous write is out
    kind: str  # "answer" | "reasoning" (token events), or "role", "finish", "usage", "done", "comment", ...
    tokens: int = 0
    lead: bytes = b""  # split_utf8: written early, right after the previous write, ending mid-character


@dataclass
class Truth:
    """What went out for one request, and when. Every `t_ns` is perf_counter_ns taken right after the write
    returned, i.e. once the bytes were in the kernel: an upper bound on when they left, never earlier."""

    id: str
    endpoint: str
    stream: bool
    script: dict[str, Any]
    request_received_ns: int  # the handler started (headers parsed, body not yet read)
    headers_sent_ns: int | None = None  # non-streaming: when the whole response was written
    # Kept as tuples while streaming (cheap to append, small to hold); expanded to objects in as_json().
    events: list[tuple[int, int | None, int, str]] = field(default_factory=list)  # t_ns, target_ns, tokens, kind
    control_events: list[tuple[int, str]] = field(default_factory=list)  # t_ns, kind: role/finish/usage/done/...
    completed_ns: int | None = None
    outcome: str = "in_progress"  # complete, stalled, disconnected, in_band_error, http_error, html, redirect,
    # client_gone

    def record(self, write: Write, t_ns: int) -> None:
        if write.kind in ("answer", "reasoning"):
            target = None if write.due_ns is None else self.request_received_ns + write.due_ns
            self.events.append((t_ns, target, write.tokens, write.kind))
        else:
            self.control_events.append((t_ns, write.kind))

    def finish(self, outcome: str) -> None:
        self.completed_ns, self.outcome = time.perf_counter_ns(), outcome

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__,
                "events": [{"t_ns": t, "target_ns": target, "tokens": n, "kind": k} for t, target, n, k in self.events],
                "control_events": [{"t_ns": t, "kind": k} for t, k in self.control_events]}
