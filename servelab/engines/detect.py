"""Recognise which engine serves a URL, so `bench URL` can ask it for exact per-chunk token counts."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from servelab.engines import REGISTRY, EngineAdapter


async def detect_engine(session: aiohttp.ClientSession, base_url: str, timeout_s: float = 3.0
                        ) -> EngineAdapter | None:
    """Ask each engine's fingerprint path; the first adapter that recognises the answer wins. None if unknown."""
    return (await detect_engine_config(session, base_url, timeout_s))[0]


async def detect_engine_config(session: aiohttp.ClientSession, base_url: str, timeout_s: float = 3.0
                               ) -> tuple[EngineAdapter | None, Any]:
    """detect_engine, with the fingerprint path's answer (llama.cpp's /props: its slots, its context): (None,
    None) if unknown."""
    for cls in REGISTRY.values():
        adapter = cls()
        if not adapter.fingerprint_path:
            continue
        try:
            async with asyncio.timeout(timeout_s):
                async with session.get(base_url.rstrip("/") + adapter.fingerprint_path) as resp:
                    if resp.status != 200:
                        continue
                    body = json.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            continue
        if adapter.fingerprint(body):
            return adapter, body
    return None, None
