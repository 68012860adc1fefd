"""Workloads without a server: dataset files parsed (and malformed ones named by file and line), synthetic
prompts of exact length under a tokenizer whose counts are known, shared-prefix grouping, output-length control,
and the per-request length checks in metrics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from servelab.bench.metrics import length_control_warnings
from servelab.bench.workloads import (CHAT, COMPLETIONS, OutputSpec, SharedPrefixWorkload, SyntheticWorkload,
                                      Workload, load_dataset, parse_length)
from servelab.bench.workloads.base import build_body
from servelab.bench.workloads.filler import OPENER
from servelab.errors import UserError
from servelab.records import RequestRecord, TokenEvent, Usage

FIXTURES = Path(__file__).parent / "fixtures"


class WordCounter:
    """A tokenizer whose counts are known: one token per whitespace-separated word (two for `long_words`), a
    chat template worth TEMPLATE tokens, a BOS on a bare prompt."""

    name = "words"
    TEMPLATE = 7

    def __init__(self, long_words: tuple[str, ...] = ()):
        self.long_words = set(long_words)
        self.calls = 0

    def words(self, text: str) -> int:
        return sum(2 if w in self.long_words else 1 for w in text.split())

    async def count_prompt_tokens(self, x) -> int:
        self.calls += 1
        if isinstance(x, list):
            return self.TEMPLATE + sum(self.words(m["content"]) for m in x)
        return 1 + self.words(x)

    async def count_text_tokens(self, text: str) -> int:
        return self.words(text)


class CharCounter(WordCounter):
    """Not additive in words at all (one token per four characters)."""

    def words(self, text: str) -> int:
        return len(text) // 4


def prepared(workload, counter=None):
    asyncio.run(workload.prepare(counter or WordCounter()))
    return workload


def content_of(spec) -> str:
    return spec.body["messages"][-1]["content"] if "messages" in spec.body else spec.body["prompt"]


# ---------------------------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------------------------

def test_sharegpt_first_human_turn_is_the_prompt_and_the_next_gpt_turn_the_answer() -> None:
    w = load_dataset(FIXTURES / "sharegpt_small.json")  # format from the extension
    assert w.format == "sharegpt" and w.skipped == 1  # a3 has no human turn
    assert [it.content for it in w.items] == ["What is the capital of France?", "Name three primary colours.",
                                              "Write a haiku about rain.", "Say hello."]
    assert [it.reference_output for it in w.items] == ["The capital of France is Paris.", "Red, yellow and blue.",
                                                       w.items[2].reference_output, None]
    spec = w.request(5, "m", accepts_ignore_eos=True)  # request 5 takes item 5 mod 4 = 1
    assert spec.body["messages"] == [{"role": "user", "content": "Name three primary colours."}]
    assert spec.body["max_tokens"] == 128 and spec.body["ignore_eos"] is True


def test_sharegpt_output_lengths_from_the_answers() -> None:
    w = load_dataset(FIXTURES / "sharegpt_small.json", output_from_dataset=True)
    assert w.skipped == 2 and len(w.items) == 3  # "Say hello." has no answer to take a length from
    prepared(w)
    assert [w.request(i, "m").body["max_tokens"] for i in range(3)] == [6, 4, 16]  # words of each answer
    assert [w.request(i, "m").input_tokens for i in range(3)] == [7 + 6, 7 + 4, 7 + 5]  # template + words
    with pytest.raises(UserError, match="tokenizer"):
        asyncio.run(load_dataset(FIXTURES / "sharegpt_small.json", output_from_dataset=True).prepare(None))


def test_jsonl_prompts_messages_and_per_line_max_tokens() -> None:
    w = prepared(load_dataset(FIXTURES / "prompts.jsonl"))
    assert w.format == "jsonl" and len(w.items) == 4  # the blank line is skipped
    bodies = [w.request(i, "m").body for i in range(4)]
    assert bodies[0]["messages"] == [{"role": "user", "content": "Tell me a short story about a cat."}]
    assert [b["max_tokens"] for b in bodies] == [128, 16, 8, 128]
    assert bodies[2]["messages"][0] == {"role": "system", "content": "You are terse."}
    assert w.request(2, "m").input_tokens == 7 + 3 + 3  # template + both messages' words
    d = w.describe(False)
    assert d["items"] == 4 and len(d["sha256"]) == 64 and d["input_tokens_counted_by"] == "words"


def test_messages_cannot_go_to_the_completions_endpoint() -> None:
    with pytest.raises(UserError, match=r"prompts\.jsonl:4: chat messages"):
        load_dataset(FIXTURES / "prompts.jsonl", endpoint=COMPLETIONS)


@pytest.mark.parametrize("lines,line,needle", [
    (['{"prompt": "a"}', '{"prompt": "b"', '{"prompt": "c"}'], 2, "invalid JSON"),
    (['["a"]'], 1, "expected a JSON object"),
    (['{"prompt": "a"}', '', '{"prompt": "a", "messages": []}'], 3, "exactly one of"),
    (['{"text": "a"}'], 1, "unknown key"),
    (['{"prompt": "a", "max_tokens": -1}'], 1, "max_tokens must be a positive integer"),
    (['{"prompt": "a", "max_tokens": "8"}'], 1, "max_tokens must be a positive integer"),
    (['{"prompt": "a", "max_tokens": true}'], 1, "max_tokens must be a positive integer"),
    (['{"prompt": ""}'], 1, "non-empty string"),
    (['{"messages": "hi"}'], 1, "non-empty list"),
    (['{"messages": [{"content": "hi"}]}'], 1, "messages[0] needs a string 'role'"),
])
def test_malformed_jsonl_names_file_and_line(tmp_path: Path, lines: list[str], line: int, needle: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError) as exc:
        load_dataset(path)
    assert exc.value.message.startswith(f"{path}:{line}: ") and needle in exc.value.message, exc.value.message


@pytest.mark.parametrize("doc,needle", [
    ('[{"conversations": []},\n {"conversations": [\n', ":3:1: invalid JSON"),  # line:column of the error
    ('{"conversations": []}', "a JSON list of conversations"),
    ('[{"conversations": []}, {"turns": []}]', "item 1: expected an object with 'conversations'"),
    ('[{"conversations": {"from": "human"}}]', "item 0 (conversations): expected a list"),
    ('[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": 3}]}]',
     "item 0 (conversations[1].value): expected a string, got int"),
    ('[{"conversations": [{"from": "system", "value": "x"}]}]', "no usable prompts"),
])
def test_malformed_sharegpt_names_file_and_item(tmp_path: Path, doc: str, needle: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(doc)
    with pytest.raises(UserError) as exc:
        load_dataset(path)
    assert str(path) in exc.value.message and needle in exc.value.message, exc.value.message


def test_unreadable_dataset_files(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        load_dataset(tmp_path / "missing.jsonl")
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(UserError, match=r"latin1\.jsonl:2: not UTF-8"):
        load_dataset(latin)
    with pytest.raises(UserError, match="cannot tell the format"):
        load_dataset(tmp_path / "prompts.txt")


# ---------------------------------------------------------------------------------------------------------------
# Synthetic prompts
# ---------------------------------------------------------------------------------------------------------------

def test_synthetic_prompts_have_the_exact_length_the_tokenizer_counts() -> None:
    counter = WordCounter(long_words=("the", "water"))  # two candidates that are not single tokens here
    w = prepared(SyntheticWorkload(parse_length("uniform:20..60"), seed=3), counter)
    assert "the" not in w.words and "water" not in w.words and len(w.words) > 100
    assert w.overhead == WordCounter.TEMPLATE + len(OPENER.split())
    for i in range(50):
        spec = w.request(i, "m")
        assert 20 <= spec.input_tokens <= 60
        assert asyncio.run(counter.count_prompt_tokens(spec.body["messages"])) == spec.input_tokens
        assert content_of(spec).startswith(OPENER)
    texts = [content_of(w.request(i, "m")) for i in range(50)]
    assert len({tuple(t.split()[5:9]) for t in texts}) == 50  # distinct from the first filler words on
    again = prepared(SyntheticWorkload(parse_length("uniform:20..60"), seed=3), counter)
    assert [content_of(again.request(i, "m")) for i in range(5)] == texts[:5]  # same seed, same prompts


def test_synthetic_on_the_completions_endpoint_counts_the_bare_prompt() -> None:
    w = prepared(SyntheticWorkload(parse_length(40), endpoint=COMPLETIONS))
    spec = w.request(0, "m")
    assert spec.endpoint == COMPLETIONS and spec.input_tokens == 40
    assert asyncio.run(WordCounter().count_prompt_tokens(spec.body["prompt"])) == 40


def test_synthetic_refuses_lengths_it_cannot_build_or_check() -> None:
    with pytest.raises(UserError, match="below this workload's minimum of 13"):
        prepared(SyntheticWorkload(parse_length(12)))  # template 7 + opener 5 + one word
    with pytest.raises(UserError, match="exact"):
        prepared(SyntheticWorkload(parse_length(100)), CharCounter())
    with pytest.raises(UserError, match="tokenizer"):
        asyncio.run(SyntheticWorkload(parse_length(100)).prepare(None))
    short = prepared(SyntheticWorkload(parse_length("normal:14,30,1..")))  # draws below 13 are raised to 13
    assert min(short.request(i, "m").input_tokens for i in range(40)) == 13


def test_shared_prefix_groups_share_exactly_their_prefix() -> None:
    w = prepared(SharedPrefixWorkload(parse_length(60), groups=3, per_group=4, prefix_tokens=20))
    words = [content_of(w.request(i, "m")).split() for i in range(24)]
    assert all(len(x) == 60 - WordCounter.TEMPLATE for x in words)
    head = len(OPENER.split())
    prefix = [tuple(x[head:head + 20]) for x in words]
    assert [w.group(i) for i in range(13)] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 0]
    for i in range(24):
        for j in range(24):
            assert (prefix[i] == prefix[j]) == (w.group(i) == w.group(j))
    assert len({tuple(x[head + 20:]) for x in words}) == 24  # every suffix its own
    d = w.describe(True)
    assert d["kind"] == "shared_prefix" and d["prefix_groups"] == 3 and d["prefix_tokens"] == 20
    with pytest.raises(UserError, match="minimum of 33"):
        prepared(SharedPrefixWorkload(parse_length(30), groups=2, per_group=2, prefix_tokens=20))


@pytest.mark.parametrize("spec,lo,hi", [("uniform:10..20", 10, 20), ("normal:100,30,50..150", 50, 150),
                                        ("lognormal:200,100,20..2000", 20, 2000)])
def test_length_distributions_stay_in_bounds_and_hit_their_mean(spec: str, lo: int, hi: int) -> None:
    d = parse_length(spec)
    draws = [d.draw(1, i) for i in range(4000)]
    assert lo <= min(draws) and max(draws) <= hi
    mean = sum(draws) / len(draws)
    assert mean == pytest.approx({"uniform": 15, "normal": 100, "lognormal": 200}[d.kind], rel=0.05)
    assert [d.draw(1, i) for i in range(10)] == draws[:10]  # length i depends on (seed, i) only


@pytest.mark.parametrize("bad", ["0", "uniform:5", "uniform:9..3", "normal:100", "normal:a,b", "poisson:3",
                                 "lognormal:0,1"])
def test_bad_length_specs(bad: str) -> None:
    with pytest.raises(UserError):
        parse_length(bad)


# ---------------------------------------------------------------------------------------------------------------
# Output-length control and the per-request checks
# ---------------------------------------------------------------------------------------------------------------

def test_ignore_eos_and_min_tokens_are_sent_only_where_honoured() -> None:
    out = OutputSpec(max_tokens=32, ignore_eos=True, min_tokens=64)
    body = build_body("m", CHAT, "hi", out)
    assert "ignore_eos" not in body and "min_tokens" not in body
    body = build_body("m", CHAT, "hi", out, accepts_ignore_eos=True, accepts_min_tokens=True)
    assert body["ignore_eos"] is True and body["min_tokens"] == 32  # never above max_tokens
    assert build_body("m", CHAT, "hi", out, max_tokens=8, accepts_min_tokens=True)["min_tokens"] == 8
    assert out.describe(True, False)["min_tokens"] is None and "min_tokens_not_sent" in out.describe(True, False)
    assert Workload().describe(False)["ignore_eos"] is False  # the default workload says what it really sent


def made(index: int, *, sent: int | None = None, prompt: int | None = None, tokens: int = 4,
         completion: int | None = None, **sampling) -> RequestRecord:
    events = [TokenEvent(t_ns=i + 1, tokens=1, kind="answer") for i in range(tokens)]
    return RequestRecord(index=index, endpoint=CHAT, t_send_ns=0, t_end_ns=tokens + 1, events=events, ok=True,
                         input_tokens=sent, sampling=sampling, max_tokens=64,
                         usage=Usage(prompt_tokens=prompt, completion_tokens=completion))


def test_metrics_warn_when_input_length_or_min_tokens_was_not_honoured() -> None:
    assert length_control_warnings([made(0, sent=100, prompt=100), made(1, sent=None, prompt=7)]) == []
    (w,) = length_control_warnings([made(0, sent=100, prompt=100), made(1, sent=100, prompt=101)])
    assert "1 of 2 requests" in w and "request 1: 100 sent, 101 in usage.prompt_tokens" in w
    (w,) = length_control_warnings([made(0, tokens=4, min_tokens=8), made(1, tokens=9, min_tokens=8)])
    assert "request 0: 4 of at least 8" in w
    # The server's count wins when it has one: it sees the EOS token a client cannot.
    assert length_control_warnings([made(0, tokens=7, completion=8, min_tokens=8)]) == []


def test_describe_tells_two_runs_apart() -> None:
    a = prepared(SyntheticWorkload(parse_length(64), seed=1)).describe(True)
    b = prepared(SyntheticWorkload(parse_length("uniform:32..96"), seed=2)).describe(True)
    assert a != b and a["input_tokens"] == "64" and b["input_tokens"] == "uniform:32..96"
    json.dumps(a)  # plain data: it goes into summary.json


def test_each_bench_of_a_cell_sends_prompts_no_earlier_bench_sent() -> None:
    # An experiment benches one server again and again (trials, then the sweep after the single-stream step):
    # with the same prompts, trial 2's TTFT was a prefix-cache hit on trial 1's (58-61 of ~60 prompt tokens
    # cached, 13-42 ms against 123-521 ms). The series numbers each bench's prompts apart; cells of one round
    # share theirs, so both servers answer the same prompts.
    from servelab.bench.workloads.stories import Workload as Stories
    from servelab.pipeline import in_series

    def prompts(trial: int, step: str) -> set[str]:
        w = in_series(Stories(), trial, step)
        return {w.request(i, "m").body["messages"][-1]["content"] for i in range(20)}

    # the default steps, and steps of other modes whose names share a first letter with them
    benches = [prompts(t, step) for t in range(3) for step in ("single", "sweep", "slo-search")]
    assert all(not (a & b) for i, a in enumerate(benches) for b in benches[i + 1:])
    assert prompts(1, "sweep") == prompts(1, "sweep")  # the same bench of another cell: the same prompts
    assert in_series(Stories(), 0, "single").describe(True) == Stories().describe(True)  # the workload is the same
