"""Non-streamed workloads: embeddings (`POST /v1/embeddings`) and rerank (`/v1/rerank`, `/rerank`, `/v1/score` or
`/score`, whichever the server serves), sent and checked by bench/unary_client.py (docs/workloads.md#non-streamed).

Each request carries `batch` inputs (embeddings) or `documents` documents and one query (rerank). With
`input_tokens` every input or document is a synthetic text of that many tokens (synthetic.py's opener and filler
words, counted as a completions prompt by the server's tokenizer, special tokens included, checked on sample
texts before the run); without it each is a text of TEXT_WORDS common words whose length is not counted. Texts
differ by bench, request and item (the seed, the bench's `series` from pipeline.in_series, the request number and
the item's place), so no two are the same: trial 2 and the sweep do not resend trial 1's texts, which a server's
prefix cache (or any cache of answers) would serve.

`probe_endpoint` runs once before the run, untimed: one small request that finds the path serving the endpoint
(rerank: the first of RERANK_ATTEMPTS that answers 2xx with scores) and, for embeddings, the dimension every
answer of the run must have. A server that serves none says so in one line before anything is timed.

Engines name rerank differently: llama.cpp (`--reranking`) and vLLM serve `/v1/rerank` and `/rerank` with
{"query", "documents"} and answer {"results": [{"index", "relevance_score"}]}; SGLang serves `/v1/rerank` and
answers a bare list of {"index", "score"}; vLLM's `/v1/score` and `/score` take {"text_1", "text_2"} and answer
{"data": [{"index", "score"}]} (as verify/checks/rerank.py reads them).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from servelab.bench.client import RequestSpec
from servelab.bench.unary_client import WrongAnswer, check_embeddings, check_scores
from servelab.bench.workloads.base import COMPLETIONS
from servelab.bench.workloads.filler import CANDIDATES
from servelab.bench.workloads.lengths import LengthSpec
from servelab.bench.workloads.prompt_tokens import PromptTokenCounter
from servelab.bench.workloads.synthetic import SyntheticWorkload
from servelab.errors import UserError
from servelab.protocol.chunks import error_message

EMBEDDINGS = "/v1/embeddings"
RERANK_QUERY = "Which of these passages is about water and the sea?"
RERANK_ATTEMPTS = (("/v1/rerank", "rerank"), ("/rerank", "rerank"), ("/v1/score", "score"), ("/score", "score"))
TEXT_WORDS = 48  # an input's length without --input-tokens, in words
PROBE_TIMEOUT_S = 60.0
_WORDS = 160


@dataclass
class _Texts:
    """The inputs or documents: exact lengths through a SyntheticWorkload (measured as completions prompts), or
    plain word texts."""

    input_tokens: LengthSpec | None
    seed: int
    series: str = ""  # which bench of a run: part of every text's seed, so each bench sends texts of its own
    synthetic: SyntheticWorkload | None = None

    @property
    def text_seed(self) -> int:
        """The seed itself without a series (the same texts as before series existed); with one, a number that
        follows from both, for the SyntheticWorkload underneath, whose seed is an int."""
        if not self.series:
            return self.seed
        return int.from_bytes(hashlib.sha256(f"{self.seed}:{self.series}".encode()).digest()[:8], "big")

    async def prepare(self, counter: PromptTokenCounter | None) -> None:
        if self.input_tokens is None:
            return
        self.synthetic = SyntheticWorkload(input_tokens=self.input_tokens, endpoint=COMPLETIONS,
                                           seed=self.text_seed)
        await self.synthetic.prepare(counter)

    def text(self, item: int) -> str:
        if self.synthetic is not None:
            return self.synthetic.text(item)
        rng = random.Random(f"{self.text_seed}:unary:{item}")
        return " ".join(rng.choice(CANDIDATES) for _ in range(TEXT_WORDS)).capitalize() + "."

    def length(self, item: int) -> int | None:
        return self.synthetic.length(item) if self.synthetic is not None else None

    def describe(self) -> dict[str, Any]:
        if self.synthetic is None:
            return {"input_tokens": None, "texts": f"{TEXT_WORDS} common words each, length not counted"}
        return {"input_tokens": self.input_tokens.describe() if self.input_tokens else None,
                "texts": f"synthetic texts of exact length, counted by {self.synthetic.counter_name} as a prompt "
                         f"(special tokens included); {self.synthetic.checked} sample texts checked before the run",
                "input_tokens_min": self.synthetic.minimum}


@dataclass
class EmbeddingsWorkload:
    batch: int = 1
    input_tokens: LengthSpec | None = None
    seed: int = 0
    endpoint: str = EMBEDDINGS
    dimension: int | None = None  # what the probe's answer had: every answer of the run must have it
    series: str = ""  # which bench of a run (pipeline.in_series): the texts differ by it
    texts: _Texts = field(init=False, repr=False)

    kind = "embeddings"

    def __post_init__(self) -> None:
        self.texts = _Texts(self.input_tokens, self.seed, self.series)

    async def prepare(self, counter: PromptTokenCounter | None, needed: int | None = None) -> None:
        await self.texts.prepare(counter)

    async def probe_endpoint(self, session: aiohttp.ClientSession, base_url: str, model: str | None) -> None:
        status, answer, words = await _post(session, base_url, EMBEDDINGS, self._body(model, [self.texts.text(0)]))
        if not 200 <= status < 300:
            raise UserError(f"the server does not serve embeddings at {EMBEDDINGS}: HTTP {status}: {words}",
                            hint="llama.cpp needs --embeddings and a model with pooling; vLLM and SGLang an "
                                 "embedding model")
        try:
            self.dimension = check_embeddings(answer, 1, None)
        except WrongAnswer as exc:
            raise UserError(f"{EMBEDDINGS} answered, but not with an embedding: {exc.detail}") from None

    def _body(self, model: str | None, inputs: list[str]) -> dict[str, Any]:
        return {"model": model, "input": inputs, "encoding_format": "float"}

    def request(self, index: int, model: str, *, tag: str = "", warmup: bool = False,
                accepts_ignore_eos: bool = False, accepts_min_tokens: bool = False) -> RequestSpec:
        items = range(index * self.batch, (index + 1) * self.batch)
        lengths = [self.texts.length(i) for i in items]
        return RequestSpec(endpoint=self.endpoint, body=self._body(model, [self.texts.text(i) for i in items]),
                           index=index, tag=tag, warmup=warmup,
                           input_tokens=sum(lengths) if None not in lengths else None,  # type: ignore[arg-type]
                           expect={"kind": "embeddings", "items": self.batch, "dimension": self.dimension})

    def describe(self, accepts_ignore_eos: bool, accepts_min_tokens: bool = False) -> dict[str, Any]:
        return {"kind": self.kind, "endpoint": self.endpoint, "stream": False, "batch_size": self.batch,
                "dimension": self.dimension, "seed": self.seed, **self.texts.describe()}


@dataclass
class RerankWorkload:
    documents: int = 8
    input_tokens: LengthSpec | None = None
    seed: int = 0
    endpoint: str = RERANK_ATTEMPTS[0][0]
    shape: str = "rerank"  # "rerank" ({"query", "documents"}) or "score" ({"text_1", "text_2"})
    tried: list[str] = field(default_factory=list)
    series: str = ""  # which bench of a run (pipeline.in_series): the texts differ by it
    texts: _Texts = field(init=False, repr=False)

    kind = "rerank"

    def __post_init__(self) -> None:
        self.texts = _Texts(self.input_tokens, self.seed, self.series)

    async def prepare(self, counter: PromptTokenCounter | None, needed: int | None = None) -> None:
        await self.texts.prepare(counter)

    async def probe_endpoint(self, session: aiohttp.ClientSession, base_url: str, model: str | None) -> None:
        documents = [self.texts.text(i) for i in range(2)]
        self.tried = []
        for path, shape in RERANK_ATTEMPTS:
            status, answer, words = await _post(session, base_url, path, self._body(model, shape, documents))
            if 200 <= status < 300:
                try:
                    check_scores(answer, len(documents))
                except WrongAnswer as exc:  # a 2xx without scores: the next path may serve rerank
                    self.tried.append(f"{path} HTTP {status} ({exc.detail})")
                    continue
                self.endpoint, self.shape = path, shape
                return
            self.tried.append(f"{path} HTTP {status}" + ("" if status in (404, 405) else f" ({words[:120]})"))
        raise UserError(f"the server serves no rerank endpoint: {'; '.join(self.tried)}",
                        hint="llama.cpp needs --reranking and a reranker model; vLLM a scoring or embedding model")

    def _body(self, model: str | None, shape: str, documents: list[str]) -> dict[str, Any]:
        if shape == "score":
            return {"model": model, "text_1": RERANK_QUERY, "text_2": documents}
        return {"model": model, "query": RERANK_QUERY, "documents": documents}

    def request(self, index: int, model: str, *, tag: str = "", warmup: bool = False,
                accepts_ignore_eos: bool = False, accepts_min_tokens: bool = False) -> RequestSpec:
        documents = [self.texts.text(i) for i in range(index * self.documents, (index + 1) * self.documents)]
        return RequestSpec(endpoint=self.endpoint, body=self._body(model, self.shape, documents), index=index,
                           tag=tag, warmup=warmup, expect={"kind": "rerank", "items": self.documents})

    def describe(self, accepts_ignore_eos: bool, accepts_min_tokens: bool = False) -> dict[str, Any]:
        return {"kind": self.kind, "endpoint": self.endpoint, "stream": False, "request_shape": self.shape,
                "documents": self.documents, "query": RERANK_QUERY, "seed": self.seed,
                "endpoints_tried_before": list(self.tried), **self.texts.describe()}


async def _post(session: aiohttp.ClientSession, base_url: str, path: str, body: dict[str, Any]
                ) -> tuple[int, Any, str]:
    """(status, parsed JSON or None, the server's words) of one untimed request before the run."""
    try:
        async with session.post(base_url.rstrip("/") + path, json=body,
                                timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as resp:
            status, raw = resp.status, await resp.content.read(64 << 20)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise UserError(f"{base_url}{path} failed: {type(exc).__name__}: {exc}") from None
    try:
        answer = json.loads(raw)
    except ValueError:
        return status, None, " ".join(raw[:_WORDS].decode("utf-8", "replace").split()) or "no body"
    words = error_message(answer["error"]) if isinstance(answer, dict) and "error" in answer else \
        " ".join(raw[:_WORDS].decode("utf-8", "replace").split())
    return status, answer, words[:_WORDS]


UNARY_ENDPOINTS = ("embeddings", "rerank")
# Conversations and traces are chat; every other mode runs non-streamed work too (the ladders climb on items/s)
UNARY_MODES = ("single", "concurrency", "rate", "burst", "sweep", "rate-sweep", "slo-search")
MAX_ITEMS = 4096  # inputs or documents per request: more than any engine batches at once


def build_unary_workload(a: Any) -> EmbeddingsWorkload | RerankWorkload:
    """The workload of `--endpoint embeddings|rerank` from bench's options (bench/args.py BenchArgs), every
    option that does not apply to it refused in one line."""
    from servelab.bench.slo import parse_slos
    from servelab.bench.workloads.lengths import parse_length

    endpoint = a.endpoint
    if endpoint not in UNARY_ENDPOINTS:
        given = "--batch-size" if a.batch_size is not None else "--documents"
        raise UserError(f"{given} applies to --endpoint {'embeddings' if given == '--batch-size' else 'rerank'}")
    if a.mode not in UNARY_MODES:
        raise UserError(f"--endpoint {endpoint} runs in --mode {', '.join(UNARY_MODES[:-1])} or {UNARY_MODES[-1]}, "
                        f"not {a.mode}: conversations and traces are chat")
    if endpoint == "embeddings" and a.documents is not None:
        raise UserError("--documents applies to --endpoint rerank (embeddings: --batch-size)")
    if endpoint == "rerank" and a.batch_size is not None:
        raise UserError("--batch-size applies to --endpoint embeddings (rerank: --documents)")
    for name, given in (("dataset", a.dataset is not None), ("prefix-groups", a.prefix_groups is not None),
                        ("prefix-tokens", a.prefix_tokens is not None), ("min-tokens", a.min_tokens is not None),
                        ("output-from-dataset", a.output_from_dataset),
                        ("images", getattr(a, "images", None) is not None)):
        if given:
            raise UserError(f"--{name} does not apply to --endpoint {endpoint}")
    for slo in parse_slos(a.slo):
        if slo.quantity != "e2e":
            raise UserError(f"--slo {slo.key} does not apply to --endpoint {endpoint}: a non-streamed request has "
                            f"no tokens to time, only its latency (e2e_*_ms)")
    count = a.batch_size if endpoint == "embeddings" else a.documents
    if count is not None and not 0 < count <= MAX_ITEMS:
        flag = "--batch-size" if endpoint == "embeddings" else "--documents"
        raise UserError(f"{flag} must be between 1 and {MAX_ITEMS:,}")
    lengths = parse_length(a.input_tokens) if a.input_tokens is not None else None
    if endpoint == "embeddings":
        return EmbeddingsWorkload(batch=count or 1, input_tokens=lengths, seed=a.seed)
    return RerankWorkload(documents=count or 8, input_tokens=lengths, seed=a.seed)
