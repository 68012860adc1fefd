"""The Responses and Messages stream dialects: how their requests are built, how their events are read into
records, and what each fault becomes. Replays speak the engines' real formats (tests/dialects_replay.py); the
real-engine half is tests/test_dialects_engine.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from dialects_replay import (Replay, ping, reasoning_response_events, spaced, thinking_message_events, typed)
from endpoints_fake import ANSWER, message_events, response_events
from openai_fake import serving

from servelab.bench.args import BenchArgs
from servelab.bench.client import ClientOptions, Deadlines, RequestSpec, StreamClient
from servelab.bench.metrics import NS_PER_S
from servelab.bench.options import build_options
from servelab.bench.workloads.base import MESSAGES, RESPONSES, OutputSpec, build_body
from servelab.errors import UserError
from servelab.protocol.dialects import dialect_for
from servelab.protocol.dialects.messages import read_event as read_message_event
from servelab.protocol.dialects.responses import read_event as read_response_event

GAP_S = 0.02
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "dialects"


def send(replay: Replay, endpoint: str, *scripts, options: ClientOptions | None = None, body=None):
    replay.scripts.extend(scripts)
    spec_body = body or build_body("fake", endpoint, "Say hi.", OutputSpec(max_tokens=8))

    async def go():
        async with StreamClient(url, options or ClientOptions(deadlines=Deadlines(idle_s=5, total_s=20))) as c:
            return [await c.send(RequestSpec(endpoint=endpoint, body=spec_body, index=i))
                    for i in range(len(scripts))]

    with serving(replay.app()) as url:
        return asyncio.run(go())


# ---- requests ----------------------------------------------------------------------------------------------------


def test_each_endpoint_has_its_dialect():
    assert dialect_for("/v1/chat/completions").name == "chat"
    assert dialect_for("/v1/completions").name == "completions"
    assert dialect_for("/v1/responses").name == "responses"
    assert dialect_for("/v1/messages").name == "messages"
    assert dialect_for("/proxy/v1/messages").name == "messages"


def test_bodies_follow_each_api():
    output = OutputSpec(max_tokens=20, min_tokens=5)
    chat = build_body("m", "/v1/chat/completions", "hi", output, accepts_ignore_eos=True, accepts_min_tokens=True)
    responses = build_body("m", RESPONSES, "hi", output, accepts_ignore_eos=True, accepts_min_tokens=True)
    messages = build_body("m", MESSAGES, "hi", output, accepts_ignore_eos=True, accepts_min_tokens=True)
    assert chat == {"model": "m", "max_tokens": 20, "temperature": 0.0, "ignore_eos": True, "min_tokens": 5,
                    "messages": [{"role": "user", "content": "hi"}]}
    # Responses: the plain input string and max_output_tokens; llama.cpp honours ignore_eos there (measured)
    assert responses == {"model": "m", "max_output_tokens": 20, "temperature": 0.0, "input": "hi",
                         "ignore_eos": True, "min_tokens": 5}
    # Messages: only Anthropic's fields, which is all the engines' converters keep
    assert messages == {"model": "m", "max_tokens": 20, "temperature": 0.0,
                        "messages": [{"role": "user", "content": "hi"}]}


def test_a_system_prompt_goes_apart_on_messages_and_in_the_input_list_on_responses():
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]
    messages = build_body("m", MESSAGES, conversation, OutputSpec())
    assert messages["system"] == "Be brief." and messages["messages"] == conversation[1:]
    responses = build_body("m", RESPONSES, conversation, OutputSpec())
    # each item typed, as llama.cpp needs for an assistant turn (untyped: HTTP 400 "Cannot determine type of 'item'")
    assert responses["input"] == [{"type": "message", **m} for m in conversation]


def test_the_cli_takes_responses_and_messages_and_refuses_others_in_one_line():
    for name, path in (("responses", RESPONSES), ("messages", MESSAGES)):
        assert build_options(BenchArgs(endpoint=name)).workload.endpoint == path
        assert build_options(BenchArgs(endpoint=name, input_tokens="64")).workload.endpoint == path
    with pytest.raises(UserError) as refused:
        build_options(BenchArgs(endpoint="anthropic"))
    assert "responses" in refused.value.hint and "messages" in refused.value.hint


def test_streaming_fields_and_headers_per_dialect():
    replay = Replay()
    options = ClientOptions(api_key="sk-secret", stream_extras={
        "timings_per_token": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    send(replay, RESPONSES, [typed(*response_events())], options=options)
    send(replay, MESSAGES, [typed(*message_events())], options=options)
    responses, messages = replay.requests
    assert responses["path"] == RESPONSES and messages["path"] == MESSAGES
    # stream_options is chat/completions' (usage always comes here); llama.cpp reads timings_per_token on Responses
    assert responses["body"]["stream"] is True and "stream_options" not in responses["body"]
    assert responses["body"]["timings_per_token"] is True
    assert messages["body"]["stream"] is True
    assert not {"stream_options", "timings_per_token"} & set(messages["body"])
    assert responses["headers"]["Authorization"] == "Bearer sk-secret"
    assert "x-api-key" not in {k.lower() for k in responses["headers"]}
    headers = {k.lower(): v for k, v in messages["headers"].items()}
    assert headers["x-api-key"] == "sk-secret" and headers["anthropic-version"] == "2023-06-01"
    assert headers["authorization"] == "Bearer sk-secret"  # vLLM's --api-key reads only the bearer


def test_the_key_is_in_no_record():
    replay = Replay()
    (record,) = send(replay, MESSAGES, [typed(*message_events())], options=ClientOptions(api_key="sk-secret"))
    assert record.ok and "sk-secret" not in record.model_dump_json()


# ---- reading events (pure) ---------------------------------------------------------------------------------------


def test_responses_events_read_text_usage_and_the_end():
    events = response_events(("Hel", "lo"), prompt=7)
    views = [read_response_event(e) for e in events]
    assert "".join(v.answer for v in views) == "Hello"
    assert [v.end for v in views].index(True) == len(views) - 1
    final = views[-1]
    assert final.finish_reason == "completed"
    assert (final.usage.prompt_tokens, final.usage.completion_tokens, final.usage.total_tokens) == (7, 2, 9)


def test_a_response_cut_at_max_output_tokens_ends_incomplete_with_its_reason():
    event = {"type": "response.incomplete", "response": {"status": "incomplete", "incomplete_details": {
        "reason": "max_output_tokens"}, "usage": {"input_tokens": 3, "output_tokens": 16,
                                                  "input_tokens_details": {"cached_tokens": 2}}}}
    view = read_response_event(event)
    assert view.end and view.finish_reason == "max_output_tokens"
    assert view.usage.completion_tokens == 16 and view.usage.cached_tokens == 2


def test_messages_usage_is_the_whole_prompt_and_the_last_output_count():
    # llama.cpp, the prompt's prefix in its cache: input_tokens 1 + cache_read_input_tokens 32 (measured)
    start = read_message_event({"type": "message_start", "message": {"usage": {
        "cache_read_input_tokens": 32, "input_tokens": 1, "output_tokens": 0}}})
    assert (start.usage.prompt_tokens, start.usage.cached_tokens, start.usage.completion_tokens) == (33, 32, None)
    delta = read_message_event({"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                                "usage": {"output_tokens": 8}})
    assert delta.finish_reason == "max_tokens" and delta.usage.completion_tokens == 8
    from servelab.protocol.dialects.messages import merge_usage

    merged = merge_usage(start.usage, delta.usage)
    assert (merged.prompt_tokens, merged.completion_tokens, merged.total_tokens, merged.cached_tokens) == \
        (33, 8, 41, 32)


def test_malformed_typed_events_are_parse_failures_that_say_which_part():
    replay = Replay()
    bad_delta = {"type": "response.output_text.delta", "delta": 5}
    no_type = {"delta": "x"}
    records = send(replay, RESPONSES, [typed(*response_events()[:3], bad_delta)],
                   [typed(response_events()[0]) + b"data: " + json.dumps(no_type).encode() + b"\n\n"])
    assert [r.error_kind for r in records] == ["parse", "parse"]
    assert "is not a responses stream event" in records[0].error_detail
    assert "`delta` is not a string" in records[0].error_detail
    assert "no string `type`" in records[1].error_detail


# ---- replays: timing, tokens, faults ------------------------------------------------------------------------------


def test_ttft_is_the_first_text_delta_not_the_first_event():
    replay = Replay()
    events = response_events()
    wait_s = 0.3  # "prefill": response.created and the item events arrive at once, the text after this
    script = [typed(*events[:4]), wait_s] + spaced(events[4:], GAP_S)
    (record,) = send(replay, RESPONSES, script)
    assert record.ok and record.saw_done and record.finish_reason == "completed"
    ttft_s = (record.events[0].t_ns - record.t_send_ns) / NS_PER_S
    assert wait_s <= ttft_s < wait_s + 1.0
    assert (record.t_headers_ns - record.t_send_ns) / NS_PER_S < wait_s
    assert ttft_s < (record.t_end_ns - record.t_send_ns) / NS_PER_S
    # usage only at the end (response.completed): one token per delta until a tokenizer recounts
    assert record.count_method == "chunk_count"
    assert sum(e.tokens for e in record.events) == record.usage.completion_tokens == len(ANSWER)
    assert "".join(e.text for e in record.events) == "".join(ANSWER)
    gaps = [(b.t_ns - a.t_ns) / NS_PER_S for a, b in zip(record.events, record.events[1:])]
    assert all(g >= GAP_S * 0.8 for g in gaps)  # one delta per write: each has its own time


def test_llama_cpp_running_counts_on_response_deltas_count_per_event():
    replay = Replay()
    events = response_events(("a", "b", "c"))
    for n, event in enumerate(e for e in events if e["type"] == "response.output_text.delta"):
        event["timings"] = {"predicted_n": n + 1, "cache_n": 4}
    events[-1]["response"]["usage"]["output_tokens"] = 4  # the end-of-sequence token, counted without text
    (record,) = send(replay, RESPONSES, spaced(events, 0.0))
    assert record.ok and record.count_method == "server_per_chunk"
    assert [e.tokens for e in record.events] == [1, 1, 1, 1] and record.events[-1].text == ""
    assert record.usage.cached_tokens == 4


def test_reasoning_deltas_are_counted_apart_on_both_apis():
    replay = Replay()
    thinking = ("Let", " me", " think")
    records = send(replay, RESPONSES, spaced(reasoning_response_events(thinking), 0.0))
    records += send(replay, MESSAGES, spaced(thinking_message_events(thinking), 0.0))
    for record in records:
        assert record.ok, record.error_detail
        kinds = [e.kind for e in record.events]
        assert kinds == ["reasoning"] * len(thinking) + ["answer"] * len(ANSWER)
        assert "".join(e.text for e in record.events if e.kind == "reasoning") == "".join(thinking)
        assert record.usage.completion_tokens == len(thinking) + len(ANSWER)
    assert records[0].usage.reasoning_tokens == len(thinking)


def test_an_error_event_mid_stream_fails_the_request_in_band():
    replay = Replay()
    openai_error = {"type": "error", "code": "server_error", "message": "The model crashed", "param": None}
    anthropic_error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    failed = {"type": "response.failed", "response": {"status": "failed", "error": {
        "code": "server_error", "message": "Generation failed"}}}
    records = send(replay, RESPONSES, [typed(*response_events()[:5], openai_error)],
                   [typed(*response_events()[:5], openai_error, event_lines=False)],  # data-only framing
                   [typed(*response_events()[:5], failed)])
    records += send(replay, MESSAGES, [typed(*message_events()[:3], anthropic_error)],
                    [typed(*message_events()[:3], anthropic_error, event_lines=False)])
    assert [r.error_kind for r in records] == ["in_band"] * 5
    assert "The model crashed" in records[0].error_detail and "The model crashed" in records[1].error_detail
    assert "Generation failed (server_error)" in records[2].error_detail
    assert all("Overloaded (overloaded_error)" in r.error_detail for r in records[3:])
    assert all(r.events for r in records)  # what arrived before the error is kept


def test_a_stream_without_its_end_event_fails_and_says_what_was_missing():
    replay = Replay()
    responses = response_events()
    messages = message_events()
    records = send(replay, RESPONSES, [typed(*responses[:-1])])
    records += send(replay, MESSAGES, [typed(*messages[:-1])], [typed(*messages[:-1]) + b"data: [DONE]\n\n"])
    assert [r.error_kind for r in records] == ["disconnect"] * 3
    assert records[0].error_detail == f"connection closed after {len(responses) - 1} events, before " \
                                      "response.completed"
    assert records[1].error_detail.endswith("before message_stop (its stop reason 'end_turn' had arrived)")
    assert records[2].error_detail == f"the stream sent [DONE] after {len(messages) - 1} events, before " \
                                      "message_stop"
    assert all(not r.ok and r.events for r in records)


def test_a_done_after_message_stop_is_never_read():
    replay = Replay()
    (record,) = send(replay, MESSAGES, [typed(*message_events()) + b"data: [DONE]\n\n"])
    assert record.ok and record.saw_done and record.finish_reason == "end_turn"


def test_pings_are_not_events_and_do_not_hold_the_idle_deadline_off():
    replay = Replay()
    events = message_events()
    with_pings = [typed(events[0]), ping()] + [s for e in events[1:] for s in (typed(e), ping())]
    stall = [typed(*events[:4])] + [s for _ in range(30) for s in (ping(), 0.05)]
    records = send(replay, MESSAGES, with_pings, stall,
                   options=ClientOptions(deadlines=Deadlines(idle_s=0.5, total_s=20)))
    assert records[0].ok and records[0].chunks == len(events)  # pings are not counted as events
    assert records[1].error_kind == "timeout_idle", records[1].error_detail
    waited_s = (records[1].t_end_ns - records[1].t_send_ns) / NS_PER_S
    assert 0.5 <= waited_s < 1.4  # the idle deadline, not the 1.5 s of pings


def test_an_experiment_may_bench_either_api():
    from servelab.experiment.model import BenchSettings

    single, sweep = BenchSettings(endpoint="messages").options("m")
    assert single.workload.endpoint == sweep.workload.endpoint == MESSAGES
    assert BenchSettings(endpoint="responses").options("m")[0].workload.endpoint == RESPONSES


# ---- what the real engines sent (tests/fixtures/dialects) ---------------------------------------------------------


def recorded(name: str) -> tuple[bytes, list[dict]]:
    raw = (FIXTURES / name).read_bytes()
    return raw, [json.loads(line[5:]) for line in raw.decode().splitlines() if line.startswith("data:")]


@pytest.mark.parametrize("engine", ["llamacpp-xllamacpp-2026.10.11549", "vllm-0.32.0"])
def test_the_engines_responses_streams_read_into_complete_records(engine):
    raw, events = recorded(f"{engine}-responses.sse")
    (record,) = send(Replay(), RESPONSES, [raw])
    assert record.ok and record.saw_done, record.error_detail
    done = next(e["text"] for e in events if e["type"] == "response.output_text.done")
    assert "".join(e.text for e in record.events) == done
    usage = events[-1]["response"]["usage"]
    assert (record.usage.prompt_tokens, record.usage.completion_tokens) == (usage["input_tokens"],
                                                                             usage["output_tokens"]) == (37, 8)
    assert record.output_tokens == 8  # llama.cpp: its running counts; vLLM: one token per delta here
    assert record.count_method == ("server_per_chunk" if engine.startswith("llamacpp") else "chunk_count")
    # llama.cpp says completed at the limit; vLLM says why it stopped
    assert record.finish_reason == ("completed" if engine.startswith("llamacpp") else "max_output_tokens")


@pytest.mark.parametrize("engine", ["llamacpp-xllamacpp-2026.10.11549", "vllm-0.32.0"])
def test_the_engines_messages_streams_read_into_complete_records(engine):
    raw, events = recorded(f"{engine}-messages.sse")
    (record,) = send(Replay(), MESSAGES, [raw])
    assert record.ok and record.saw_done and record.finish_reason == "max_tokens", record.error_detail
    deltas = [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(e.text for e in record.events) == "".join(deltas)
    assert record.usage.completion_tokens == 8 and record.output_tokens == len(deltas) == 8
    # the whole prompt either way: vLLM's input_tokens alone, llama.cpp's input_tokens + its cache's part
    assert record.usage.prompt_tokens == 37
