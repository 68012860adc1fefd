"""verify's checks of the endpoints beyond chat: embeddings, rerank, structured output, streamed tool calls, the
Responses and the Messages APIs.

Against the real engine: llama.cpp (xllamacpp) with SmolLM2, started once for this module with `--embeddings
--pooling mean` (tests/llamacpp_pooled_server.py). It serves embeddings, json_schema / json_object output (its
grammar), /v1/responses and /v1/messages; it has no reranker (SmolLM2 is not one, and none is packaged here) and
SmolLM2's chat template does not render tools, so those two checks are seen skipping for real, and their passes and
faults are checked against the fake server (openai_fake.py with endpoints_fake.py), which speaks llama.cpp's formats
as measured."""

from __future__ import annotations

import json
import math
from typing import Any

import jsonschema
import pytest
from aiohttp import web
from endpoints_fake import (ANSWER, embeddings_body, message_events, message_object, rerank_body, response_events,
                            response_object, tool_call_events, typed_sse)
from openai_fake import MODEL, FakeOpenAI, completion, error_body, json_route, serving, write_events

from servelab.records import CheckResult
from servelab.verify import CHECKS, verify
from servelab.verify.checks.rerank import RERANK_DOCUMENTS, RERANK_QUERY
from servelab.verify.checks.structured import PERSON_SCHEMA

ENDPOINT_CHECKS = ["embeddings", "rerank", "structured_output", "tool_calls_stream", "responses_api", "messages_api"]
REAL_TIMEOUT_S = 120.0  # a busy 2-core box: the checks take seconds, the deadline is for the box's load


def test_the_endpoint_checks_run_after_tool_calls_and_before_the_error_provoking_checks():
    ids = [c.id for c in CHECKS]
    at = ids.index("tool_calls")
    assert ids[at + 1:at + 1 + len(ENDPOINT_CHECKS)] == ENDPOINT_CHECKS
    # the checks that provoke errors come after every endpoint check (images, verify/checks/images.py, included)
    errors = [i for i, c in enumerate(ids) if c.startswith("error_")]
    assert errors and min(errors) > max(ids.index(c) for c in (*ENDPOINT_CHECKS, "images"))


# ---- the real engine -------------------------------------------------------------------------------------------


# pooled_engine: tests/conftest.py, shared with the embeddings bench (tests/test_bench_unary.py)


@pytest.fixture(scope="module")
def real_checks(pooled_engine) -> dict[str, CheckResult]:
    result = verify(pooled_engine["url"], model=pooled_engine["model"], only=ENDPOINT_CHECKS,
                    check_timeout_s=REAL_TIMEOUT_S)
    return {c.id: c for c in result.checks if c.id in ENDPOINT_CHECKS}


@pytest.mark.engine
def test_the_real_engine_serves_normalised_embeddings_of_its_dimension(real_checks):
    check = real_checks["embeddings"]
    # SmolLM2-135M's hidden size is 576; llama.cpp L2-normalises by default (--embd-normalize 2).
    assert check.outcome in ("pass", "warn"), check.reason
    assert check.reason.startswith("3 vectors of dimension 576, L2-normalised"), check.reason
    assert "cosine" in check.reason and "prompt tokens" in check.reason
    if check.outcome == "warn":  # a 135M chat model is no embedding model: only the similarity may be off
        assert "the near-identical inputs are not the closest" in check.reason
    assert check.request is not None and check.request["encoding_format"] == "float"


@pytest.mark.engine
def test_the_real_engine_without_a_reranker_skips_rerank_in_its_own_words(real_checks):
    check = real_checks["rerank"]
    assert check.outcome == "skip"
    assert check.reason.startswith("no rerank endpoint answers: /v1/rerank HTTP 501 (This server does not support "
                                   "reranking. Start it with `--reranking`)"), check.reason
    assert "/v1/score HTTP 404; /score HTTP 404" in check.reason
    assert "not_supported_error" in (check.response_excerpt or "")  # the telling answer, not the last 404


@pytest.mark.engine
def test_the_real_engine_constrains_output_to_the_schema(real_checks):
    check = real_checks["structured_output"]
    assert check.outcome == "pass", check.reason
    said = check.reason.split("; ")
    assert said[0].startswith("json_schema ") and said[1].startswith("json_object ")
    # the answer shown is the one validated: validate it again here
    jsonschema.validate(json.loads(json.loads(said[0].removeprefix("json_schema "))), PERSON_SCHEMA)


