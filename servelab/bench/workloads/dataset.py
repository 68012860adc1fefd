"""Prompts from a file (ShareGPT JSON, JSONL): the items, and the workload that sends them in order.

Items are sent in file order (or shuffled with the seed), request i taking item i mod n, so a run longer than the
file repeats prompts (and a prefix cache will notice: `describe()` says how many distinct items there were).
With the server's tokenizer, `prepare` counts each item's prompt after the chat template (recorded as
`input_tokens`, checked against `usage.prompt_tokens` after the run) and, when output lengths come from the
dataset, the reference answer's tokens.

What is read is bounded, and a file that is not a dataset is one clear error naming the file and the line
(issue 11 item 18): at most MAX_DATASET_BYTES are read (a NUL byte, as in `/dev/zero` or any binary file, stops
the read at once: JSON never holds one), nesting too deep for the parser, a lone surrogate (`"\\ud800"`, which
no server can be sent) and a max_tokens above MAX_TOKENS are refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.bench.client import RequestSpec
from servelab.bench.workloads.base import CHAT, Messages, OutputSpec, build_body, takes_messages
from servelab.bench.workloads.prompt_tokens import PromptTokenCounter
from servelab.errors import UserError

COUNT_CONCURRENCY = 8  # tokenize requests in flight while preparing
COUNT_LIMIT = 4096  # items counted when the plan does not say how many requests it needs
MAX_DATASET_BYTES = 2 * 1024**3  # a full ShareGPT dump is ~0.6 GB; beyond this a file is not a prompt set
READ_BLOCK = 1 << 20
MAX_TOKENS = 2**31 - 1  # an item's max_tokens: what every engine's int32 field holds (as bench/options.py)


@dataclass
class DatasetItem:
    content: str | Messages  # a prompt, or chat messages
    where: str  # "file:line" or "file: item i", for messages about this item
    max_tokens: int | None = None  # the item's own output length (a JSONL line's max_tokens)
    reference_output: str | None = None  # the dataset's answer (ShareGPT's gpt turn)
    input_tokens: int | None = None  # counted by prepare()
    reference_tokens: int | None = None  # counted by prepare(), when output lengths come from the dataset
    images: list[str] | None = None  # image files sent with the prompt (a JSONL line's `images`: workloads/images.py)


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
        if not takes_messages(self.endpoint):
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
                content = it.content if isinstance(it.content, list) or not takes_messages(self.endpoint) \
                    else [{"role": "user", "content": it.content}]
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


def read_text(path: Path, limit: int | None = None) -> str:
    """The file as text, read in blocks: at most `limit` (MAX_DATASET_BYTES) bytes, and not past a NUL byte."""
    limit = MAX_DATASET_BYTES if limit is None else limit
    raw = bytearray()
    try:
        with open(path, "rb") as fh:
            while True:
                block = fh.read(READ_BLOCK)
                if not block:
                    break
                nul = block.find(b"\0")
                if nul >= 0:
                    at = len(raw) + nul
                    line = raw.count(b"\n") + block.count(b"\n", 0, nul) + 1
                    raise UserError(f"{path}:{line}: binary data (a NUL byte at byte {at}): not a JSON or JSONL "
                                    f"dataset")
                raw += block
                if len(raw) > limit:
                    raise UserError(f"{path}: more than {_size(limit)}: larger than servelab reads as a dataset",
                                    hint="use a part of it (head -n N for JSONL)")
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


def _size(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n:,} bytes"


def parse_json(text: str, where: str):
    """json.loads, with nesting too deep for the parser as a UserError naming `where`."""
    import json

    try:
        return json.loads(text)
    except RecursionError:
        raise UserError(f"{where}: JSON nested too deeply to read (more than ~{sys.getrecursionlimit()} "
                        f"levels)") from None


def check_unicode(value: object, where: str) -> None:
    """Every string in `value` (a prompt, messages, an answer) is valid Unicode: a lone surrogate from a `\\ud800`
    escape parses as JSON but can never be sent (UTF-8 has no encoding for it)."""
    stack = [(value, "")]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                char = item[exc.start]
                raise UserError(f"{where}: {at or 'a string'} holds a lone surrogate (\\u{ord(char):04x} at "
                                f"character {exc.start}): not valid Unicode, and no server can be sent it") from None
        elif isinstance(item, dict):
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(item))
