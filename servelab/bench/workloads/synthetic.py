"""Synthetic prompts of exact input lengths, measured after the chat template by the server's own tokenizer.

Prompt i is OPENER + k single-token filler words (filler.py), with k = length(i) - overhead, where overhead is
the templated opener's length and length(i) is drawn from the length distribution. Words are drawn from an RNG
seeded with (seed, i): prompts differ from their first filler word on, so prefix caching shares only the
template and the opener, and the same seed gives the same prompts.

`prepare` asks the server's tokenizer (workloads/prompt_tokens.py) which words are single tokens, measures the
overhead, and checks a sample of whole prompts; after the run, metrics compares every request's `input_tokens`
with the server's `usage.prompt_tokens`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from servelab.bench.client import RequestSpec
from servelab.bench.workloads.base import CHAT, OutputSpec, build_body, chat_or_prompt
from servelab.bench.workloads.filler import OPENER, filler, single_token_words
from servelab.bench.workloads.lengths import LengthSpec, parse_length
from servelab.bench.workloads.prompt_tokens import PromptTokenCounter
from servelab.errors import UserError

SAMPLE_CHECKS = 8  # whole prompts counted by the server before the run


@dataclass
class SyntheticWorkload:
    input_tokens: LengthSpec = field(default_factory=lambda: parse_length(256))
    endpoint: str = CHAT
    output: OutputSpec = field(default_factory=OutputSpec)
    seed: int = 0
    # Filled by prepare():
    words: list[str] = field(default_factory=list, repr=False)
    overhead: int | None = None  # tokens of the templated opener alone
    counter_name: str | None = None
    checked: int = 0

    kind = "synthetic"

    # ---- preparing ----
    async def prepare(self, counter: PromptTokenCounter | None, needed: int | None = None) -> None:
        if counter is None:
            raise UserError("exact synthetic input lengths need the server's tokenizer, and servelab knows no "
                            "tokenize endpoint for this server",
                            hint="run against an engine servelab recognises (llama.cpp, vLLM, SGLang, TGI, "
                                 "llama-cpp-python), or use --dataset, or leave --input-tokens unset")
        self.counter_name = counter.name
        self.words = await single_token_words(counter)
        self.overhead = await counter.count_prompt_tokens(chat_or_prompt(self.endpoint, OPENER))
        largest = self.input_tokens.bounds[1]  # shorter draws are raised to the minimum; none at all is an error
        if largest is not None and largest < self.minimum:
            raise UserError(f"input length {self.input_tokens.describe()} is below this workload's minimum of "
                            f"{self.minimum} tokens ({self.minimum_why})")
        for i in range(SAMPLE_CHECKS):
            want = self.length(i)
            got = await counter.count_prompt_tokens(chat_or_prompt(self.endpoint, self.text(i)))
            if got != want:
                raise UserError(f"a synthetic prompt built to be {want} tokens is {got} tokens for the server's "
                                f"tokenizer ({counter.name}): this tokenizer does not count filler words one "
                                f"token each", hint="use --dataset instead of exact synthetic lengths")
        self.checked = SAMPLE_CHECKS

    # ---- building requests (cheap, synchronous: called in the sender's hot path) ----
    @property
    def minimum(self) -> int:
        """The shortest prompt possible: the templated opener and one distinct word."""
        return self._need_overhead() + 1

    @property
    def minimum_why(self) -> str:
        return f"the chat template and opener take {self.overhead}, plus one distinct word"

    def length(self, index: int) -> int:
        return max(self.input_tokens.draw(self.seed, index), self.minimum)

    def text(self, index: int) -> str:
        rng = random.Random(f"{self.seed}:words:{index}")
        return OPENER + filler(self.words, rng, self.length(index) - self._need_overhead())

    def request(self, index: int, model: str, *, tag: str = "", warmup: bool = False,
                accepts_ignore_eos: bool = False, accepts_min_tokens: bool = False) -> RequestSpec:
        body = build_body(model, self.endpoint, chat_or_prompt(self.endpoint, self.text(index)), self.output,
                          accepts_ignore_eos=accepts_ignore_eos, accepts_min_tokens=accepts_min_tokens)
        return RequestSpec(endpoint=self.endpoint, body=body, index=index, tag=tag, warmup=warmup,
                           input_tokens=self.length(index))

    def describe(self, accepts_ignore_eos: bool, accepts_min_tokens: bool = False) -> dict[str, Any]:
        return {"kind": self.kind, "endpoint": self.endpoint,
                **self.output.describe(accepts_ignore_eos, accepts_min_tokens),
                "input_tokens": self.input_tokens.describe(), "input_tokens_min": self.minimum
                if self.overhead is not None else None, "seed": self.seed,
                "prompts": f"'{OPENER}' + single-token filler words drawn per request; lengths after the chat "
                           f"template, counted by {self.counter_name}; {self.checked} sample prompts checked "
                           f"before the run, every request against usage.prompt_tokens after it",
                "template_overhead_tokens": self.overhead}

    def _need_overhead(self) -> int:
        if self.overhead is None:
            raise RuntimeError("SyntheticWorkload.prepare() must run before requests are built")
        return self.overhead