@pytest.mark.engine
def test_the_real_engine_drops_tools_from_smollm2s_template_so_streamed_tools_skip(real_checks):
    check = real_checks["tool_calls_stream"]
    assert check.outcome == "skip"
    assert check.reason.startswith("the server ignored `tools`: the prompt is ")
    assert "no tool_calls deltas; text " in check.reason
    assert check.response_excerpt and "data: [DONE]" in check.response_excerpt


@pytest.mark.engine
def test_the_real_engine_serves_the_responses_api_with_typed_events_and_usage(real_checks):
    check = real_checks["responses_api"]
    assert check.outcome == "pass", check.reason
    assert "streamed usage " in check.reason
    events = check.reason.split("events: ", 1)[1]
    assert events.startswith("response.created, response.in_progress, response.output_item.added, "
                             "response.content_part.added, response.output_text.delta")
    assert events.endswith("response.output_text.done, response.content_part.done, response.output_item.done, "
                           "response.completed")
    assert check.response_excerpt and check.response_excerpt.startswith("event: response.created\ndata: ")


@pytest.mark.engine
def test_the_real_engine_serves_the_messages_api_in_anthropics_event_order(real_checks):
    check = real_checks["messages_api"]
    assert check.outcome == "pass", check.reason
    events = check.reason.split("events: ", 1)[1]
    assert events.startswith("message_start, content_block_start, content_block_delta")
    assert events.endswith("content_block_stop, message_delta, message_stop")
    # llama.cpp counts the prompt prefix its cache held apart, as Anthropic does (cache_read_input_tokens)
    assert "streamed usage " in check.reason and " output tokens" in check.reason


@pytest.mark.engine
def test_llama_cpp_started_without_embeddings_skips_in_its_own_words(embedded_server):
    result = verify(embedded_server["url"], model=embedded_server["model"], only=["embeddings"],
                    check_timeout_s=REAL_TIMEOUT_S)
    check = next(c for c in result.checks if c.id == "embeddings")
    assert check.outcome == "skip"
    assert check.reason == ("the server does not serve embeddings: HTTP 501: This server does not support embeddings. "
                            "Start it with `--embeddings`")


# ---- vLLM's pooling runner (slow tier) -------------------------------------------------------------------------

# vllm_pooling: tests/conftest.py, shared with the embeddings and rerank bench (tests/test_bench_unary.py)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_vllms_pooling_runner_passes_embeddings_and_orders_the_rerank_pair(vllm_pooling):
    result = verify(vllm_pooling["url"], model=vllm_pooling["model"], only=ENDPOINT_CHECKS,
                    check_timeout_s=REAL_TIMEOUT_S)
    checks = {c.id: c for c in result.checks if c.id in ENDPOINT_CHECKS}
    embeddings = checks["embeddings"]
    assert embeddings.outcome in ("pass", "warn"), embeddings.reason
    assert embeddings.reason.startswith("3 vectors of dimension 576, L2-normalised"), embeddings.reason
    rerank = checks["rerank"]
    assert rerank.outcome == "pass", rerank.reason  # measured: Paris 0.63 above bananas 0.53
    assert rerank.reason.startswith("/v1/rerank: the Paris document scored ")
    assert "`results` with relevance_score, results sorted by score" in rerank.reason
    # No chat on a pooling runner: every chat-based check is skipped with vLLM's 404, none fails.
    for check_id in ("structured_output", "tool_calls_stream", "responses_api", "messages_api"):
        assert checks[check_id].outcome == "skip" and "HTTP 404: Not Found" in checks[check_id].reason, check_id


# ---- the fake server, in llama.cpp's formats, broken one part at a time ------------------------------------------


def run(fake: FakeOpenAI | web.Application, only: list[str]) -> dict[str, CheckResult]:
    app = fake.app() if isinstance(fake, FakeOpenAI) else fake
    with serving(app) as url:
        result = verify(url, model=MODEL, only=only, check_timeout_s=20)
    return {c.id: c for c in result.checks if c.reason != "not selected"}


def test_the_fake_server_passes_each_endpoint_check_saying_what_it_saw():
    checks = run(FakeOpenAI(), ENDPOINT_CHECKS)
    assert {i: c.outcome for i, c in checks.items()} == dict.fromkeys(ENDPOINT_CHECKS, "pass"), \
        {i: c.reason for i, c in checks.items()}
    assert checks["embeddings"].reason.startswith("3 vectors of dimension 16, L2-normalised")
    assert checks["rerank"].reason.startswith("/v1/rerank: the Paris document scored 1, above bananas 0")
    assert "`results` with relevance_score, results sorted by score" in checks["rerank"].reason
    assert checks["tool_calls_stream"].reason.startswith(
        '1 streamed tool call(s): get_weather({"city": "Paris"}), arguments in 3 fragment(s)')
    assert checks["structured_output"].reason == ('json_schema "{\\"name\\": \\"Pip\\", \\"age\\": 7}"; '
                                                  'json_object "{\\"answer\\": 4}"')


