"""Client-side token counting for streams whose server gives no per-chunk counts.

A tokenizer here answers one question: where, in a text, does each token end (character offsets)? With that,
the tokens of a whole answer are assigned to the events that delivered them: a token belongs to the event in
which its last character arrived. The text is tokenized once, whole, after the run, never chunk by chunk
(re-tokenizing each chunk splits words that span chunks and adds a BOS per chunk; inference-perf #564).

Sources, in the order `auto` tries them:
- the server's own tokenizer endpoint (llama.cpp `POST /tokenize` with pieces): exact for the served model, no
  local files needed;
- a Hugging Face `tokenizer.json` (or a folder holding one) through the `tokenizers` library, if installed;
- `calibration`: the calibration server's self-delimiting token texts.
The end-of-sequence token never appears as text, so a client count is one below the server's usage when a
request stopped on EOS; metrics knows this and does not flag it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import aiohttp

from servelab.errors import UserError
from servelab.protocol.tokenize import ENDPOINTS

LLAMA_CPP_TOKENIZE = ENDPOINTS["llama.cpp"]


class Tokenizer(Protocol):
    name: str

    async def token_ends(self, texts: Sequence[str]) -> list[list[int]]:
        """For each text, the character offset at which each of its tokens ends (ascending)."""
        ...


@dataclass
class RegexTokenizer:
    """Tokens are the matches of a pattern (the calibration server's " a12" / " r3" texts)."""

    pattern: str
    name: str = "regex"

    async def token_ends(self, texts: Sequence[str]) -> list[list[int]]:
        rx = re.compile(self.pattern)
        return [[m.end() for m in rx.finditer(t)] for t in texts]


def calibration_tokenizer() -> RegexTokenizer:
    return RegexTokenizer(pattern=r" [ar]\d+(?:é🙂)?", name="calibration")


@dataclass
class HFTokenizer:
    """A Hugging Face tokenizer.json, through the `tokenizers` library (optional dependency)."""

    path: Path
    name: str = "hf"

    def __post_init__(self) -> None:
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError:
            raise UserError("a tokenizer file was given but the `tokenizers` package is not installed",
                            hint="pip install tokenizers") from None
        file = self.path / "tokenizer.json" if self.path.is_dir() else self.path
        if not file.is_file():
            raise UserError(f"tokenizer not found: {file}",
                            hint="give a tokenizer.json, a folder that has one, 'server', or 'none'")
        try:
            self._tok = _HF.from_file(str(file))
        except Exception as exc:  # the library raises a bare Exception for a malformed file
            raise UserError(f"cannot load tokenizer {file}: {exc}") from None
        self.name = f"hf:{file}"

    async def token_ends(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [[end for _, end in enc.offsets] for enc in encodings]


@dataclass
class LlamaCppServerTokenizer:
    """llama.cpp's `POST /tokenize {"content": ..., "with_pieces": true}`: the served model's own tokenizer."""

    base_url: str
    name: str = "server:llama.cpp /tokenize"
    api_key: str | None = field(default=None, repr=False)  # a bearer token, as on every request to the server

    async def token_ends(self, texts: Sequence[str]) -> list[list[int]]:
        out: list[list[int]] = []
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60), headers=headers) as session:
            for text in texts:
                if not text:
                    out.append([])
                    continue
                async with session.post(self.base_url + LLAMA_CPP_TOKENIZE.path,
                                        json={"content": text, "with_pieces": True,
                                              "add_special": False}) as resp:
                    body = json.loads(await resp.read())
                out.append(_ends_from_pieces(text, body.get("tokens", [])))
        return out


def _ends_from_pieces(text: str, tokens: list) -> list[int]:
    """Character end offsets from llama.cpp pieces. A piece that is not valid UTF-8 on its own (part of a
    multi-byte character) arrives as a list of byte values; bytes are accumulated and decoded as they complete."""
    ends: list[int] = []
    raw = b""
    for tok in tokens:
        piece = tok.get("piece", "") if isinstance(tok, dict) else ""
        raw += bytes(piece) if isinstance(piece, list) else str(piece).encode()
        ends.append(len(raw.decode("utf-8", "ignore")))
    # Guard against a tokenizer that normalises text (the offsets would no longer address `text`).
    return [min(e, len(text)) for e in ends]


PROBE_TIMEOUT_S = 10.0  # a server that never answers the probe is one without the endpoint, not a reason to wait


async def probe_server_tokenizer(session: aiohttp.ClientSession, base_url: str,
                                 timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the server offers llama.cpp's /tokenize with pieces (no answer within `timeout_s`: it does not)."""
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(base_url + LLAMA_CPP_TOKENIZE.path, json={"content": "a b", "with_pieces": True}
                                    ) as resp:
                if resp.status != 200:
                    return False
                body = json.loads(await resp.read())
    except (aiohttp.ClientError, ValueError, TimeoutError):
        return False
    tokens = body.get("tokens") if isinstance(body, dict) else None
    return bool(tokens) and isinstance(tokens[0], dict) and "piece" in tokens[0]


def tokenizer_from_option(option: str, base_url: str, api_key: str | None = None) -> Tokenizer | None:
    """`--tokenizer` values other than auto: none, server, calibration, or a path."""
    if option == "none":
        return None
    if option == "server":
        return LlamaCppServerTokenizer(base_url, api_key=api_key)
    if option == "calibration":
        return calibration_tokenizer()
    path = Path(option).expanduser()
    if not path.exists():
        raise UserError(f"unknown tokenizer '{option}'",
                        hint="use auto, server, none, calibration, or a path to a tokenizer.json")
    return HFTokenizer(path)
