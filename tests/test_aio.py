"""The event loop servelab runs its client on, and how to rule it out."""

from __future__ import annotations

import asyncio

import pytest

from servelab import aio
from servelab.provenance import build_provenance


def test_uvloop_is_used_when_installed_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.delenv("SERVELAB_EVENT_LOOP", raising=False)
    assert aio.loop_name() == "uvloop"
    assert "uvloop" in aio.run(_loop_type())
    monkeypatch.setenv("SERVELAB_EVENT_LOOP", "asyncio")
    assert aio.loop_name() == "asyncio"
    assert "uvloop" not in aio.run(_loop_type())
    assert build_provenance().client_event_loop == "asyncio"


async def _loop_type() -> str:
    return type(asyncio.get_running_loop()).__module__
