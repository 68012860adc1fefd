"""The workloads of `bench --mode multiturn` and `--mode replay`, from the bench command's options (issue 16).

multiturn:
- `--dataset FILE` of conversations: ShareGPT JSON (.json; every turn) or a JSONL of conversations (.jsonl:
  `{"messages": [...]}` per line), `--dataset-format sharegpt|jsonl` to say which;
- otherwise synthetic conversations: `--turns` user turns, each `--input-tokens` filler tokens (default 64; a
  length distribution is drawn per turn), after a shared system prompt of `--prefix-tokens` tokens (default 128;
  0 for none).
`--think-time`, `--history server|dataset`, `--conversations N` (per level) apply to both.

replay: `--dataset TRACE` with `--dataset-format mooncake|azure|burstgpt` (default: from the file),
`--time-scale F`, `--block-tokens B` (tokens per Mooncake hash id, default 512); sent to the completions
endpoint unless `--endpoint chat` is given (bench/workloads/traces.py says why).
"""

from __future__ import annotations

from pathlib import Path

from servelab.bench.workloads.base import CHAT, COMPLETIONS, STREAM_ENDPOINTS, OutputSpec
from servelab.bench.workloads.conversations import (HISTORIES, ConversationWorkload, SyntheticConversations,
                                                    ThinkTime, load_jsonl_conversations, load_sharegpt_conversations)
from servelab.bench.workloads.lengths import parse_length
from servelab.bench.workloads.traces import MOONCAKE_BLOCK_TOKENS, TRACE_FORMATS, TraceWorkload, parse_trace
from servelab.errors import UserError

CONVERSATION_FORMATS = ("sharegpt", "jsonl")
MAX_TURNS = 10_000
MAX_CONVERSATIONS = 10_000_000


def load_conversations(path: Path, fmt: str | None):
    fmt = fmt or {".json": "sharegpt", ".jsonl": "jsonl"}.get(path.suffix.lower())
    if fmt == "sharegpt":
        conversations, skipped = load_sharegpt_conversations(path)
        return fmt, conversations, skipped
    if fmt == "jsonl":
        return fmt, load_jsonl_conversations(path), 0
    if fmt is None:
        raise UserError(f"cannot tell the format of {path} from its name",
                        hint="pass --dataset-format sharegpt or jsonl")
    raise UserError(f"unknown conversation format '{fmt}'", hint=f"use {' or '.join(CONVERSATION_FORMATS)}")


def build_multi_workload(a, output: OutputSpec):
    if a.output_from_dataset:
        raise UserError(f"--output-from-dataset does not apply to --mode {a.mode}",
                        hint="a JSONL conversation's max_tokens and a trace's output lengths always apply")
    if a.mode == "multiturn":
        return _conversations(a, output)
    return _trace(a, output)


def _conversations(a, output: OutputSpec) -> ConversationWorkload:
    if a.requests is not None:
        raise UserError("--requests does not apply to --mode multiturn: a level runs whole conversations",
                        hint="use --conversations N")
    if a.endpoint not in (None, "chat", "responses", "messages"):
        raise UserError("multi-turn conversations are chat messages: they need --endpoint chat, responses or "
                        "messages")
    if a.history not in HISTORIES:
        raise UserError(f"unknown --history '{a.history}'", hint="use server (the answers the server gave) or "
                                                                 "dataset (the file's recorded answers)")
    if a.conversations is not None and not 0 < a.conversations <= MAX_CONVERSATIONS:
        raise UserError(f"--conversations must be between 1 and {MAX_CONVERSATIONS:,}")
    think = ThinkTime.parse(a.think_time)
    # Responses and Messages take the same history, in their own shapes (protocol/dialects/)
    common = dict(history=a.history, think=think, count=a.conversations, output=output, seed=a.seed,
                  endpoint=STREAM_ENDPOINTS.get(a.endpoint or "chat", CHAT))
    if a.dataset is not None:
        if a.prefix_groups is not None or a.prefix_tokens is not None or a.input_tokens is not None \
                or a.turns != 6:
            raise UserError("--dataset conversations bring their own turns: --turns, --input-tokens and "
                            "--prefix-tokens are for synthetic conversations")
        fmt, conversations, skipped = load_conversations(a.dataset, a.dataset_format)
        return ConversationWorkload(conversations=conversations, path=a.dataset, format=fmt, skipped=skipped,
                                    **common)
    if a.dataset_format is not None:
        raise UserError("--dataset-format needs --dataset")
    if a.prefix_groups is not None:
        raise UserError("--prefix-groups does not apply to conversations (every conversation shares the system "
                        "prompt of --prefix-tokens tokens)")
    if a.history == "dataset":
        raise UserError("--history dataset needs a --dataset with recorded answers")
    if not 0 < a.turns <= MAX_TURNS:
        raise UserError(f"--turns must be between 1 and {MAX_TURNS:,}")
    if a.prefix_tokens is not None and not 0 <= a.prefix_tokens <= 1_000_000:
        raise UserError("--prefix-tokens (the shared system prompt) must be between 0 and 1,000,000")
    synthetic = SyntheticConversations(turns=a.turns, turn_tokens=parse_length(a.input_tokens or 64),
                                       system_tokens=128 if a.prefix_tokens is None else a.prefix_tokens,
                                       seed=a.seed)
    return ConversationWorkload(synthetic=synthetic, format="synthetic", **common)


def _trace(a, output: OutputSpec) -> TraceWorkload:
    if a.dataset is None:
        raise UserError("--mode replay needs a trace: --dataset FILE (Mooncake JSONL, Azure or BurstGPT CSV)")
    for name, given in (("input-tokens", a.input_tokens), ("prefix-groups", a.prefix_groups),
                        ("prefix-tokens", a.prefix_tokens), ("think-time", a.think_time),
                        ("conversations", a.conversations), ("users", a.users)):
        if given is not None:
            raise UserError(f"--{name} does not apply to --mode replay: the trace gives lengths and times")
    if a.dataset_format is not None and a.dataset_format not in TRACE_FORMATS:
        raise UserError(f"unknown trace format '{a.dataset_format}'", hint=f"use {' or '.join(TRACE_FORMATS)}")
    if not 0 < a.time_scale <= 1e6:
        raise UserError(f"--time-scale must be positive (got {a.time_scale:g})")
    if a.block_tokens is not None and not 0 < a.block_tokens <= 1_000_000:
        raise UserError("--block-tokens must be between 1 and 1,000,000")
    fmt, entries = parse_trace(a.dataset, a.dataset_format)
    return TraceWorkload(entries=entries, path=a.dataset, format=fmt, time_scale=a.time_scale,
                         block_tokens=a.block_tokens or MOONCAKE_BLOCK_TOKENS,
                         endpoint=STREAM_ENDPOINTS.get(a.endpoint or "completions", COMPLETIONS), output=output,
                         seed=a.seed)
