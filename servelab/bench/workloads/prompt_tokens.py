"""How many tokens a prompt is, counted the way the server will count it: after its chat template.

Exact input lengths need the served model's tokenizer *and* its chat template (a client-side count of the user
text misses the template's tokens; GuideLLM #75). The simplest source of both is the server itself:
- llama.cpp: `POST /apply-template {"messages": …}` returns the templated prompt, `POST /tokenize` counts it
  (with `add_special` and special-token parsing, as the chat endpoint does). Checked on xllamacpp 2026.10:
  the count equals `usage.prompt_tokens` of the same chat request.
- vLLM: `POST /tokenize` takes either a TokenizeChatRequest (`messages`, `add_generation_prompt` default true,
  `add_special_tokens` default false, `continue_final_message`, `chat_template_kwargs`, `tools`) or a
  TokenizeCompletionRequest (`prompt`, `add_special_tokens` default true) and answers TokenizeResponse
  `{"count", "max_model_len", "tokens", "token_strs"}`. The chat defaults are those of ChatCompletionRequest and
  the prompt default that of CompletionRequest, so the count is what the chat or completions endpoint will see.
  Read in vllm-project/vllm: vllm/entrypoints/serve/tokenize/api_router.py (the route, POST /tokenize only),
  vllm/entrypoints/serve/tokenize/protocol.py (the request and response models),
  vllm/entrypoints/openai/chat_completion/protocol.py (ChatCompletionRequest's defaults).
- SGLang: `POST /v1/tokenize` (and `POST /tokenize`, hidden from the schema) answers
  `{"tokens", "count", "max_model_len"}`. Recent SGLang takes exactly one of `prompt` (with `add_special_tokens`,
  default true) or `messages` (plus `tools`, `reasoning_effort`, `chat_template_kwargs`, ...), and renders
  messages through the chat endpoint's own template code (TokenizeRequest.to_chat_completion_request, then the chat
  serving's _process_messages). Older SGLang's TokenizeRequest requires `prompt` and has no `messages`: it answers
  a messages-only request with a validation error, and then, for chat messages only, this counter falls back to
  the usage counter below. Read in sgl-project/sglang: python/sglang/srt/entrypoints/http_server.py (the routes),
  python/sglang/srt/entrypoints/openai/protocol.py (TokenizeRequest, TokenizeResponse, the chat request),
  python/sglang/srt/entrypoints/openai/serving_tokenize.py (the handler, older prompt-only and newer versions).
- Any OpenAI server that reports usage (the fallback, UsagePromptCounter): a non-streaming request with
  max_tokens=1 answers `usage.prompt_tokens`, the server's own count of that very prompt, exact by definition.
  It costs a prefill per count, and that prefill may warm the server's prefix cache with the prompts it counted.
  Used for engines without a chat-template tokenize endpoint (TGI, llama-cpp-python, transformers serve) and for
  chat messages on an SGLang too old to tokenize them.
Nothing here copies the engines' code; the formats were read in their source.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import aiohttp

from servelab.engines import REGISTRY
from servelab.engines.base import EngineAdapter
from servelab.errors import UserError
from servelab.protocol.tokenize import ENDPOINTS, LLAMA_CPP_APPLY_TEMPLATE

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


class ServerCounter:
    """What every server-side counter shares: the session, the URL, the served model, and one JSON POST."""

    name = "server"

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str | None = None):
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.model = model

    async def _request(self, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
        try:
            async with self.session.post(self.base_url + path, json=payload,
                                         timeout=aiohttp.ClientTimeout(total=60)) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UserError(f"{self.base_url}{path} failed: {type(exc).__name__}: {exc}") from None

    def _object(self, path: str, status: int, raw: bytes) -> dict[str, Any]:
        if status != 200:
            raise UserError(f"{self.base_url}{path} answered HTTP {status}: "
                            f"{raw[:160].decode('utf-8', 'replace')}")
        try:
            body = json.loads(raw)
        except ValueError:
            raise UserError(f"{self.base_url}{path} did not answer JSON") from None
        if not isinstance(body, dict):
            raise UserError(f"{self.base_url}{path} answered {type(body).__name__}, not an object")
        return body

    async def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        return self._object(path, *await self._request(path, payload))

    def _with_model(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"model": self.model, **payload} if self.model else payload

    def _count(self, path: str, body: dict[str, Any]) -> int:
        """vLLM's and SGLang's TokenizeResponse: `count`, with `tokens` beside it."""
        count, tokens = body.get("count"), body.get("tokens")
        if isinstance(count, int) and not isinstance(count, bool):
            return count
        if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
            return len(tokens)
        raise UserError(f"{self.base_url}{path} answered without a token count: {str(body)[:120]}")


class LlamaCppPromptCounter(ServerCounter):
    """llama.cpp's server: /apply-template, then /tokenize."""

    name = "server:llama.cpp /apply-template + /tokenize"

    async def count_prompt_tokens(self, messages_or_prompt: str | Messages) -> int:
        if isinstance(messages_or_prompt, list):
            templated = await self._post(LLAMA_CPP_APPLY_TEMPLATE, {"messages": messages_or_prompt})
            prompt = templated.get("prompt")
            if not isinstance(prompt, str):
                raise UserError(f"{self.base_url}{LLAMA_CPP_APPLY_TEMPLATE} answered without a prompt: "
                                f"{str(templated)[:120]}")
            return await self._tokens(prompt, special=True)
        return await self._tokens(messages_or_prompt, special=True)

    async def count_text_tokens(self, text: str) -> int:
        return await self._tokens(text, special=False)

    async def _tokens(self, text: str, *, special: bool) -> int:
        path = ENDPOINTS["llama.cpp"].path
        body = await self._post(path, {"content": text, "add_special": special, "parse_special": special})
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise UserError(f"{self.base_url}{path} answered without tokens: {str(body)[:120]}")
        return len(tokens)


