"""Multi-turn conversations: every turn sends the whole history, as a chat client does.

A Conversation is its user turns, the answers a dataset recorded for them (None where it has none) and an
optional system prompt. Turn k (1-based) of a conversation is sent as

    [system] + (user 1, assistant 1) + … + (user k-1, assistant k-1) + user k

where assistant j is the answer the server actually gave to turn j (`history="server"`, the default: what a
real client sends, and what a prefix cache can reuse token for token, since the engine generated those tokens
itself) or the dataset's recorded answer (`history="dataset"`, where the file has one; the server's answer where
it has not). The server's answer is its answer text (`delta.content`): reasoning is not sent back, as chat
clients do not.

Sources:
- ShareGPT JSON (`load_sharegpt_conversations`): every human turn in order, each answered by the gpt turn after
  it; a leading "system" turn becomes the system prompt. Conversations without a human turn are skipped.
- JSONL of conversations (`load_jsonl_conversations`): one conversation per line, `{"messages": [{"role":
  "system"|"user"|"assistant", "content": …}, …]}`; an optional `"max_tokens"` (one number for every turn) and
  `"id"`. An assistant message after a user message is that turn's recorded answer.
- Synthetic (`SyntheticConversations`): `turns` user turns of filler words (single tokens for the served model,
  workloads/filler.py), each `turn_tokens` long (a length distribution, drawn per conversation and turn from the
  seed), after a system prompt of `system_tokens` words shared by every conversation (0: none).

Anything malformed in a file is one error naming the file and the line (JSONL) or the item (ShareGPT).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from servelab.bench.client import RequestSpec
from servelab.bench.workloads.base import CHAT, Messages, OutputSpec, build_body, takes_messages
from servelab.bench.workloads.dataset import check_unicode, file_sha256, parse_json, read_text
from servelab.bench.workloads.filler import filler, single_token_words
from servelab.bench.workloads.lengths import LengthSpec, parse_length
from servelab.bench.workloads.prompt_tokens import PromptTokenCounter
from servelab.errors import UserError

History = Literal["server", "dataset"]
HISTORIES: tuple[str, ...] = ("server", "dataset")
WARMUP_PROMPT = "Warm-up: reply with one word."  # shares no prefix with any conversation (no system prompt)


@dataclass
class Conversation:
    turns: list[str]  # the user messages, in order
    answers: list[str | None] = field(default_factory=list)  # the dataset's answer to each turn (None: none)
    system: str | None = None
    where: str = ""  # "file:line" or "file: item i", for messages about it
    max_tokens: int | None = None  # every turn's output length, when the file gives one

    def answer(self, k: int) -> str | None:
        return self.answers[k] if k < len(self.answers) else None


def history_messages(conv: Conversation, k: int, answers: list[str]) -> Messages:
    """The messages of turn k (0-based): the system prompt, every earlier turn with the answer it got, then user
    turn k. `answers[j]` is the answer turn j got (the server's or the dataset's: the caller chooses)."""
    if k >= len(conv.turns):
        raise IndexError(f"turn {k + 1} of a conversation of {len(conv.turns)} turns")
    if len(answers) < k:
        raise ValueError(f"turn {k + 1} needs the answers of the {k} turns before it, got {len(answers)}")
    msgs: Messages = [{"role": "system", "content": conv.system}] if conv.system else []
    for j in range(k):
        msgs.append({"role": "user", "content": conv.turns[j]})
        msgs.append({"role": "assistant", "content": answers[j]})
    msgs.append({"role": "user", "content": conv.turns[k]})
    return msgs


# ---------------------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------------------

HUMAN = {"human", "user"}
GPT = {"gpt", "assistant", "chatgpt", "bard", "bing", "model"}


def load_sharegpt_conversations(path: Path) -> tuple[list[Conversation], int]:
    """(conversations, skipped) from a ShareGPT JSON file: all turns of each conversation."""
    try:
        data = parse_json(read_text(path), str(path))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except ValueError as exc:
        raise UserError(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(data, list):
        raise UserError(f"{path}: a ShareGPT file is a JSON list of conversations, got {type(data).__name__}")
    out: list[Conversation] = []
    skipped = 0
    for i, entry in enumerate(data):
        where = f"{path}: item {i}"
        if not isinstance(entry, dict) or not isinstance(entry.get("conversations"), list):
            raise UserError(f"{where}: expected an object with a 'conversations' list")
        system: str | None = None
        turns: list[str] = []
        answers: list[str | None] = []
        for t, turn in enumerate(entry["conversations"]):
            if not isinstance(turn, dict) or not isinstance(turn.get("from"), str) \
                    or not isinstance(turn.get("value"), str):
                raise UserError(f"{where} (conversations[{t}]): expected an object with string 'from' and 'value'")
            who = turn["from"].lower()
            if who == "system" and not turns:
                system = turn["value"] or None
            elif who in HUMAN:
                if not turn["value"]:
                    continue
                if len(answers) < len(turns):  # two human turns in a row: the first had no answer
                    answers.append(None)
                turns.append(turn["value"])
            elif who in GPT and turns and len(answers) < len(turns):
                answers.append(turn["value"])
        if not turns:
            skipped += 1
            continue
        answers += [None] * (len(turns) - len(answers))
        check_unicode({"turns": turns, "answers": answers, "system": system}, where)
        out.append(Conversation(turns, answers, system, where))
    return out, skipped


def load_jsonl_conversations(path: Path) -> list[Conversation]:
    """One conversation per line: {"messages": [...], "max_tokens"?: N, "id"?: ...}."""
    out: list[Conversation] = []
    for n, line in enumerate(read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = parse_json(line, where)
        except json.JSONDecodeError as exc:
            raise UserError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from None
        except ValueError as exc:
            raise UserError(f"{where}: invalid JSON: {exc}") from None
        out.append(parse_conversation(obj, where))
    if not out:
        raise UserError(f"{path}: no conversations in this JSONL file")
    return out


def parse_conversation(obj: Any, where: str) -> Conversation:
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
        raise UserError(f"{where}: expected an object with a 'messages' list (one conversation per line)")
    system: str | None = None
    turns: list[str] = []
    answers: list[str | None] = []
    for m, msg in enumerate(obj["messages"]):
        if not isinstance(msg, dict) or msg.get("role") not in ("system", "user", "assistant") \
                or not isinstance(msg.get("content"), str):
            raise UserError(f"{where}: messages[{m}] must be {{\"role\": \"system\"|\"user\"|\"assistant\", "
                            f"\"content\": \"…\"}}")
        role, content = msg["role"], msg["content"]
        if role == "system":
            if turns:
                raise UserError(f"{where}: messages[{m}]: a system message after the first user turn")
            system = content or None
        elif role == "user":
            if len(answers) < len(turns):
                answers.append(None)
            turns.append(content)
        else:
            if not turns or len(answers) == len(turns):
                raise UserError(f"{where}: messages[{m}]: an assistant message that answers no user turn")
            answers.append(content)
    if not turns:
        raise UserError(f"{where}: a conversation needs at least one user message")
    answers += [None] * (len(turns) - len(answers))
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or not 0 < max_tokens < 2**31):
        raise UserError(f"{where}: max_tokens must be a positive integer, got {max_tokens!r}")
    check_unicode(obj["messages"], where)
    return Conversation(turns, answers, system, where, max_tokens)


# ---------------------------------------------------------------------------------------------------------------
# The workload
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class ThinkTime:
    """How long a user waits after an answer before sending the next turn: `fixed:S` (or a bare number),
    `exp:MEAN` (exponential) or `uniform:LO..HI`, in seconds; drawn per (seed, conversation, turn)."""

    kind: Literal["fixed", "exp", "uniform"] = "fixed"
    a: float = 0.0
    b: float = 0.0

    @classmethod
    def parse(cls, text: str | float | None) -> ThinkTime:
        if text is None:
            return cls()
        s = str(text).strip()
        try:
            if ":" not in s:
                think = cls("fixed", float(s))
            else:
                kind, _, rest = s.partition(":")
                if kind == "fixed":
                    think = cls("fixed", float(rest))
                elif kind == "exp":
                    think = cls("exp", float(rest))
                elif kind == "uniform":
                    lo, _, hi = rest.partition("..")
                    think = cls("uniform", float(lo), float(hi))
                else:
                    raise ValueError(kind)
        except ValueError:
            raise UserError(f"bad think time '{text}'", hint="seconds: 2, fixed:2, exp:2 (mean) or uniform:1..3") \
                from None
        if not (0 <= think.a <= 3600 and 0 <= think.b <= 3600) or (think.kind == "uniform" and think.b < think.a):
            raise UserError(f"bad think time '{text}': seconds between 0 and 3600 (uniform: LO <= HI)")
        return think

    def draw(self, seed: int, conversation: int, turn: int) -> float:
        if self.kind == "fixed":
            return self.a
        rng = random.Random(f"{seed}:think:{conversation}:{turn}")
        if self.kind == "exp":
            return rng.expovariate(1 / self.a) if self.a > 0 else 0.0
        return rng.uniform(self.a, self.b)

    def describe(self) -> str:
        return {"fixed": f"{self.a:g} s", "exp": f"exponential, mean {self.a:g} s",
                "uniform": f"uniform {self.a:g}..{self.b:g} s"}[self.kind]


@dataclass
class ConversationWorkload:
    """Conversations from a file (`conversations`) or made up (`synthetic`), their turns sent with the whole
    history. `count`: how many conversations a level runs (None: the load mode decides: one per user)."""

    conversations: list[Conversation] = field(default_factory=list)
    synthetic: SyntheticConversations | None = None
    path: Path | None = None
    format: str | None = None  # sharegpt | jsonl | synthetic
    skipped: int = 0
    history: History = "server"
    think: ThinkTime = field(default_factory=ThinkTime)
    count: int | None = None
    output: OutputSpec = field(default_factory=OutputSpec)
    seed: int = 0
    endpoint: str = CHAT

    kind = "conversations"

    def __post_init__(self) -> None:
        if self.synthetic is None and not self.conversations:
            raise UserError(f"{self.path}: no usable conversations in this file")
        if self.history not in HISTORIES:
            raise UserError(f"unknown history '{self.history}'", hint="use server or dataset")
        if not takes_messages(self.endpoint):
            raise UserError("multi-turn conversations are chat messages: they need an endpoint that takes them",
                            hint="use --endpoint chat, responses or messages")

    async def prepare(self, counter: PromptTokenCounter | None, needed: int | None = None) -> None:
        if self.synthetic is not None:
            await self.synthetic.prepare(counter)

    def conversation(self, i: int) -> Conversation:
        if self.synthetic is not None:
            return self.synthetic.conversation(i)
        return self.conversations[i % len(self.conversations)]

    def turn_request(self, i: int, conv: Conversation, k: int, answers: list[str], model: str, *, index: int,
                     tag: str, accepts_ignore_eos: bool = False, accepts_min_tokens: bool = False) -> RequestSpec:
        """Turn k (0-based) of conversation i, after `answers` (the answers of the turns before it)."""
        body = build_body(model, self.endpoint, history_messages(conv, k, answers), self.output,
                          max_tokens=conv.max_tokens, accepts_ignore_eos=accepts_ignore_eos,
                          accepts_min_tokens=accepts_min_tokens)
        return RequestSpec(endpoint=self.endpoint, body=body, index=index, tag=tag, conversation=i, turn=k + 1)

    def next_history(self, conv: Conversation, k: int, server_answer: str) -> str:
        """What turn k's answer is in the history of the turns after it."""
        if self.history == "dataset":
            recorded = conv.answer(k)
            if recorded is not None:
                return recorded
        return server_answer

    def request(self, index: int, model: str, *, tag: str = "", warmup: bool = False,
                accepts_ignore_eos: bool = False, accepts_min_tokens: bool = False) -> RequestSpec:
        """A single-turn request (the warm-up): a short prompt that shares no prefix with the conversations."""
        body = build_body(model, self.endpoint, [{"role": "user", "content": WARMUP_PROMPT}], self.output,
                          accepts_ignore_eos=accepts_ignore_eos, accepts_min_tokens=accepts_min_tokens)
        return RequestSpec(endpoint=self.endpoint, body=body, index=index, tag=tag, warmup=warmup)

    def describe(self, accepts_ignore_eos: bool, accepts_min_tokens: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "endpoint": self.endpoint,
                             **self.output.describe(accepts_ignore_eos, accepts_min_tokens),
                             "history": "the answers the server gave" if self.history == "server" else
                             "the dataset's recorded answers (the server's where the dataset has none)",
                             "think_time": self.think.describe(), "conversations_per_level": self.count,
                             "seed": self.seed}
        if self.synthetic is not None:
            d |= {"source": "synthetic"} | self.synthetic.describe()
        else:
            turns = [len(c.turns) for c in self.conversations]
            if not hasattr(self, "_sha256"):
                self._sha256 = file_sha256(self.path) if self.path else None
            d |= {"source": self.format, "path": str(self.path), "sha256": self._sha256,
                  "conversations": len(self.conversations), "skipped": self.skipped,
                  "turns_mean": sum(turns) / len(turns), "turns_max": max(turns)}
        return d


