"""Trace replay: a production trace's arrival times and lengths, as prompts of exact length.

Formats (`parse_trace`; each malformed line is one error naming the file and the line):
- mooncake: JSONL, one request per line: `{"timestamp": ms, "input_length": N, "output_length": M,
  "hash_ids": [h0, h1, …]}` (Mooncake's and Alibaba's published traces). Hash id j stands for the j-th block of
  `block_tokens` prompt tokens (512 in the published traces) *and everything before it*, so two requests whose
  hash ids agree on their first k ids share their first k blocks exactly.
- azure: CSV with a header `TIMESTAMP,ContextTokens,GeneratedTokens` (Azure LLM inference traces 2023/2024;
  timestamps as `2023-11-16 18:15:46.6805900`).
- burstgpt: CSV with a header `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type` (BurstGPT;
  timestamps in seconds). A response of 0 tokens (a failed request in the trace) is sent as 1.
Entries are replayed in time order (a trace out of order is sorted, stably); offsets are relative to the first.

Prompts: request i is OPENER followed by single-token filler words (workloads/filler.py), `input_length` tokens
in all as the server counts them (the template's and the opener's tokens included, as synthetic prompts are
built). With hash ids, the words of block j are drawn from a generator seeded with (seed, hash id), so where two
requests' hash ids repeat, their prompts repeat token for token; the words after the last block (a prompt longer
than its blocks) are the request's own. Without hash ids every prompt has its own words after the opener.
Output: `max_tokens` = the trace's output length, with `ignore_eos` where the engine honours it.

The trace's own prefix reuse (`implied_cached`, `implied_hit_ratio`): for each request, the prompt tokens that
some earlier request of the trace shares as a prefix (its opener, and its leading blocks whose hash ids an
earlier request had), capped at its length − 1 (engines compute at least the last prompt token). That is what an
engine that never evicts and never sees two requests at once would serve from its cache. On the completions
endpoint (the default for traces) that count is exact; on the chat endpoint the template's tokens after the
prompt are not shared and the figure is a little high.
"""

from __future__ import annotations

import csv
import io
import json
import random
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from servelab.bench.client import RequestSpec
from servelab.bench.workloads.base import COMPLETIONS, OutputSpec, build_body, chat_or_prompt
from servelab.bench.workloads.dataset import file_sha256, read_text
from servelab.bench.workloads.filler import OPENER, single_token_words
from servelab.bench.workloads.prompt_tokens import PromptTokenCounter
from servelab.errors import UserError

TRACE_FORMATS = ("mooncake", "azure", "burstgpt")
MOONCAKE_BLOCK_TOKENS = 512
MAX_LENGTH = 2**31 - 1
SAMPLE_CHECKS = 4


@dataclass(frozen=True)
class TraceEntry:
    t_s: float  # arrival, seconds (absolute in the trace's own clock)
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None = None
    where: str = ""


def _int(value: Any, where: str, name: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value.strip())
        elif isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise UserError(f"{where}: {name} must be an integer, got {value!r}")
    if not minimum <= value <= MAX_LENGTH:
        raise UserError(f"{where}: {name} must be between {minimum} and {MAX_LENGTH}, got {value}")
    return value