class VLLMPromptCounter(ServerCounter):
    """vLLM's `POST /tokenize`, with the chat endpoint's defaults for messages and the completions endpoint's for a
    prompt."""

    name = "server:vLLM /tokenize (messages with add_generation_prompt, no extra special tokens)"
    path = ENDPOINTS["vllm"].path

    async def count_prompt_tokens(self, messages_or_prompt: str | Messages) -> int:
        if isinstance(messages_or_prompt, list):
            payload = {"messages": messages_or_prompt, "add_generation_prompt": True, "add_special_tokens": False}
        else:
            payload = {"prompt": messages_or_prompt, "add_special_tokens": True}
        return self._count(self.path, await self._post(self.path, self._with_model(payload)))

    async def count_text_tokens(self, text: str) -> int:
        payload = self._with_model({"prompt": text, "add_special_tokens": False})
        return self._count(self.path, await self._post(self.path, payload))


class UsagePromptCounter(ServerCounter):
    """The fallback for any OpenAI server that reports usage: ask for one token and read `usage.prompt_tokens`.

    Exact by definition for prompts (the server counts the very prompt it will see), at the cost of a prefill per
    count, which may leave the counted prompts in the server's prefix cache. A bare text's length (an answer, for
    --output-from-dataset) has no endpoint of its own here: it is the completions count minus the special tokens
    the server adds to every prompt, measured once as 2·c(" hello") − c(" hello hello"); exact wherever the
    tokenizer splits on spaces (BPE), possibly one off for SentencePiece tokenizers with a dummy prefix."""

    name = ("usage.prompt_tokens of a max_tokens=1 request (fallback: exact, but every count prefills the prompt "
            "on the server)")

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str | None = None):
        super().__init__(session, base_url, model)
        self._specials: int | None = None

    async def count_prompt_tokens(self, messages_or_prompt: str | Messages) -> int:
        payload: dict[str, Any] = {"model": await self._served_model(), "max_tokens": 1, "temperature": 0,
                                   "stream": False}
        if isinstance(messages_or_prompt, list):
            path, payload["messages"] = "/v1/chat/completions", messages_or_prompt
        else:
            path, payload["prompt"] = "/v1/completions", messages_or_prompt
        body = await self._post(path, payload)
        usage = body.get("usage")
        count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if not isinstance(count, int) or isinstance(count, bool):
            raise UserError(f"{self.base_url}{path} answered without usage.prompt_tokens: {str(body)[:120]}",
                            hint="exact input lengths need a server that reports usage or has a tokenize endpoint")
        return count

    async def count_text_tokens(self, text: str) -> int:
        if self._specials is None:
            one = await self.count_prompt_tokens(" hello")
            two = await self.count_prompt_tokens(" hello hello")
            self._specials = max(0, 2 * one - two)
        return max(0, await self.count_prompt_tokens(text) - self._specials)

    async def _served_model(self) -> str:
        if self.model:
            return self.model
        try:
            async with self.session.get(self.base_url + "/v1/models", timeout=aiohttp.ClientTimeout(total=30)) \
                    as resp:
                body = json.loads(await resp.read())
            self.model = str(body["data"][0]["id"])
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError, TypeError):
            raise UserError(f"{self.base_url}/v1/models names no model to count prompts with",
                            hint="pass --model") from None
        return self.model


