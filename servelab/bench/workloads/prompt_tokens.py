"""How many tokens a prompt is, counted the way the server will count it: after its chat template.

Exact input lengths need the served model's tokenizer *and* its chat template (a client-side count of the user
text misses the template's tokens; GuideLLM #75). The simplest source of both is the server itself:
- llama.cpp: `POST /apply-template {"messages": …}` returns the templated prompt, `POST /tokenize` counts it
  (with `add_special` and special-token parsing, as the chat endpoint does). Checked on xllamacpp 2026.10:
  the count equals `usage.prompt_tokens` of the same chat request.
- vLLM and SGLang have `POST /tokenize` that takes `messages` and applies the template server-side: an adapter
  for them is one more class here and one line in COUNTERS (not written yet: no such engine in the test tiers).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import aiohttp

from servelab.errors import UserError

Messages = list[dict[str, Any]]


class PromptTokenCounter(Protocol):
    name: str

    async def count_prompt_tokens(self, messages_or_prompt: str | Messages) -> int:
        """Tokens the server will see: chat messages after the chat template; a string as a completions prompt
        (with whatever special tokens, e.g. BOS, the server adds to one)."""
        ...

    async def count_text_tokens(self, text: str) -> int:
        """Tokens of a bare text, no special tokens (an answer's length, e.g. a ShareGPT reply)."""
        ...


class LlamaCppPromptCounter:
    """llama.cpp's server: /apply-template, then /tokenize."""

    name = "server:llama.cpp /apply-template + /tokenize"

    def __init__(self, session: aiohttp.ClientSession, base_url: str):
        self.session = session
        self.base_url = base_url.rstrip("/")

    async def count_prompt_tokens(self, messages_or_prompt: str | Messages) -> int:
        if isinstance(messages_or_prompt, list):
            templated = await self._post("/apply-template", {"messages": messages_or_prompt})
            prompt = templated.get("prompt")
            if not isinstance(prompt, str):
                raise UserError(f"{self.base_url}/apply-template answered without a prompt: {str(templated)[:120]}")
            return await self._tokens(prompt, special=True)
        return await self._tokens(messages_or_prompt, special=True)

    async def count_text_tokens(self, text: str) -> int:
        return await self._tokens(text, special=False)

    async def _tokens(self, text: str, *, special: bool) -> int:
        body = await self._post("/tokenize", {"content": text, "add_special": special, "parse_special": special})
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise UserError(f"{self.base_url}/tokenize answered without tokens: {str(body)[:120]}")
        return len(tokens)

    async def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            async with self.session.post(self.base_url + path, json=payload,
                                         timeout=aiohttp.ClientTimeout(total=60)) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise UserError(f"{self.base_url}{path} answered HTTP {resp.status}: "
                                    f"{raw[:160].decode('utf-8', 'replace')}")
                body = json.loads(raw)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UserError(f"{self.base_url}{path} failed: {type(exc).__name__}: {exc}") from None
        except ValueError:
            raise UserError(f"{self.base_url}{path} did not answer JSON") from None
        if not isinstance(body, dict):
            raise UserError(f"{self.base_url}{path} answered {type(body).__name__}, not an object")
        return body


# Engine name (engines/ registry) -> counter class. Engines missing here cannot give exact synthetic lengths.
COUNTERS: dict[str, type] = {
    "llamacpp": LlamaCppPromptCounter,
    "llama-server": LlamaCppPromptCounter,
}


def counter_for(engine: str | None, session: aiohttp.ClientSession, base_url: str) -> PromptTokenCounter | None:
    cls = COUNTERS.get(engine or "")
    return cls(session, base_url) if cls else None