def _float(value: Any, where: str, name: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{where}: {name} must be a number, got {value!r}") from None
    if x != x or x in (float("inf"), float("-inf")):
        raise UserError(f"{where}: {name} must be finite, got {value!r}")
    return x


def parse_mooncake(text: str, path: str) -> list[TraceEntry]:
    out: list[TraceEntry] = []
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from None
        except RecursionError:
            raise UserError(f"{where}: JSON nested too deeply") from None
        if not isinstance(obj, dict):
            raise UserError(f"{where}: expected an object with timestamp, input_length, output_length")
        for key in ("timestamp", "input_length", "output_length"):
            if key not in obj:
                raise UserError(f"{where}: missing '{key}' (a Mooncake trace line has timestamp, input_length, "
                                f"output_length and hash_ids)")
        hash_ids = obj.get("hash_ids")
        if hash_ids is not None:
            if not isinstance(hash_ids, list):
                raise UserError(f"{where}: hash_ids must be a list of integers")
            hash_ids = tuple(_int(h, where, "each hash id", minimum=-MAX_LENGTH) for h in hash_ids)
        out.append(TraceEntry(_float(obj["timestamp"], where, "timestamp") / 1000.0,
                              _int(obj["input_length"], where, "input_length", 1),
                              _int(obj["output_length"], where, "output_length", 0), hash_ids, where))
    return out


def _csv_rows(text: str, path: str, columns: tuple[str, ...], fmt: str):
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise UserError(f"{path}: empty file (a {fmt} trace starts with a header line)") from None
    except csv.Error as exc:
        raise UserError(f"{path}:1: not CSV: {exc}") from None
    names = [h.strip() for h in header]
    missing = [c for c in columns if c not in names]
    if missing:
        raise UserError(f"{path}:1: the header has no {', '.join(repr(m) for m in missing)} column (a {fmt} trace "
                        f"has {', '.join(columns)})")
    at = [names.index(c) for c in columns]
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise UserError(f"{path}:{reader.line_num}: not CSV: {exc}") from None
        if not row or not any(cell.strip() for cell in row):
            continue
        where = f"{path}:{reader.line_num}"
        if len(row) < len(names):
            raise UserError(f"{where}: {len(row)} fields, the header has {len(names)}")
        yield where, [row[i].strip() for i in at]


def parse_azure_time(text: str, where: str) -> float:
    """Seconds since the epoch of an Azure trace timestamp (`2023-11-16 18:15:46.6805900`: 7 fraction digits)."""
    base, _, fraction = text.strip().replace("T", " ").rstrip("Z").partition(".")
    try:
        t = datetime.strptime(base, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise UserError(f"{where}: TIMESTAMP {text!r} is not a date and time like 2023-11-16 18:15:46.68") from None
    if fraction and not fraction.isdigit():
        raise UserError(f"{where}: TIMESTAMP {text!r} has a bad fraction of a second")
    return (t - datetime(1970, 1, 1)).total_seconds() + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


def parse_azure(text: str, path: str) -> list[TraceEntry]:
    return [TraceEntry(parse_azure_time(t, where), _int(ctx, where, "ContextTokens", 1),
                       _int(gen, where, "GeneratedTokens", 0), None, where)
            for where, (t, ctx, gen) in _csv_rows(text, path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
                                                  "azure")]


def parse_burstgpt(text: str, path: str) -> list[TraceEntry]:
    return [TraceEntry(_float(t, where, "Timestamp"), _int(req, where, "Request tokens", 1),
                       _int(resp, where, "Response tokens", 0), None, where)
            for where, (t, req, resp) in _csv_rows(text, path, ("Timestamp", "Request tokens", "Response tokens"),
                                                   "burstgpt")]


PARSERS = {"mooncake": parse_mooncake, "azure": parse_azure, "burstgpt": parse_burstgpt}


def guess_format(path: Path) -> str:
    if path.suffix.lower() == ".jsonl":
        return "mooncake"
    if path.suffix.lower() == ".csv":
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                head = fh.readline()
        except OSError:
            head = ""
        if "ContextTokens" in head:
            return "azure"
        if "Request tokens" in head:
            return "burstgpt"
    raise UserError(f"cannot tell the trace format of {path}", hint=f"pass --dataset-format "
                                                                     f"{' or '.join(TRACE_FORMATS)}")


def parse_trace(path: Path, fmt: str | None = None) -> tuple[str, list[TraceEntry]]:
    fmt = fmt or guess_format(path)
    if fmt not in PARSERS:
        raise UserError(f"unknown trace format '{fmt}'", hint=f"use one of {', '.join(TRACE_FORMATS)}")
    entries = PARSERS[fmt](read_text(path), str(path))
    if not entries:
        raise UserError(f"{path}: no requests in this {fmt} trace")
    return fmt, sorted(entries, key=lambda e: e.t_s)


@dataclass
class TraceWorkload:
    entries: list[TraceEntry]
    path: Path | None = None
    format: str = "mooncake"
    time_scale: float = 1.0  # trace seconds x time_scale = replay seconds (0.1: ten times as fast)
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    endpoint: str = COMPLETIONS
    output: OutputSpec = field(default_factory=OutputSpec)
    seed: int = 0
    # Filled by prepare():
    words: list[str] = field(default_factory=list, repr=False)
    overhead: int | None = None
    counter_name: str | None = None
    raised: int = 0  # entries shorter than the shortest possible prompt, sent at that length

    kind = "trace"

    def __post_init__(self) -> None:
        if not self.entries:
            raise UserError(f"{self.path}: no requests in this trace")
        if not self.time_scale > 0 or self.time_scale > 1e6:
            raise UserError(f"--time-scale must be positive (got {self.time_scale:g})")
        if self.block_tokens < 1:
            raise UserError("--block-tokens must be positive")
        self._blocks: dict[int, list[str]] = {}

    # ---- schedule ----
    def offsets_ns(self, count: int | None = None) -> list[int]:
        entries = self.entries[:count] if count else self.entries
        t0 = entries[0].t_s
        return [int(round((e.t_s - t0) * self.time_scale * 1e9)) for e in entries]

    # ---- prompts ----
    async def prepare(self, counter: PromptTokenCounter | None, needed: int | None = None) -> None:
        if counter is None:
            raise UserError("trace replay builds prompts of exact length with the server's tokenizer, and servelab "
                            "knows no tokenize endpoint for this server")
        self.counter_name = counter.name
        self.words = await single_token_words(counter)
        self.overhead = await counter.count_prompt_tokens(chat_or_prompt(self.endpoint, OPENER))
        self.raised = sum(1 for e in self.entries if e.input_tokens < self.minimum)
        for i in range(min(SAMPLE_CHECKS, len(self.entries))):
            want, got = self.length(i), await counter.count_prompt_tokens(chat_or_prompt(self.endpoint, self.text(i)))
            if got != want:
                raise UserError(f"a trace prompt built to be {want} tokens is {got} tokens for the server's tokenizer "
                                f"({counter.name}): this tokenizer does not count filler words one token each")

    @property
    def minimum(self) -> int:
        if self.overhead is None:
            raise RuntimeError("TraceWorkload.prepare() must run before prompts are built")
        return self.overhead + 1

    def entry(self, index: int) -> TraceEntry:
        return self.entries[index % len(self.entries)]

    def length(self, index: int) -> int:
        return max(self.entry(index).input_tokens, self.minimum)

    def _block(self, h: int) -> list[str]:
        block = self._blocks.get(h)
        if block is None:
            rng = random.Random(f"{self.seed}:block:{h}")
            block = self._blocks[h] = [rng.choice(self.words) for _ in range(self.block_tokens)]
        return block

    def prompt_words(self, index: int) -> list[str]:
        e = self.entry(index)
        n = self.length(index) - self.minimum + 1
        words: list[str] = []
        for h in e.hash_ids or ():
            if len(words) >= n:
                break
            words += self._block(h)
        if len(words) < n:
            rng = random.Random(f"{self.seed}:words:{index}")
            words += [rng.choice(self.words) for _ in range(n - len(words))]
        return words[:n]

    def text(self, index: int) -> str:
        return OPENER + "".join(" " + w for w in self.prompt_words(index))

    def request(self, index: int, model: str, *, tag: str = "", warmup: bool = False,
                accepts_ignore_eos: bool = False, accepts_min_tokens: bool = False) -> RequestSpec:
        if warmup:  # not a trace entry: a short prompt of its own words, sharing only the opener
            text = OPENER + " " + " ".join(random.Random(f"{self.seed}:warmup:{index}").choices(self.words, k=8))
            body = build_body(model, self.endpoint, chat_or_prompt(self.endpoint, text), self.output, max_tokens=4,
                              accepts_ignore_eos=accepts_ignore_eos, accepts_min_tokens=accepts_min_tokens)
            return RequestSpec(endpoint=self.endpoint, body=body, index=index, tag=tag, warmup=True)
        e = self.entry(index)
        body = build_body(model, self.endpoint, chat_or_prompt(self.endpoint, self.text(index)), self.output,
                          max_tokens=max(1, e.output_tokens), accepts_ignore_eos=accepts_ignore_eos,
                          accepts_min_tokens=accepts_min_tokens)
        return RequestSpec(endpoint=self.endpoint, body=body, index=index, tag=tag, warmup=warmup,
                           input_tokens=self.length(index))

    # ---- the trace's own prefix reuse ----
    def implied_cached(self, count: int | None = None) -> list[int]:
        """Per request (in replay order), the prompt tokens an earlier request of the trace shares as a prefix."""
        entries = self.entries[:count] if count else self.entries
        # every prefix of hash ids seen so far -> the most words an earlier prompt had under it (a prompt shorter
        # than its blocks ends inside its last one, and an engine can reuse only what that prompt held)
        seen: dict[tuple[int, ...], int] = {}
        out: list[int] = []
        for i, e in enumerate(entries):
            length, words = self.length(i), self.length(i) - self.minimum + 1
            ids = e.hash_ids or ()
            shared_words = max((min(k * self.block_tokens, words, seen[ids[:k]]) for k in range(1, len(ids) + 1)
                                if ids[:k] in seen), default=0)
            shared = 0 if i == 0 else self.overhead + shared_words  # type: ignore[operator]
            out.append(min(shared, length - 1))
            for k in range(1, len(ids) + 1):
                seen[ids[:k]] = max(seen.get(ids[:k], 0), words)
        return out

    def implied_hit_ratio(self, count: int | None = None) -> float:
        cached = self.implied_cached(count)
        total = sum(self.length(i) for i in range(len(cached)))
        return sum(cached) / total if total else 0.0

    def describe(self, accepts_ignore_eos: bool, accepts_min_tokens: bool = False) -> dict[str, Any]:
        if not hasattr(self, "_sha256"):
            self._sha256 = file_sha256(self.path) if self.path else None
        span = self.entries[-1].t_s - self.entries[0].t_s
        d: dict[str, Any] = {
            "kind": self.kind, "format": self.format, "path": str(self.path), "sha256": self._sha256,
            "requests": len(self.entries), "endpoint": self.endpoint,
            **self.output.describe(accepts_ignore_eos, accepts_min_tokens),
            "output_lengths": "the trace's output_length per request (at least 1)",
            "time_scale": self.time_scale, "trace_span_s": span, "replay_span_s": span * self.time_scale,
            "seed": self.seed, "input_tokens_counted_by": self.counter_name,
            "input_tokens_raised": self.raised,
            "prompts": f"'{OPENER}' + single-token filler words, lengths exact after the template"
                       + (f"; hash id blocks of {self.block_tokens} tokens repeat where the trace's hash ids repeat"
                          if any(e.hash_ids for e in self.entries) else "; no hash ids: no shared prefix beyond "
                                                                          "the opener")}
        if self.overhead is not None:
            d["implied_cache_hit_ratio"] = self.implied_hit_ratio()
        return d