def embeddings_route(transform) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        return web.json_response(transform(embeddings_body(body["input"])), dumps=json.dumps)
    return handler


def test_embeddings_of_different_dimensions_fail_and_the_count_is_checked():
    def shorten_last(body):
        body["data"][2]["embedding"] = body["data"][2]["embedding"][:8]
        return body

    def drop_one(body):
        body["data"].pop()
        return body

    assert run(FakeOpenAI(embeddings=embeddings_route(shorten_last)), ["embeddings"])["embeddings"].reason == \
        "the vectors have different dimensions: 8, 16"
    assert run(FakeOpenAI(embeddings=embeddings_route(drop_one)), ["embeddings"])["embeddings"].reason == \
        "2 embeddings for 3 inputs"


def test_embeddings_out_of_order_warn_and_non_finite_values_fail():
    def reverse(body):
        body["data"].reverse()
        return body

    def nan(body):
        body["data"][1]["embedding"][3] = math.nan  # json.dumps writes NaN, and Python's json reads it back
        return body

    shuffled = run(FakeOpenAI(embeddings=embeddings_route(reverse)), ["embeddings"])["embeddings"]
    assert shuffled.outcome == "warn"
    assert "data is in index order [2, 1, 0], not in input order" in shuffled.reason
    assert "3 vectors of dimension 16" in shuffled.reason  # read by index: the vectors are still judged
    broken = run(FakeOpenAI(embeddings=embeddings_route(nan)), ["embeddings"])["embeddings"]
    assert (broken.outcome, broken.reason) == ("fail", "data[1].embedding has 1 value(s) that are not finite numbers")


def test_unnormalised_embeddings_are_stated_and_a_pooling_refusal_skips_in_llamas_words():
    async def raw(request: web.Request) -> web.StreamResponse:
        return web.json_response(embeddings_body((await request.json())["input"], normalise=False))

    plain = run(FakeOpenAI(embeddings=raw), ["embeddings"])["embeddings"]
    assert plain.outcome == "pass" and "not L2-normalised (norms " in plain.reason
    words = "Pooling type 'none' is not OAI compatible. Please use a different pooling type"  # llama.cpp, measured
    refused = run(FakeOpenAI(embeddings=json_route(error_body(words), 400)), ["embeddings"])["embeddings"]
    assert (refused.outcome, refused.reason) == ("skip", f"the server does not serve embeddings: HTTP 400: {words}")


def test_a_reranker_that_scores_the_bananas_above_paris_fails():
    wrong = rerank_body(RERANK_QUERY, list(RERANK_DOCUMENTS), reverse=True)
    check = run(FakeOpenAI(rerank=json_route(wrong)), ["rerank"])["rerank"]
    assert check.outcome == "fail"
    assert "wrong order: the bananas document scored 1, above the Paris document 0" in check.reason


def test_rerank_reads_sglangs_bare_list_and_falls_back_to_vllms_score_endpoint():
    sglang = [{"score": 0.91, "document": RERANK_DOCUMENTS[1], "index": 1, "meta_info": {}},
              {"score": 0.02, "document": RERANK_DOCUMENTS[0], "index": 0, "meta_info": {}}]
    check = run(FakeOpenAI(rerank=json_route(sglang)), ["rerank"])["rerank"]
    assert check.outcome == "pass" and "a bare list (SGLang's shape), results sorted by score" in check.reason

    seen: list[dict[str, Any]] = []

    async def score(request: web.Request) -> web.StreamResponse:  # vLLM's /score answer, in document order
        seen.append(await request.json())
        return web.json_response({"id": "score-1", "object": "list", "created": 1, "model": MODEL,
                                  "data": [{"index": 0, "object": "score", "score": 0.01},
                                           {"index": 1, "object": "score", "score": 0.97}],
                                  "usage": {"prompt_tokens": 20, "total_tokens": 20, "completion_tokens": 0}})

    app = web.Application()
    app.router.add_post("/score", score)
    check = run(app, ["rerank"])["rerank"]
    assert check.outcome == "pass", check.reason
    assert check.reason.startswith("/score: the Paris document scored 0.97, above bananas 0.01")
    assert "results in document order" in check.reason
    assert seen == [{"model": MODEL, "text_1": RERANK_QUERY, "text_2": list(RERANK_DOCUMENTS)}]


