"""Prompts from a file (ShareGPT JSON, JSONL): the items, and the workload that sends them in order.

Items are sent in file order (or shuffled with the seed), request i taking item i mod n, so a run longer than the
file repeats prompts (and a prefix cache will notice: `describe()` says how many distinct items there were).
With the server's tokenizer, `prepare` counts each item's prompt after the chat template (recorded as
`input_tokens`, checked against `usage.prompt_tokens` after the run) and, when output lengths come from the
dataset, the reference answer's tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.bench.client import RequestSpec
from servelab.bench.workloads.base import CHAT, Messages, OutputSpec, build_body
from servelab.bench.workloads.prompt_tokens import PromptTokenCounter
from servelab.errors import UserError

COUNT_CONCURRENCY = 8  # tokenize requests in flight while preparing
COUNT_LIMIT = 4096  # items counted when the plan does not say how many requests it needs


@dataclass
class DatasetItem:
    content: str | Messages  # a prompt, or chat messages
    where: str  # "file:line" or "file: item i", for messages about this item
    max_tokens: int | None = None  # the item's own output length (a JSONL line's max_tokens)
    reference_output: str | None = None  # the dataset's answer (ShareGPT's gpt turn)
    input_tokens: int | None = None  # counted by prepare()
    reference_tokens: int | None = None  # counted by prepare(), when output lengths come from the dataset


@dataclass
class DatasetWorkload:
    path: Path
    format: str  # "sharegpt" | "jsonl"
    items: list[DatasetItem]
    endpoint: str = CHAT
    output: OutputSpec = field(default_factory=OutputSpec)
    output_from_dataset: bool = False  # max_tokens = the reference answer's length in tokens
    shuffle: bool = False
    seed: int = 0
    skipped: int = 0  # items the loader left out (a conversation without a human turn, ...)
    counter_name: str | None = None

    kind = "dataset"

    def __post_init__(self) -> None:
        if self.output_from_dataset:  # an item with no answer and no max_tokens has no output length to ask for
            usable = [it for it in self.items if it.reference_output is not None or it.max_tokens is not None]
            self.skipped += len(self.items) - len(usable)
            self.items = usable
        if not self.items:
            raise UserError(f"{self.path}: no usable prompts in this {self.format} file"
                            + (" (none has an answer to take the output length from)"
                               if self.output_from_dataset else ""))
        if not self.endpoint.endswith("/chat/completions"):
            chat = next((it for it in self.items if isinstance(it.content, list)), None)
            if chat is not None:
                raise UserError(f"{chat.where}: chat messages cannot be sent to the completions endpoint",
                                hint="use --endpoint chat")
        self.order = list(range(len(self.items)))
        if self.shuffle:
            random.Random(f"{self.seed}:order").shuffle(self.order)

    def item(self, index: int) -> DatasetItem:
        return self.items[self.order[index % len(self.order)]]

    async def prepare(self, counter: PromptTokenCounter | None, needed: int | None = None) -> None:
        if counter is None:
            if self.output_from_dataset and any(it.max_tokens is None for it in self.items):
                raise UserError("output lengths from the dataset need the server's tokenizer, and servelab knows "
                                "no tokenize endpoint for this server", hint="give max_tokens per line instead")
            return
        self.counter_name = counter.name
        n = min(len(self.items), needed if needed is not None else COUNT_LIMIT)
        todo = [self.item(i) for i in range(n)]
        slots = asyncio.Semaphore(COUNT_CONCURRENCY)

        async def count(it: DatasetItem) -> None:
            async with slots:
                content = it.content if isinstance(it.content, list) or not self.endpoint.endswith(
                    "/chat/completions") else [{"role": "user", "content": it.content}]
                it.input_tokens = await counter.count_prompt_tokens(content)
                if self.output_from_dataset and it.max_tokens is None and it.reference_output is not None:
                    it.reference_tokens = max(1, await counter.count_text_tokens(it.reference_output))

        await asyncio.gather(*(count(it) for it in todo))
        if self.output_from_dataset:
            # Items past the counted ones have no known length: never guess one, leave them out of the rotation.
            self.order = [i for i in self.order
                          if self.items[i].max_tokens is not None or self.items[i].reference_tokens is not None]

    def request(self, index: int, model: str, *, tag: str = "", warmup: bool = False,
                accepts_ignore_eos: bool = False, accepts_min_tokens: bool = False) -> RequestSpec:
        it = self.item(index)
        own = it.max_tokens if it.max_tokens is not None else it.reference_tokens if self.output_from_dataset \
            else None
        body = build_body(model, self.endpoint, it.content, self.output, max_tokens=own,
                          accepts_ignore_eos=accepts_ignore_eos, accepts_min_tokens=accepts_min_tokens)
        return RequestSpec(endpoint=self.endpoint, body=body, index=index, tag=tag, warmup=warmup,
                           input_tokens=it.input_tokens)

    def describe(self, accepts_ignore_eos: bool, accepts_min_tokens: bool = False) -> dict[str, Any]:
        counted = [it.input_tokens for it in self.items if it.input_tokens is not None]
        if not hasattr(self, "_sha256"):  # a full ShareGPT dump is ~0.6 GB: hash it once, not per describe()
            self._sha256 = file_sha256(self.path)
        return {"kind": self.kind, "format": self.format, "path": str(self.path), "sha256": self._sha256,
                "items": len(self.items), "skipped": self.skipped, "endpoint": self.endpoint,
                **self.output.describe(accepts_ignore_eos, accepts_min_tokens),
                "output_lengths": "from the dataset" if self.output_from_dataset else
                "max_tokens per line where given, else the workload's max_tokens",
                "order": f"shuffled with seed {self.seed}" if self.shuffle else "file order",
                "input_tokens_counted_by": self.counter_name,
                "input_tokens_mean": sum(counted) / len(counted) if counted else None,
                "input_tokens_min": min(counted, default=None), "input_tokens_max": max(counted, default=None)}


def file_sha256(path: Path) -> str | None:
    """The dataset's identity: two runs on files with the same hash sent the same prompts."""
    try:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    except OSError:
        return None


def read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"dataset file not found: {path}") from None
    except IsADirectoryError:
        raise UserError(f"dataset path is a directory, not a file: {path}") from None
    except OSError as exc:
        raise UserError(f"cannot read dataset file {path}: {exc.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise UserError(f"{path}:{line}: not UTF-8 text (byte {exc.start} of the file)") from None
