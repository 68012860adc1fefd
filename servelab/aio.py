"""The event loop servelab runs on: uvloop where it is installed (Linux, macOS), asyncio's own otherwise.

uvloop moves socket reads and timers into C: on the calibration server it cuts the bench client's CPU per
streamed event by about a fifth (benchmarks/client_ceiling.py). `SERVELAB_EVENT_LOOP=asyncio` turns it off, to
rule it out when something looks wrong.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_name() -> str:
    """"uvloop" or "asyncio": what `run` will use (recorded in provenance)."""
    if os.environ.get("SERVELAB_EVENT_LOOP", "").lower() == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on the chosen loop. Ctrl-C behaves as with asyncio.run (KeyboardInterrupt, tasks cancelled)."""
    if loop_name() == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)