@dataclass
class SyntheticConversations:
    turns: int = 6
    turn_tokens: LengthSpec = field(default_factory=lambda: parse_length(64))
    system_tokens: int = 128
    seed: int = 0
    words: list[str] = field(default_factory=list, repr=False)
    counter_name: str | None = None

    def __post_init__(self) -> None:
        if self.turns < 1 or self.system_tokens < 0:
            raise UserError("synthetic conversations need at least one turn and a system prompt of 0 or more tokens")

    async def prepare(self, counter: PromptTokenCounter | None) -> None:
        if counter is None:
            raise UserError("synthetic conversations are made of words that are one token each for the served "
                            "model, and servelab knows no tokenize endpoint for this server",
                            hint="use --dataset with a conversations file instead")
        self.counter_name = counter.name
        self.words = await single_token_words(counter)

    def conversation(self, i: int) -> Conversation:
        if not self.words:
            raise RuntimeError("SyntheticConversations.prepare() must run before conversations are built")
        system = None
        if self.system_tokens:
            system = "You are a helpful assistant. Context:" + filler(
                self.words, random.Random(f"{self.seed}:system"), self.system_tokens)
        turns = []
        for k in range(self.turns):
            n = max(1, self.turn_tokens.draw(self.seed, i * 1_000_003 + k))
            words = filler(self.words, random.Random(f"{self.seed}:conversation:{i}:{k}"), n)
            turns.append(f"Question {k + 1}:{words}")
        return Conversation(turns, [None] * self.turns, system, f"synthetic conversation {i}")

    def describe(self) -> dict[str, Any]:
        return {"turns": self.turns, "turn_tokens": self.turn_tokens.describe(),
                "system_tokens": self.system_tokens,
                "prompts": f"a shared system prompt of {self.system_tokens} single-token filler words, then per "
                           f"turn 'Question k:' and its own filler words (single tokens for "
                           f"{self.counter_name}); the template's tokens come on top"}
