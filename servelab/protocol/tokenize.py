"""The servers' token-count endpoints: where each family answers and how its answer gives a count.

Which engine has which endpoint is the engine's own fact (`EngineAdapter.tokenize_api`, engines/base.py); what a
client asks each endpoint depends on its question and lives with it: prompt counts after the chat template
(bench/workloads/prompt_tokens.py), an answer's length for verify's usage check (verify/checks/usage.py), token
boundaries with llama.cpp's pieces (bench/tokenizer.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

TokenizeAPI = Literal["llama.cpp", "vllm", "sglang", "llama-cpp-python"]


@dataclass(frozen=True)
class TokenizeEndpoint:
    api: TokenizeAPI
    path: str  # POST
    title: str  # how messages name it: "llama.cpp /tokenize"


ENDPOINTS: dict[TokenizeAPI, TokenizeEndpoint] = {
    # {"content", "add_special", "parse_special" (default true), "with_pieces"} -> {"tokens": [id | {id, piece}]}
    "llama.cpp": TokenizeEndpoint("llama.cpp", "/tokenize", "llama.cpp /tokenize"),
    # a TokenizeCompletionRequest {"prompt", "add_special_tokens"} or a TokenizeChatRequest {"messages", ...}
    # -> {"count", "max_model_len", "tokens"}
    "vllm": TokenizeEndpoint("vllm", "/tokenize", "vLLM /tokenize"),
    # exactly one of {"prompt", "add_special_tokens"} or {"messages", ...} (older SGLang: prompt only)
    # -> {"tokens", "count", "max_model_len"}; also served, hidden from the schema, at /tokenize
    "sglang": TokenizeEndpoint("sglang", "/v1/tokenize", "SGLang /v1/tokenize"),
    # {"input"} -> {"tokens"}: the bare text, special tokens added its own way, no chat template
    "llama-cpp-python": TokenizeEndpoint("llama-cpp-python", "/extras/tokenize", "llama-cpp-python /extras/tokenize"),
}

# llama.cpp renders chat messages through the served model's template: {"messages"} -> {"prompt"}
LLAMA_CPP_APPLY_TEMPLATE = "/apply-template"


def token_count(body: Any) -> int | None:
    """The count in a tokenize answer: its `tokens` list's length, else an integer `count`; None when neither."""
    if isinstance(body, dict):
        if isinstance(body.get("tokens"), list):
            return len(body["tokens"])
        if isinstance(body.get("count"), int) and not isinstance(body["count"], bool):
            return body["count"]
    return None
