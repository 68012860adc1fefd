"""What one load level is, as a mode hands it to the level runner (bench/levels.py): its tag, the kind of summary it
makes, its load, how it is bounded and what the live progress is told when it begins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from servelab.bench.loads.control import LevelControl, StallWatch


@dataclass
class LevelSpec:
    tag: str  # single, c8, r4, u3, trace, …
    mode: Literal["single", "concurrency", "rate"]  # the summary's mode
    concurrency: int  # streams (open loop: its cap, 0 when uncapped)
    rate: float | None = None  # the offered request rate, when the level offers one
    # How the load was generated (Summary.load). None: a level of the single-stream run or of the sweep, whose tag
    # and concurrency say it all; it carries no load description and no SLO verdict.
    load: dict[str, Any] | None = None
    control: LevelControl | None = None  # the level's stop rule (None: single stream)
    stall: StallWatch | None = None  # single stream: whether the server stopped answering
    # Descriptors to make sure of before the level begins: (streams, what the level is called in the refusal).
    streams: tuple[int, str] | None = None
    # What the live progress is told when the level begins (report/progress.py).
    planned_s: float | None = None
    cap_s: float | None = None
    planned_requests: int | None = None
