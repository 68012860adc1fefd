"""The engine's torch profiler around one level on request (`bench --profile-level TAG`): started just before the
level with that tag, stopped just after it (also when the level is interrupted, so the engine is never left
profiling), and where its traces went kept in the level's `load["profile"]`.

How each engine does it (engines/base.py `ProfilerKind`, read from the engines' source):
- SGLang (http_server.py): `POST /start_profile` with a ProfileReqInput body; servelab sends `output_dir`, a
  directory of its own under the engine host's temporary directory, so the trace directory is known: the
  scheduler writes `{output_dir}/{profile_id}-TP-{rank}.trace.json.gz` at `POST /stop_profile`. Both answer 200
  text; out of turn ("already in progress", "not in progress") the scheduler's refusal is a plain 500.
- vLLM (entrypoints/serve/profile/api_router.py): `POST /start_profile` and `/stop_profile` answer 200 with an
  empty body, mounted only when the engine was started with VLLM_TORCH_PROFILER_DIR (404 otherwise); the traces go
  to that directory, which vLLM does not report: servelab keeps it when it launched the engine with it (the
  engine's environment, read from /proc), else says where to look.

Calls have the cache reset's deadlines and auth (bench/cache_reset.py) and never raise.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from servelab.bench.cache_reset import DEADLINE_S, answer_message, control_call, server_address


@dataclass
class LevelProfile:
    """One level's profile: what starting it said, where the traces go, and what stopping it said."""

    kind: str | None  # "sglang", "vllm"; None: the engine has no profiler endpoint known
    base: str = ""
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    started: bool = False
    trace_dir: str | None = None
    lines: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """What the level's load keeps: {"trace_dir": path or None, "started": bool, "said": [lines]}."""
        return {"trace_dir": self.trace_dir, "started": self.started, "said": list(self.lines)}


def _engine_env(pids: list[int], name: str) -> str | None:
    """An environment variable of the engine's processes (the first that has it), where this host can read it."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                for item in fh.read().split(b"\0"):
                    key, _, value = item.partition(b"=")
                    if key.decode("utf-8", "replace") == name and value:
                        return value.decode("utf-8", "replace")
        except OSError:
            continue
    return None


def start_profile(base_url: str, kind: str | None, tag: str, api_key: str | None = None,
                  engine_pids: list[int] | None = None, engine_title: str = "the engine") -> LevelProfile:
    """Start the engine's profiler before level `tag`. Never raises; `started` says whether it did."""
    profile = LevelProfile(kind=kind)
    if kind is None:
        profile.lines.append(f"not profiled: no profiler endpoint known for {engine_title}")
        return profile
    try:
        profile.base, profile.headers = server_address(base_url, api_key)
        body = b"{}"
        if kind == "sglang":
            stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
            profile.trace_dir = os.path.join(tempfile.gettempdir(), "servelab-profiles", f"{stamp}-{tag}")
            body = json.dumps({"output_dir": profile.trace_dir}).encode()
        status, text = control_call("POST", profile.base + "/start_profile", profile.headers, body)
        if status == 200:
            profile.started = True
            if kind == "vllm":
                profile.trace_dir = _engine_env(engine_pids or [], "VLLM_TORCH_PROFILER_DIR")
            where = profile.trace_dir or "the engine's VLLM_TORCH_PROFILER_DIR"
            profile.lines.append(f"profiling {tag}: POST /start_profile, traces in {where}")
        elif kind == "vllm" and status == 404:
            profile.trace_dir = None
            profile.lines.append("not profiled: vLLM answered 404 to POST /start_profile: it serves it only when "
                                 "started with VLLM_TORCH_PROFILER_DIR")
        else:
            profile.trace_dir = None
            why = answer_message(text)
            profile.lines.append(f"not profiled: {kind} answered {status} to POST /start_profile"
                                 + (f": {why}" if why else "") + (" (a profile already in progress?)"
                                                                   if kind == "sglang" and status == 500 else ""))
    except Exception as exc:  # noqa: BLE001 - a profiler that fails must not end the bench; the level says why
        profile.trace_dir, profile.started = None, False
        what = f"no answer within {DEADLINE_S:g} s" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        profile.lines.append(f"not profiled: POST /start_profile: {what}")
    return profile


def stop_profile(profile: LevelProfile) -> LevelProfile:
    """Stop what `start_profile` started (nothing when it did not start). Never raises."""
    if not profile.started:
        return profile
    try:
        status, text = control_call("POST", profile.base + "/stop_profile", profile.headers)
        if status == 200:
            profile.lines.append("POST /stop_profile: the engine writes the traces now"
                                 + (f" to {profile.trace_dir}" if profile.trace_dir else ""))
        else:
            why = answer_message(text)
            profile.lines.append(f"POST /stop_profile answered {status}" + (f": {why}" if why else ""))
    except Exception as exc:  # noqa: BLE001 - said in the level, never raised
        what = f"no answer within {DEADLINE_S:g} s" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        profile.lines.append(f"POST /stop_profile: {what}")
    return profile