def test_a_server_that_ignores_response_format_fails_with_the_prose_it_wrote():
    async def prose(request: web.Request) -> web.StreamResponse:
        return web.json_response(completion("Sure! Pip is seven years old."))

    check = run(FakeOpenAI(structured=prose), ["structured_output"])["structured_output"]
    assert check.outcome == "fail"
    assert 'json_schema: the answer is not JSON (Expecting value at char 0), so the server ignored response_format: ' \
           '"Sure! Pip is seven years old."' in check.reason
    assert check.response_excerpt and "Sure! Pip" in check.response_excerpt


def test_json_that_breaks_the_schema_fails_and_a_refusal_skips_in_the_servers_words():
    async def ageless(request: web.Request) -> web.StreamResponse:
        return web.json_response(completion(json.dumps({"name": "Pip", "age": "seven"})))

    check = run(FakeOpenAI(structured=ageless), ["structured_output"])["structured_output"]
    assert check.outcome == "fail"
    assert "json_schema: 1 schema violation(s), first at age: \"'seven' is not of type 'integer'\"" in check.reason
    refused = run(FakeOpenAI(structured=json_route(error_body("response_format is not supported"), 400)),
                  ["structured_output"])["structured_output"]
    assert refused.outcome == "skip"
    assert refused.reason == ("the server refuses response_format: json_schema: HTTP 400: response_format is not "
                              "supported; json_object: HTTP 400: response_format is not supported")


def streamed_tools(**kwargs: Any) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await write_events(request, tool_call_events(await request.json(), **kwargs))
    return handler


def test_streamed_tool_arguments_that_do_not_reassemble_into_json_fail():
    check = run(FakeOpenAI(tools_stream=streamed_tools(fragments=('{"city": "Pa', 'ris"'))),
                ["tool_calls_stream"])["tool_calls_stream"]
    assert check.outcome == "fail"
    assert "tool call 1: arguments are not valid JSON" in check.reason and '"{\\"city\\": \\"Paris\\""' in check.reason


def test_a_streamed_call_to_an_undeclared_tool_fails_and_a_stop_finish_warns():
    check = run(FakeOpenAI(tools_stream=streamed_tools(name="get_time", finish="stop")),
                ["tool_calls_stream"])["tool_calls_stream"]
    assert check.outcome == "fail"
    assert "tool call 1 names 'get_time', which is not an offered tool" in check.reason
    assert "finish_reason is 'stop', OpenAI says 'tool_calls'" in check.reason


def test_tool_call_deltas_without_an_index_fail():
    async def no_index(request: web.Request) -> web.StreamResponse:
        events = tool_call_events(await request.json())
        for event in events:
            if isinstance(event, dict) and event["choices"] and "tool_calls" in event["choices"][0]["delta"]:
                del event["choices"][0]["delta"]["tool_calls"][0]["index"]
        return await write_events(request, events)

    check = run(FakeOpenAI(tools_stream=no_index), ["tool_calls_stream"])["tool_calls_stream"]
    assert check.outcome == "fail"
    assert "a tool_calls delta has index None: streaming clients join fragments by it" in check.reason


def typed_route(events: list[dict[str, Any]], *, event_lines: bool = True, plain: dict[str, Any]) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):
            return web.json_response(plain)
        return web.Response(body=typed_sse(events, event_lines=event_lines),
                            headers={"Content-Type": "text/event-stream"})
    return handler


def test_a_responses_stream_without_its_completed_event_fails_and_one_without_event_lines_warns():
    plain = response_object("".join(ANSWER), 12, len(ANSWER))
    cut = run(FakeOpenAI(responses=typed_route(response_events()[:-1], plain=plain)), ["responses_api"])
    assert cut["responses_api"].outcome == "fail"
    assert "no response.completed or response.incomplete event; the stream went response.created, " \
           "response.in_progress" in cut["responses_api"].reason
    unnamed = run(FakeOpenAI(responses=typed_route(response_events(), event_lines=False, plain=plain)),
                  ["responses_api"])["responses_api"]
    assert unnamed.outcome == "warn"
    assert "12 of 12 event(s) have no `event:` line naming their type" in unnamed.reason