class SGLangPromptCounter(ServerCounter):
    """SGLang's `POST /v1/tokenize`: messages through its chat template where the server takes them, else (an older
    SGLang whose TokenizeRequest requires `prompt`) messages are counted by the usage fallback."""

    name = ("server:SGLang /v1/tokenize (messages through its chat template; on an SGLang whose /v1/tokenize takes "
            "only a prompt: usage.prompt_tokens of a max_tokens=1 chat request)")
    path = ENDPOINTS["sglang"].path

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str | None = None):
        super().__init__(session, base_url, model)
        self.chat_tokenize: bool | None = None  # None until the server has said whether it takes messages
        self.fallback = UsagePromptCounter(session, base_url, model)

    async def count_prompt_tokens(self, messages_or_prompt: str | Messages) -> int:
        if not isinstance(messages_or_prompt, list):
            payload = self._with_model({"prompt": messages_or_prompt, "add_special_tokens": True})
            return self._count(self.path, await self._post(self.path, payload))
        if self.chat_tokenize is not False:
            status, raw = await self._request(self.path, self._with_model({"messages": messages_or_prompt}))
            if status == 200:
                self.chat_tokenize = True
                return self._count(self.path, self._object(self.path, status, raw))
            # The older request model: `prompt` is a required field, so a messages-only body fails validation.
            if self.chat_tokenize is None and status in (400, 422) and b"prompt" in raw:
                self.chat_tokenize = False
            else:
                self._object(self.path, status, raw)  # raises, quoting the answer
        return await self.fallback.count_prompt_tokens(messages_or_prompt)

    async def count_text_tokens(self, text: str) -> int:
        payload = self._with_model({"prompt": text, "add_special_tokens": False})
        return self._count(self.path, await self._post(self.path, payload))


# The counter for each tokenize endpoint that applies the chat template (protocol/tokenize.py). Which engine has
# which is the adapter's `tokenize_api`; the replays answer their engine's endpoint (engines/replay_http.py).
COUNTER_BY_API: dict[str, type[ServerCounter]] = {
    "llama.cpp": LlamaCppPromptCounter,
    "vllm": VLLMPromptCounter,
    "sglang": SGLangPromptCounter,
}


def counter_class(adapter: type[EngineAdapter] | EngineAdapter) -> type[ServerCounter] | None:
    """The counter for an engine: its chat-template tokenize endpoint's, else the usage fallback where the engine
    reports usage (TGI, llama-cpp-python, transformers serve), else None."""
    api = adapter.tokenize_api
    if api in COUNTER_BY_API:
        return COUNTER_BY_API[api]
    return UsagePromptCounter if adapter.counts_prompts_by_usage else None


# Engine name (engines/ registry) -> counter class. Engines missing here cannot give exact synthetic lengths.
COUNTERS: dict[str, type[ServerCounter]] = {
    name: cls for name, adapter in REGISTRY.items() if (cls := counter_class(adapter)) is not None}


def counter_for(engine: str | None, session: aiohttp.ClientSession, base_url: str, model: str | None = None
                ) -> PromptTokenCounter | None:
    """The counter for a detected engine (None for an unknown server: it is not known what counting costs there).
    `model`: the served model the run's requests name (the usage fallback needs one; /v1/models' first if None)."""
    cls = COUNTERS.get(engine or "")
    return cls(session, base_url, model) if cls else None
