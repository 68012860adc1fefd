"""Empty a running server's prefix cache, where its engine has an endpoint for it, and say in one line what happened.

An experiment measures each cell as several trials against one server. Their prompts are numbered apart, but the
server's prefix cache still holds the shared system prompt and whatever else the last trial (or verify) left, so
trial order could leak cache state into TTFT. Before every trial the pipeline calls `reset_prefix_cache`.

How each engine does it (engines/base.py `CacheReset`, read from the engines' source):
- SGLang: `POST /flush_cache` answers 200 "Cache flushed." or, while requests run or wait, 400 and does nothing
  (asked again twice, a second apart: a level's cancelled requests may take a moment to leave).
- vLLM: `POST /reset_prefix_cache` answers 200 with an empty body (newer builds 409 when running requests prevent
  it); FastAPI mounts it only with VLLM_SERVER_DEV_MODE=1, so without that it is a plain 404.
- llama.cpp's server: `GET /slots` lists the slots; `POST /slots/{id}?action=erase` empties one and answers
  {"id_slot", "n_erased"} (cached tokens dropped). Every slot action needs --slot-save-path: 501 otherwise. The
  server's host-memory prompt cache (--cache-ram, 8192 MiB by default) is not a slot: no endpoint clears it, and
  a prompt saved there when its slot moved on can still be restored after the erase (measured with xllamacpp
  2026.10), which the line says.

Every call has a short deadline, carries the API key (or the URL's user and password), goes to the server's own
address with no proxy and no redirect, and never raises: the answer is a `CacheReset` whose `line` is recorded on
the trial and printed.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from servelab.bench.client import basic_auth
from servelab.redaction import redact_url

DEADLINE_S = 5.0  # per call: an idle server answers these in milliseconds
MAX_SLOTS = 1024  # a /slots answer longer than this is not believed
# SGLang (400) and newer vLLM (409) refuse while requests run: asked again this many times in all, this far apart
BUSY_TRIES = 3
BUSY_WAIT_S = 1.0


@dataclass(frozen=True)
class CacheReset:
    done: bool  # the server said it emptied its cache (as far as its endpoint reaches)
    line: str  # what happened, or why not: "reset: ..." or "not reset: ..."


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is answered as the status it is: the reset goes to this server or nowhere


# No ProxyHandler with proxies: an http_proxy in the environment must not carry a loopback call off the machine.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def control_call(method: str, url: str, headers: dict[str, str], body: bytes = b"{}") -> tuple[int, str]:
    """(status, body text) of one call (a POST sends `body` as JSON); HTTP errors are answers too. Anything else
    raises (caught by the caller)."""
    data = body if method == "POST" else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={**headers, **({"Content-Type": "application/json"} if data else {})})
    try:
        with _OPENER.open(request, timeout=DEADLINE_S) as response:
            return response.status, response.read(65536).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(65536).decode("utf-8", "replace") if exc.fp is not None else ""


def server_address(base_url: str, api_key: str | None) -> tuple[str, dict[str, str]]:
    """The URL without its credentials, and the header that carries them (the key as a bearer token, else the
    URL's user and password)."""
    from yarl import URL

    auth = f"Bearer {api_key}" if api_key else basic_auth(base_url)
    return str(URL(base_url.rstrip("/")).with_user(None)), ({"Authorization": auth} if auth else {})


def answer_message(body: str) -> str:
    """An error answer's message (llama.cpp and OpenAI-style {"error": {"message"}}, FastAPI {"detail"}), else the
    body's first line, short."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error")
        text = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else doc.get("detail")
        if isinstance(text, str) and text:
            return text[:200]
    first = body.strip().splitlines()[0] if body.strip() else ""
    return first[:200]


def _while_busy(method: str, url: str, headers: dict[str, str], busy: int) -> tuple[int, str, int]:
    """One call, asked again (BUSY_TRIES in all, BUSY_WAIT_S apart) while the server answers `busy`: the requests
    a level cancelled at its end may take a moment to leave the engine. (status, body, tries)."""
    for tries in range(1, BUSY_TRIES + 1):
        status, body = control_call(method, url, headers)
        if status != busy or tries == BUSY_TRIES:
            return status, body, tries
        time.sleep(BUSY_WAIT_S)
    raise AssertionError("unreachable")  # pragma: no cover


def _sglang(base: str, headers: dict[str, str]) -> CacheReset:
    status, body, tries = _while_busy("POST", base + "/flush_cache", headers, busy=400)
    if status == 200:
        return CacheReset(True, "reset: SGLang radix cache flushed (POST /flush_cache)")
    if status == 400:
        return CacheReset(False, f"not reset: SGLang refused POST /flush_cache (400) {tries} times, "
                                 f"{BUSY_WAIT_S:g} s apart: it flushes only when no request is running or waiting")
    return CacheReset(False, f"not reset: SGLang answered {status} to POST /flush_cache"
                             + (f": {answer_message(body)}" if answer_message(body) else ""))


def _vllm(base: str, headers: dict[str, str]) -> CacheReset:
    status, body, tries = _while_busy("POST", base + "/reset_prefix_cache", headers, busy=409)
    if status == 200:
        return CacheReset(True, "reset: vLLM prefix cache reset (POST /reset_prefix_cache)")
    if status == 404:
        return CacheReset(False, "not reset: vLLM answered 404 to POST /reset_prefix_cache: it serves it only "
                                 "when started with VLLM_SERVER_DEV_MODE=1")
    if status == 409:
        return CacheReset(False, f"not reset: vLLM answered 409 to POST /reset_prefix_cache {tries} times, "
                                 f"{BUSY_WAIT_S:g} s apart: running requests prevented it")
    return CacheReset(False, f"not reset: vLLM answered {status} to POST /reset_prefix_cache"
                             + (f": {answer_message(body)}" if answer_message(body) else ""))


def _slot_ids(body: str) -> list[int] | None:
    try:
        slots = json.loads(body)
    except ValueError:
        return None
    if not isinstance(slots, list) or len(slots) > MAX_SLOTS:
        return None
    ids = [s.get("id") for s in slots if isinstance(s, dict)]
    if len(ids) != len(slots) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        return None
    return ids


def _llamacpp(base: str, headers: dict[str, str]) -> CacheReset:
    status, body = control_call("GET", base + "/slots", headers)
    if status != 200:
        why = answer_message(body)
        return CacheReset(False, f"not reset: llama.cpp answered {status} to GET /slots"
                                 + (f": {why}" if why else "") + (" (started with --no-slots?)" if status == 501
                                                                  else ""))
    ids = _slot_ids(body)
    if ids is None:
        return CacheReset(False, "not reset: llama.cpp's GET /slots did not answer a list of slots with ids")
    if not ids:
        return CacheReset(False, "not reset: llama.cpp's GET /slots listed no slot")
    erased = 0
    for slot in ids:
        status, body = control_call("POST", f"{base}/slots/{slot}?action=erase", headers)
        if status == 501:
            return CacheReset(False, "not reset: llama.cpp answered 501 to a slot erase: slot actions need the "
                                     "server started with --slot-save-path DIR")
        if status != 200:
            why = answer_message(body)
            return CacheReset(False, f"not reset: llama.cpp answered {status} to POST /slots/{slot}?action=erase"
                                     + (f": {why}" if why else ""))
        try:
            n = json.loads(body).get("n_erased")
        except (ValueError, AttributeError):
            n = None
        erased += n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0
    return CacheReset(True, f"reset: llama.cpp erased {len(ids)} slot{'s' if len(ids) != 1 else ''} "
                            f"({erased:,} cached tokens); its host-memory prompt cache (--cache-ram) has no endpoint "
                            f"and may still hold earlier prompts (--cache-ram 0 turns it off)")


_BY_KIND = {"sglang-flush": _sglang, "vllm-reset": _vllm, "llamacpp-slots": _llamacpp}


def _detect(base: str, api_key: str | None) -> Any:
    """The adapter of the engine behind a URL (its fingerprint path), or None."""
    import aiohttp

    from servelab.engines.detect import detect_engine

    async def ask() -> Any:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        async with aiohttp.ClientSession(headers=headers, trust_env=False) as session:
            return await detect_engine(session, base, timeout_s=DEADLINE_S)

    return asyncio.run(ask())


def reset_prefix_cache(base_url: str, engine: str | None = None, api_key: str | None = None) -> CacheReset:
    """Empty the prefix cache of the server at `base_url`, served by `engine` (a registry name; None: recognised
    from its answers). Never raises."""
    from servelab.engines import REGISTRY

    shown = redact_url(base_url) or base_url
    try:
        base, headers = server_address(base_url, api_key)  # the credentials travel in the header only
        if engine == "command":  # any server behind a command line: recognised by its answers, as a URL is
            engine = None
        adapter = REGISTRY[engine]() if engine in REGISTRY else _detect(base, api_key) if engine is None else None
        if adapter is None:
            return CacheReset(False, f"not reset: {'engine ' + engine if engine else 'the engine at ' + shown} "
                                     f"{'is not one servelab knows' if engine else 'was not recognised'}, so no "
                                     f"reset endpoint is known")
        if adapter.cache_reset is None:
            return CacheReset(False, f"not reset: no endpoint known to reset {adapter.title}'s prefix cache")
        return _BY_KIND[adapter.cache_reset](base, headers)
    except TimeoutError:
        return CacheReset(False, f"not reset: {shown} did not answer within {DEADLINE_S:g} s")
    except urllib.error.URLError as exc:
        reason = exc.reason if not isinstance(exc.reason, OSError) else exc.reason.strerror or exc.reason
        return CacheReset(False, f"not reset: cannot reach {shown}: {reason}")
    except Exception as exc:  # noqa: BLE001 - a reset that fails must never end the run; its reason is recorded
        return CacheReset(False, f"not reset: {type(exc).__name__}: {redact_url(str(exc)) or exc}")
