"""What the benchmark sends: prompts, output length and sampling, described so a run can be compared to another.

The default workload is chat requests with distinct prompts (a unique opening line defeats prefix caching, which
would otherwise turn every TTFT after the first into a cache hit), greedy sampling, a fixed output length, and
`ignore_eos` where the engine accepts it so every request generates exactly `max_tokens` tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from servelab.bench.client import RequestSpec

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

    def request(self, index: int, model: str, *, tag: str = "", warmup: bool = False,
                accepts_ignore_eos: bool = False) -> RequestSpec:
        topic = _TOPICS[index % len(_TOPICS)]
        prompt = (f"Story number {index}. Write a long, detailed story about {topic}. "
                  f"Describe every scene carefully. Once upon a time,")
        body: dict[str, Any] = {"model": model, "max_tokens": self.max_tokens, "temperature": self.temperature}
        if self.endpoint.endswith("/chat/completions"):
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if self.ignore_eos and accepts_ignore_eos:
            body["ignore_eos"] = True
        return RequestSpec(endpoint=self.endpoint, body=body, index=index, tag=tag, warmup=warmup)

    def describe(self, accepts_ignore_eos: bool) -> dict[str, Any]:
        d = asdict(self)
        d["ignore_eos"] = self.ignore_eos and accepts_ignore_eos
        d["prompts"] = "synthetic: distinct story prompts (~25 words), chat template applied by the server"
        return d
