"""Responses and Messages streams beyond plain text: tool calls and refusals as token events, keep-alives sent as data,
the natural end of each API against a client tokenizer's count, streams whose tokens no event carried, and which
engine fields each engine's endpoint is sent. Replays speak the engines' real formats (tests/dialects_replay.py;
the llama.cpp tool stream in tests/fixtures/dialects was captured from a real server)."""

from __future__ import annotations

import asyncio
import json

import pytest
from dialects_replay import Replay, typed
from endpoints_fake import message_events, response_events
from test_dialects import FIXTURES, send
from test_records_file import CountingTokenizer

from servelab.bench.client import ClientOptions, Deadlines, RequestSpec, StreamClient
from servelab.bench.metrics import NS_PER_S, token_accounting_warnings
from servelab.bench.request_figures import ttft_ns
from servelab.bench.tokens import recount_with_tokenizer
from servelab.bench.workloads.base import MESSAGES, RESPONSES, OutputSpec, build_body
from servelab.engines import get_engine
from servelab.protocol.dialects import dialect_for

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_the_real_llama_cpp_messages_tool_stream_counts_its_call_as_answer_tokens():
    raw = (FIXTURES / "llamacpp-xllamacpp-2026.10.11549-messages-tools.sse").read_bytes()
    fragments = [json.loads(line[5:])["delta"]["partial_json"] for line in raw.decode().splitlines()
                 if line.startswith("data:") and "input_json_delta" in line]
    body = build_body("smollm2", MESSAGES, "What is the weather in Paris?", OutputSpec(max_tokens=20)) | {
        "tools": [{"name": "get_weather", "input_schema": WEATHER}]}
    (record,) = send(Replay(), MESSAGES, [raw], body=body)
    assert record.ok and record.finish_reason == "max_tokens", record.error_detail
    # the tool_use block's start (the call's name) and each input_json_delta are token events with no text
    assert record.count_method == "chunk_count" and record.output_tokens == 1 + len(fragments) == 8
    assert record.text == "" and ttft_ns(record) is not None and ttft_ns(record) > 0
    (call,) = record.tool_calls
    assert (call.name, json.loads(call.arguments), call.fragments) == ("get_weather", {"city": "Paris"}, 7)
    assert call.id == "fLctNZd3aeipRotiex7X3Meb8PLkgkiX"
    assert (record.tool_calls_parse, record.tool_calls_valid, record.tools_declared) == (True, True, 1)
    assert record.t_send_ns < record.t_first_tool_ns <= record.t_tool_done_ns <= record.t_end_ns
    # llama.cpp counted 20 tokens (the call's template markers too): one per event is 8, and the summary says so
    assert record.usage.completion_tokens == 20
    (warning,) = token_accounting_warnings([record])
    assert "8 counted by chunk_count, 20 in usage" in warning


def function_call_events(arguments: tuple[str, ...], *, refusal: tuple[str, ...] = ()) -> list[dict]:
    """OpenAI's Responses events for one function call (openai.types.responses: output_item.added with a
    function_call item, function_call_arguments delta and done), after a refusal's deltas when given."""
    item = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": "",
            "status": "in_progress"}
    plain = response_events(())
    head, end = plain[:2], plain[-1]
    refused = [{"type": "response.refusal.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0,
                "delta": piece} for piece in refusal]
    out = len(arguments) + 1 + len(refused)
    end["response"]["usage"] |= {"output_tokens": out, "total_tokens": 12 + out}
    return (head + refused
            + [{"type": "response.output_item.added", "output_index": 1, "item": item}]
            + [{"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 1,
                "delta": piece} for piece in arguments]
            + [{"type": "response.function_call_arguments.done", "item_id": "fc_1", "output_index": 1,
                "arguments": "".join(arguments)},
               {"type": "response.output_item.done", "output_index": 1,
                "item": item | {"arguments": "".join(arguments), "status": "completed"}},
               end])


