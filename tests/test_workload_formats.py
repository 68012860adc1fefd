"""The multi-turn and trace formats (issue 16): each parser on good input and on malformed lines (one error naming
the file and the line), the history each turn sends, think times, and trace prompts whose blocks repeat exactly
where the trace's hash ids repeat. Pure: no server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.bench.options import BenchArgs, build_options
from servelab.bench.workloads.conversations import (Conversation, ConversationWorkload, ThinkTime, history_messages,
                                                    load_jsonl_conversations, load_sharegpt_conversations)
from servelab.bench.workloads.traces import TraceEntry, TraceWorkload, parse_azure_time, parse_trace
from servelab.errors import UserError

SAMPLES = Path(__file__).resolve().parent.parent / "examples" / "data"
WORDS = [f"w{i}" for i in range(50)]


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# ---- Mooncake ----------------------------------------------------------------------------------------------------

def test_mooncake_lines_are_read_in_time_order_with_seconds_and_hash_ids(tmp_path) -> None:
    path = write(tmp_path, "t.jsonl", "\n".join(json.dumps(x) for x in [
        {"timestamp": 1500, "input_length": 40, "output_length": 3, "hash_ids": [1, 2, 3]},
        {"timestamp": 500, "input_length": 20, "output_length": 0, "hash_ids": [1, 2]}]) + "\n\n")
    fmt, entries = parse_trace(path)
    assert fmt == "mooncake"
    assert [(e.t_s, e.input_tokens, e.output_tokens, e.hash_ids) for e in entries] == [
        (0.5, 20, 0, (1, 2)), (1.5, 40, 3, (1, 2, 3))]
    assert entries[0].where == f"{path}:2"


@pytest.mark.parametrize("line, says", [
    ("{not json", "invalid JSON"),
    ('{"timestamp": 1, "input_length": 5}', "missing 'output_length'"),
    ('{"timestamp": 1, "input_length": 0, "output_length": 1}', "input_length must be between 1"),
    ('{"timestamp": 1, "input_length": "ten", "output_length": 1}', "input_length must be an integer"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": 7}', "hash_ids must be a list"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1, "x"]}', "each hash id"),
    ('[1, 2]', "expected an object"),
    ('{"timestamp": NaN, "input_length": 5, "output_length": 1}', "timestamp must be finite"),
])
def test_a_malformed_mooncake_line_is_one_error_naming_file_and_line(tmp_path, line, says) -> None:
    good = json.dumps({"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]})
    path = write(tmp_path, "bad.jsonl", f"{good}\n{good}\n{line}\n")
    with pytest.raises(UserError, match=f"{path}:3: .*{says}"):
        parse_trace(path, "mooncake")


# ---- Azure and BurstGPT ------------------------------------------------------------------------------------------

def test_azure_timestamps_keep_their_seven_fraction_digits(tmp_path) -> None:
    path = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.0000001,12,0\n")
    fmt, entries = parse_trace(path)
    assert fmt == "azure" and [(e.input_tokens, e.output_tokens) for e in entries] == [(374, 44), (12, 0)]
    assert entries[1].t_s - entries[0].t_s == pytest.approx(3.3194101, abs=1e-6)
    assert parse_azure_time("2023-11-16T18:15:46Z", "x") == parse_azure_time("2023-11-16 18:15:46", "x")


@pytest.mark.parametrize("body, line, says", [
    ("TIMESTAMP,Context,GeneratedTokens\n", 1, "no 'ContextTokens' column"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,3,4\nyesterday,3,4\n", 3, "not a date"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,3\n", 2, "2 fields, the header has 3"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,3.5,4\n", 2, "ContextTokens must be"),
])
def test_a_malformed_azure_line_is_one_error_naming_file_and_line(tmp_path, body, line, says) -> None:
    path = write(tmp_path, "bad.csv", body)
    with pytest.raises(UserError, match=f"{path}:{line}: .*{says}"):
        parse_trace(path, "azure")


def test_burstgpt_rows_and_a_bad_number(tmp_path) -> None:
    header = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    path = write(tmp_path, "b.csv", header + "5,ChatGPT,472,18,490,Conversation log\n0.5,GPT-4,10,0,10,API log\n")
    fmt, entries = parse_trace(path)
    assert fmt == "burstgpt" and [(e.t_s, e.input_tokens, e.output_tokens) for e in entries] == [
        (0.5, 10, 0), (5.0, 472, 18)]
    bad = write(tmp_path, "bad.csv", header + "5,ChatGPT,472,18,490,x\nsoon,ChatGPT,1,1,2,x\n")
    with pytest.raises(UserError, match=f"{bad}:3: Timestamp must be a number"):
        parse_trace(bad, "burstgpt")


def test_a_trace_whose_format_cannot_be_told_says_how_to_name_it(tmp_path) -> None:
    path = write(tmp_path, "t.csv", "a,b\n1,2\n")
    with pytest.raises(UserError, match="cannot tell the trace format"):
        parse_trace(path)


def test_the_shipped_samples_parse() -> None:
    for name, fmt in (("mooncake-sample.jsonl", "mooncake"), ("azure-sample.csv", "azure"),
                      ("burstgpt-sample.csv", "burstgpt")):
        got, entries = parse_trace(SAMPLES / name)
        assert got == fmt and len(entries) == 200
    assert len(load_jsonl_conversations(SAMPLES / "conversations.jsonl")) == 100


# ---- trace prompts -----------------------------------------------------------------------------------------------

def prepared(entries: list[TraceEntry], block: int = 4, overhead: int = 3) -> TraceWorkload:
    w = TraceWorkload(entries=entries, block_tokens=block)
    w.words, w.overhead = WORDS, overhead  # what prepare() learns from the server's tokenizer
    return w


def test_prompt_blocks_repeat_exactly_where_hash_ids_repeat() -> None:
    w = prepared([TraceEntry(0, 3 + 10, 1, (7, 8, 9)), TraceEntry(1, 3 + 12, 1, (7, 8, 5)),
                  TraceEntry(2, 3 + 8, 1, (6, 8))])
    a, b, c = (w.prompt_words(i) for i in range(3))
    assert len(a) == 10 and len(b) == 12 and len(c) == 8  # input_length - overhead words: exact lengths
    assert a[:8] == b[:8] and a[8:10] != b[8:10]  # two shared blocks of 4, then their own third block
    assert c[:4] != a[:4] and c[4:8] == a[4:8]  # block 8 is the same words, but not a prefix: no reuse
    assert w.implied_cached() == [0, 3 + 8, 3]  # the second reuses the opener and two blocks; the third the opener


def test_implied_reuse_is_capped_by_what_the_earlier_prompt_held_and_by_length_minus_one() -> None:
    # The first prompt ends one word into its second block; the second has both blocks but can reuse 5 words.
    w = prepared([TraceEntry(0, 3 + 5, 1, (1, 2)), TraceEntry(1, 3 + 8, 1, (1, 2)), TraceEntry(2, 3 + 8, 1, (1, 2))])
    assert w.implied_cached() == [0, 3 + 5, 3 + 8 - 1]
    assert w.implied_hit_ratio() == pytest.approx((8 + 10) / (8 + 11 + 11))


def test_time_scale_scales_the_schedule() -> None:
    w = prepared([TraceEntry(10.0, 8, 1), TraceEntry(10.5, 8, 1), TraceEntry(12.0, 8, 1)])
    w.time_scale = 0.1
    assert w.offsets_ns() == [0, 50_000_000, 200_000_000]


# ---- conversations -----------------------------------------------------------------------------------------------

def test_sharegpt_conversations_keep_every_turn_and_the_system_prompt(tmp_path) -> None:
    data = [{"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "A?"},
                               {"from": "gpt", "value": "a."}, {"from": "human", "value": "B?"},
                               {"from": "human", "value": "C?"}, {"from": "gpt", "value": "c."}]},
            {"conversations": [{"from": "gpt", "value": "hello"}]}]
    convs, skipped = load_sharegpt_conversations(write(tmp_path, "s.json", json.dumps(data)))
    assert skipped == 1
    (c,) = convs
    assert (c.system, c.turns, c.answers) == ("Be brief.", ["A?", "B?", "C?"], ["a.", None, "c."])


def test_a_malformed_sharegpt_item_is_named(tmp_path) -> None:
    path = write(tmp_path, "s.json", json.dumps([{"conversations": [{"from": "human", "value": 3}]}]))
    with pytest.raises(UserError, match=r"item 0 \(conversations\[0\]\)"):
        load_sharegpt_conversations(path)


def test_jsonl_conversations(tmp_path) -> None:
    line = {"id": "x", "max_tokens": 9, "messages": [{"role": "system", "content": "S"},
                                                      {"role": "user", "content": "one"},
                                                      {"role": "assistant", "content": "1"},
                                                      {"role": "user", "content": "two"}]}
    (c,) = load_jsonl_conversations(write(tmp_path, "c.jsonl", json.dumps(line) + "\n"))
    assert (c.system, c.turns, c.answers, c.max_tokens) == ("S", ["one", "two"], ["1", None], 9)


@pytest.mark.parametrize("line, says", [
    ('{"messages": [{"role": "user", "content": "a"}', "invalid JSON"),
    ('{"prompt": "a"}', "expected an object with a 'messages' list"),
    ('{"messages": [{"role": "assistant", "content": "a"}]}', "answers no user turn"),
    ('{"messages": [{"role": "tool", "content": "a"}]}', r"messages\[0\] must be"),
    ('{"messages": [{"role": "system", "content": "a"}]}', "at least one user message"),
    ('{"messages": [{"role": "user", "content": "a"}], "max_tokens": 0}', "max_tokens must be a positive"),
])
def test_a_malformed_conversation_line_is_one_error_naming_file_and_line(tmp_path, line, says) -> None:
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    path = write(tmp_path, "c.jsonl", f"{good}\n\n{line}\n")
    with pytest.raises(UserError, match=f"{path}:3: .*{says}"):
        load_jsonl_conversations(path)


def test_each_turn_sends_the_whole_history_with_the_answers_given() -> None:
    conv = Conversation(["q1", "q2", "q3"], ["r1", None, "r3"], system="sys")
    assert history_messages(conv, 0, []) == [{"role": "system", "content": "sys"}, {"role": "user", "content": "q1"}]
    assert history_messages(conv, 2, ["s1", "s2"]) == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "s1"}, {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "s2"}, {"role": "user", "content": "q3"}]
    with pytest.raises(ValueError):
        history_messages(conv, 2, ["s1"])
    server = ConversationWorkload(conversations=[conv])
    dataset = ConversationWorkload(conversations=[conv], history="dataset")
    assert server.next_history(conv, 0, "said") == "said"
    assert dataset.next_history(conv, 0, "said") == "r1"
    assert dataset.next_history(conv, 1, "said") == "said"  # no recorded answer: the server's
    spec = server.turn_request(4, conv, 1, ["said"], "m", index=9, tag="u1")
    assert (spec.conversation, spec.turn, spec.index) == (4, 2, 9)
    assert spec.body["messages"][-2:] == [{"role": "assistant", "content": "said"}, {"role": "user", "content": "q2"}]


def test_think_times() -> None:
    assert ThinkTime.parse("1.5").draw(0, 0, 1) == 1.5
    exp = ThinkTime.parse("exp:2")
    draws = [exp.draw(0, i, 1) for i in range(2000)]
    assert exp.draw(0, 3, 1) == exp.draw(0, 3, 1) and 1.8 < sum(draws) / len(draws) < 2.2
    lo_hi = ThinkTime.parse("uniform:1..3")
    assert all(1 <= lo_hi.draw(1, i, 2) <= 3 for i in range(100))
    for bad in ("soon", "uniform:3..1", "-1", "exp:99999"):
        with pytest.raises(UserError, match="think time"):
            ThinkTime.parse(bad)


def test_bench_options_for_the_new_modes(tmp_path) -> None:
    opts = build_options(BenchArgs(mode="multiturn", users=4, turns=3, think_time="exp:1"))
    assert opts.plan.concurrency == 4 and opts.workload.synthetic.turns == 3
    trace = build_options(BenchArgs(mode="replay", endpoint=None, dataset=SAMPLES / "mooncake-sample.jsonl",
                                    block_tokens=16, time_scale=0.1))
    assert trace.workload.endpoint == "/v1/completions" and trace.workload.block_tokens == 16
    for args, says in ((BenchArgs(mode="single", users=2), "--users applies to --mode multiturn"),
                       (BenchArgs(mode="multiturn", users=2, rate="1"), "not both"),
                       (BenchArgs(mode="replay"), "needs a trace"),
                       (BenchArgs(mode="single", time_scale=2.0), "--time-scale applies"),
                       (BenchArgs(mode="multiturn", endpoint="completions"), "need --endpoint chat, responses or messages"),
                       (BenchArgs(mode="multiturn", history="dataset"), "needs a --dataset"),
                       (BenchArgs(mode="multiturn", requests=5), "use --conversations")):
        with pytest.raises(UserError, match=says):
            build_options(args)
