"""The default workload: chat requests with distinct story prompts, greedy, a fixed output length.

A unique opening line defeats prefix caching of the prompt itself (the chat template's system prompt is shared
and may still be cached), which would otherwise turn every TTFT after the first into a cache hit. Within a bench
the request number makes it unique; across benches against one server (an experiment's trials, the sweep after
the single-stream step) `series` does: without it trial 2 resent trial 1's prompts, whose TTFT was then a cache
hit. `ignore_eos` (where the engine accepts it) makes every request generate exactly `max_tokens` tokens.
Prompt lengths are not controlled (~25 words); use SyntheticWorkload for exact input lengths.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from servelab.bench.client import RequestSpec
from servelab.bench.workloads.base import OutputSpec, build_body
from servelab.bench.workloads.prompt_tokens import PromptTokenCounter

_TOPICS = [
    "a robot who learns to paint", "a lighthouse keeper and a storm", "a city built on the back of a whale",
    "a chess match that lasts a century", "a baker who can taste memories", "the last train across a desert",
    "a librarian who catalogues dreams", "two rival clockmakers", "a garden that grows on the moon",
    "a translator for birds", "a map that redraws itself", "an orchestra of machines",
]


@dataclass(frozen=True)
class Workload:
    endpoint: str = "/v1/chat/completions"
    max_tokens: int = 128
    temperature: float = 0.0
    ignore_eos: bool = True  # asks for exactly max_tokens tokens; sent only to engines that accept it
    # Numbers the prompts of one bench apart from another's on the same server (pipeline: the trial's index and
    # the step, the same for every cell of a round, so cells see the same prompts; a rerun of a contended trial
    # has an index of its own, so it never resends the prompts its server already answered); "": the plain number.
    series: str = ""

    kind = "stories"

    async def prepare(self, counter: PromptTokenCounter | None, needed: int | None = None) -> None:
        """Nothing to prepare: prompts are built from the request number alone."""

    def request(self, index: int, model: str, *, tag: str = "", warmup: bool = False,
                accepts_ignore_eos: bool = False, accepts_min_tokens: bool = False) -> RequestSpec:
        topic = _TOPICS[index % len(_TOPICS)]
        number = f"{self.series}-{index}" if self.series else str(index)
        prompt = (f"Story number {number}. Write a long, detailed story about {topic}. "
                  f"Describe every scene carefully. Once upon a time,")
        output = OutputSpec(max_tokens=self.max_tokens, ignore_eos=self.ignore_eos, temperature=self.temperature)
        body = build_body(model, self.endpoint, prompt, output, accepts_ignore_eos=accepts_ignore_eos)
        return RequestSpec(endpoint=self.endpoint, body=body, index=index, tag=tag, warmup=warmup)

    def describe(self, accepts_ignore_eos: bool, accepts_min_tokens: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d.pop("series")  # which bench of a run, not what the workload is
        d["ignore_eos"] = self.ignore_eos and accepts_ignore_eos
        d["prompts"] = "synthetic: distinct story prompts (~25 words), chat template applied by the server"
        return d