def test_a_response_without_usage_fails_and_a_missing_route_skips():
    plain = response_object("".join(ANSWER), 12, len(ANSWER))
    del plain["usage"]
    check = run(FakeOpenAI(responses=typed_route(response_events(), plain=plain)), ["responses_api"])["responses_api"]
    assert check.outcome == "fail" and check.reason.split("; ")[2] == "the response has no usage object"
    missing = run(FakeOpenAI(responses=json_route(error_body("File Not Found", "not_found_error"), 404)),
                  ["responses_api"])["responses_api"]
    assert (missing.outcome, missing.reason) == ("skip", "the server does not serve the Responses API: HTTP 404: "
                                                         "File Not Found")


def test_messages_events_out_of_anthropics_order_fail():
    events = message_events()
    events[-2], events[-3] = events[-3], events[-2]  # message_delta before content_block_stop
    plain = message_object("".join(ANSWER), 12, len(ANSWER))
    check = run(FakeOpenAI(messages=typed_route(events, plain=plain)), ["messages_api"])["messages_api"]
    assert check.outcome == "fail"
    assert "message_delta while block 0 is open" in check.reason
    assert "message_delta is not the last event before message_stop" in check.reason


def test_a_message_with_an_unknown_stop_reason_fails_and_a_missing_route_skips():
    plain = message_object("".join(ANSWER), 12, len(ANSWER), stop_reason="stop")  # OpenAI's word, not Anthropic's
    check = run(FakeOpenAI(messages=typed_route(message_events(), plain=plain)), ["messages_api"])["messages_api"]
    assert check.outcome == "fail"
    assert "stop_reason is 'stop', expected one of end_turn, max_tokens, stop_sequence" in check.reason
    app = web.Application()  # no /v1/messages at all: aiohttp's own 404
    missing = run(app, ["messages_api"])["messages_api"]
    assert missing.outcome == "skip" and missing.reason.startswith("the server does not serve the Messages API: "
                                                                   "HTTP 404")


def test_streamed_tools_refused_as_vllm_refuses_them_without_a_parser_skip_in_its_words():
    words = 'tool_choice="required" requires --tool-call-parser to be set'  # vLLM 0.32's answer, measured
    check = run(FakeOpenAI(tools_stream=json_route(error_body(words, "BadRequestError"), 400)),
                ["tool_calls_stream"])["tool_calls_stream"]
    assert (check.outcome, check.reason) == ("skip", f"the server refuses streamed tools: HTTP 400: {words}")
    assert check.response_excerpt and "BadRequestError" in check.response_excerpt


def test_a_streamed_call_cut_at_max_tokens_inside_its_arguments_only_warns():
    # vLLM's streaming tool parsers send a call as the model writes it: at the budget it ends mid-arguments.
    check = run(FakeOpenAI(tools_stream=streamed_tools(fragments=('[{"name": "Pa', 'ris", "desc'), finish="length")),
                ["tool_calls_stream"])["tool_calls_stream"]
    assert check.outcome == "warn", check.reason
    assert ("tool call 1: the stream was cut at max_tokens=48 inside its arguments (finish_reason length), so they "
            "could not be parsed") in check.reason
    assert "finish_reason is 'length', OpenAI says 'tool_calls'" in check.reason


def test_a_responses_endpoint_that_streams_a_request_without_stream_fails_and_the_stream_is_still_judged():
    # transformers serve 5.24, measured: /v1/responses answers SSE (data: lines only) whether or not stream is asked
    async def always_streams(request: web.Request) -> web.StreamResponse:
        return web.Response(body=typed_sse(response_events(), event_lines=False),
                            headers={"Content-Type": "text/event-stream"})

    check = run(FakeOpenAI(responses=always_streams), ["responses_api"])["responses_api"]
    assert check.outcome == "fail"
    assert check.reason.startswith('streamed "The answer is 4." in 12 events; a request without `stream` (OpenAI\'s '
                                   'default: not streamed) was answered with an SSE stream, not a Response object; '
                                   'nor with `stream: false`; 12 of 12 event(s) have no `event:` line'), check.reason

    async def streams_unless_told(request: web.Request) -> web.StreamResponse:  # what transformers serve does
        if (await request.json()).get("stream") is False:
            return web.json_response(response_object("".join(ANSWER), 12, len(ANSWER)))
        return await always_streams(request)

    check = run(FakeOpenAI(responses=streams_unless_told), ["responses_api"])["responses_api"]
    assert check.outcome == "fail"
    assert check.reason.startswith('answer "The answer is 4."; streamed "The answer is 4." in 12 events; a request '
                                   'without `stream`'), check.reason
    assert "with `stream: false` it answers one" in check.reason