def test_a_responses_function_call_and_a_refusal_are_token_events():
    arguments = ('{"city"', ': "Oslo"}')
    body = build_body("m", RESPONSES, "Weather in Oslo?", OutputSpec(max_tokens=20)) | {
        "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER}]}
    (record,) = send(Replay(), RESPONSES, [typed(*function_call_events(arguments, refusal=("I", " can't", " say")))],
                     body=body)
    assert record.ok, record.error_detail
    assert record.text == "I can't say"  # the refusal is what it answered
    assert record.output_tokens == 3 + 1 + len(arguments) == record.usage.completion_tokens
    (call,) = record.tool_calls
    assert (call.index, call.id, call.name, call.arguments) == (1, "call_1", "get_weather", "".join(arguments))
    assert (record.tool_calls_parse, record.tool_calls_valid) == (True, True)
    assert token_accounting_warnings([record]) == []


def test_a_stream_whose_tokens_no_event_carried_says_so_and_is_not_a_silent_zero():
    events = message_events(("Hello",))
    events[2]["delta"] = {"type": "citations_delta", "citation": {"cited_text": "Hello"}}  # a delta it does not read
    events[-2]["usage"]["output_tokens"] = 5
    (record,) = send(Replay(), MESSAGES, [typed(*events)])
    assert record.ok and record.events == [] and ttft_ns(record) is None
    (warning,) = token_accounting_warnings([record])
    assert "counted output tokens but the client read none" in warning
    assert "request 0: 5 in usage, no token event read" in warning


def test_a_natural_end_on_messages_one_short_of_usage_is_the_unseen_eos_not_a_disagreement():
    words = ("Paris", " is", " lovely")

    def one_short(stop_reason: str) -> list[dict]:
        events = message_events(words)
        events[-2]["delta"]["stop_reason"] = stop_reason
        events[-2]["usage"]["output_tokens"] = len(words) + 1  # the EOS the server counted
        return events

    records = send(Replay(), MESSAGES, [typed(*one_short("end_turn"))], [typed(*one_short("max_tokens"))])
    assert asyncio.run(recount_with_tokenizer(records, CountingTokenizer())) == 2
    assert [r.count_method for r in records] == ["client_tokenizer"] * 2
    assert [r.output_tokens for r in records] == [3, 3]
    assert token_accounting_warnings(records[:1]) == []  # ended by itself: the EOS a tokenizer cannot see
    (warning,) = token_accounting_warnings(records[1:])  # cut at the limit: one short is a real difference
    assert "3 counted by client_tokenizer, 4 in usage" in warning
    assert dialect_for(RESPONSES).natural_stops == {"completed"}


def test_a_data_only_ping_is_a_keep_alive_not_an_event():
    events = message_events()
    data_ping = b'data: {"type": "ping"}\n\n'  # no `event:` line: read from its data
    pinged = [typed(events[0]), data_ping] + [s for e in events[1:] for s in (typed(e), data_ping)]
    stall = [typed(*events[:4])] + [s for _ in range(30) for s in (data_ping, 0.05)]
    records = send(Replay(), MESSAGES, pinged, stall, options=ClientOptions(deadlines=Deadlines(idle_s=0.5,
                                                                                                total_s=20)))
    assert records[0].ok and records[0].chunks == len(events)
    assert records[1].error_kind == "timeout_idle", records[1].error_detail
    assert 0.5 <= (records[1].t_end_ns - records[1].t_send_ns) / NS_PER_S < 1.4


def test_each_engine_is_sent_only_the_length_fields_its_endpoint_reads():
    chat, responses, messages = (dialect_for(p) for p in ("/v1/chat/completions", RESPONSES, MESSAGES))
    sent = {name: {d.name: sorted(f for f in ("ignore_eos", "min_tokens") if get_engine(name).sends_field(f, d))
                   for d in (chat, responses, messages)}
            for name in ("vllm", "sglang", "llamacpp")}
    assert sent == {
        # vLLM's ResponsesRequest has ignore_eos, no min_tokens; SGLang's neither; llama.cpp takes no min_tokens
        "vllm": {"chat": ["ignore_eos", "min_tokens"], "responses": ["ignore_eos"], "messages": []},
        "sglang": {"chat": ["ignore_eos", "min_tokens"], "responses": [], "messages": []},
        "llamacpp": {"chat": ["ignore_eos"], "responses": ["ignore_eos"], "messages": []},
    }


def test_the_real_llama_cpp_responses_tool_stream_is_counted_per_event_to_its_usage():
    # captured with max_output_tokens 20: llama.cpp says `completed` though it stopped at the limit
    raw = (FIXTURES / "llamacpp-xllamacpp-2026.10.11549-responses-tools.sse").read_bytes()
    body = build_body("smollm2", RESPONSES, "What is the weather in Paris?", OutputSpec(max_tokens=20)) | {
        "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER}]}
    (record,) = send(Replay(), RESPONSES, [raw], body=body)
    assert record.ok and record.finish_reason == "completed", record.error_detail
    # no output_index on llama.cpp's call events: the item id places them; its item has no timings, the deltas do
    (call,) = record.tool_calls
    assert (call.name, json.loads(call.arguments), call.fragments) == ("get_weather", {"city": "Paris"}, 8)
    assert (record.tool_calls_parse, record.tool_calls_valid) == (True, True)
    assert record.count_method == "server_per_chunk"
    assert record.output_tokens == record.usage.completion_tokens == 20 and record.text == ""
    assert token_accounting_warnings([record]) == []


@pytest.mark.engine
def test_a_conversation_with_an_assistant_turn_streams_from_llama_cpps_responses(embedded_server):
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Say bye."}]
    body = build_body(embedded_server["model"], RESPONSES, conversation, OutputSpec(max_tokens=6))

    async def go():
        async with StreamClient(embedded_server["url"], ClientOptions(deadlines=Deadlines(total_s=60))) as client:
            return await client.send(RequestSpec(endpoint=RESPONSES, body=body))

    record = asyncio.run(go())
    assert record.ok, record.error_detail  # untyped input items: HTTP 400 "Cannot determine type of 'item'"
    assert record.text and record.usage.completion_tokens > 0
