"""The checks beyond the story's, against the fake OpenAI server (openai_fake.py) broken in one part at a time:
each known engine deviation (transformers serve's framing, llama-cpp-python's interrupted streams, reasoning in
content, …) and each fault must come out as the outcome docs/verify.md promises, with the reason naming it."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

from aiohttp import web
from openai_fake import (MODEL, FakeOpenAI, chunk, completion, error_body, json_route, recite, serving, sse, usage,
                         words_of, write_events)
from typer.testing import CliRunner

from servelab.cli import app as cli_app
from servelab.records import CheckResult
from servelab.verify import CHECKS, verify


def run(fake: FakeOpenAI, only: list[str] | None = None, **kwargs: Any) -> dict[str, CheckResult]:
    with serving(fake.app()) as url:
        result = verify(url, only=only, check_timeout_s=kwargs.pop("check_timeout_s", 20), **kwargs)
    return {c.id: c for c in result.checks if c.reason != "not selected"}


def test_the_fake_server_passes_every_check_and_has_no_reasoning_to_show():
    checks = run(FakeOpenAI())
    assert [c.id for c in CHECKS] == list(checks)
    outcomes = {i: c.outcome for i, c in checks.items()}
    assert outcomes.pop("reasoning") == "skip"
    assert set(outcomes.values()) == {"pass"}, {i: c.reason for i, c in checks.items() if c.outcome != "pass"}
    assert "café" in checks["stream_framing"].reason and "non-ASCII character(s) arrived intact" in \
        checks["stream_framing"].reason
    assert checks["reasoning"].reason.startswith("the model shows no reasoning")
    for c in checks.values():  # every check shows what it sent (models sends a GET, which has no body)
        assert c.id == "models" or c.request is not None, c.id
        assert c.response_excerpt, c.id


# ---- streaming framing: transformers serve and llama-cpp-python as measured (shared/research/env.md) ----------------


class TransformersServe(FakeOpenAI):
    """No [DONE]; usage inside the chunk with finish_reason whether or not include_usage was asked."""

    async def stream(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        pieces, finish = recite(body)
        events: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": p}) for p in pieces]
        events.append(chunk({}, finish, usage=usage(words_of(body), len(pieces))))
        return await write_events(request, events)


def test_transformers_serve_framing_fails_for_missing_done_and_warns_about_usage_placement():
    checks = run(TransformersServe(), only=["stream_framing", "concurrency", "openai_sdk"])
    framing = checks["stream_framing"]
    assert framing.outcome == "fail"
    assert "the stream ended without `data: [DONE]`" in framing.reason
    assert "usage inside the chunk with finish_reason, not in a final chunk of its own" in framing.reason
    assert framing.response_excerpt is not None and '"usage"' in framing.response_excerpt
    # The same deviation on every concurrent stream is the server's way, not an interruption: a warning there.
    assert checks["concurrency"].outcome == "warn"
    assert "no stream ended with [DONE]" in checks["concurrency"].reason
    assert checks["openai_sdk"].outcome == "pass"  # the SDK reads to the connection's end


class NoStreamUsage(FakeOpenAI):
    """llama-cpp-python: a correct stream, but no usage even when stream_options.include_usage asks for it."""

    async def stream(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        pieces, finish = recite(body)
        events: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": p}) for p in pieces] + [chunk({}, finish), "[DONE]"]
        return await write_events(request, events)


def test_a_stream_without_the_usage_asked_for_fails_framing_but_only_warns_the_story_check():
    checks = run(NoStreamUsage(), only=["chat_stream", "stream_framing", "max_tokens", "usage"])
    assert checks["chat_stream"].outcome == "warn"
    assert checks["stream_framing"].outcome == "fail"
    assert "no usage despite stream_options.include_usage" in checks["stream_framing"].reason
    # Where usage is missing, the streamed finish_reason is still judged, and said to be uncounted.
    assert checks["max_tokens"].outcome == "pass" and "streamed: no usage to count" in checks["max_tokens"].reason
    assert checks["usage"].outcome == "pass" and "the stream carried no usage" in checks["usage"].reason


class SplitsCharacters(FakeOpenAI):
    """Sends the two bytes of é in two events, as raw invalid UTF-8."""

    async def stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        head, tail = "é".encode()[:1], "é".encode()[1:]
        await response.write(sse(chunk({"role": "assistant", "content": "caf"})))
        await response.write(b'data: {"choices": [{"index": 0, "delta": {"content": "' + head + b'"}}]}\n\n')
        await response.write(b'data: {"choices": [{"index": 0, "delta": {"content": "' + tail + b'"}}]}\n\n')
        await response.write(sse(chunk({}, "stop"), chunk(usage=usage(5, 3)), "[DONE]"))
        await response.write_eof()
        return response


def test_a_multibyte_character_split_between_events_fails_framing():
    framing = run(SplitsCharacters(), only=["stream_framing"])["stream_framing"]
    assert framing.outcome == "fail"
    assert "the body is not valid UTF-8" in framing.reason
    assert "U+FFFD at character 3: a multi-byte character was split between events" in framing.reason


class EventFields(FakeOpenAI):
    """Named events and a stray line: valid SSE apart from the stray line, but not what OpenAI sends."""

    async def stream(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        pieces, finish = recite(body)
        raw = b"event: message\n" + sse(chunk({"role": "assistant", "content": "".join(pieces)})) + \
            b"garbage line\n\n" + sse(chunk({}, finish), chunk(usage=usage(words_of(body), len(pieces))), "[DONE]")
        return web.Response(body=raw, headers={"Content-Type": "text/event-stream"})


def test_lines_other_than_data_are_named():
    framing = run(EventFields(), only=["stream_framing"])["stream_framing"]
    assert framing.outcome == "fail"
    assert "1 line(s) are not SSE fields" in framing.reason
    assert "lines other than `data:` (1 `event:`)" in framing.reason


# ---- concurrency: llama-cpp-python's interrupt_requests=True ---------------------------------------------------------


class InterruptsStreams(FakeOpenAI):
    """A running stream ends with [DONE], no finish_reason and no error as soon as a newer request arrives
    (llama-cpp-python's default, app.py: `if interrupt_requests and llama_outer_lock.locked()`)."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals = itertools.count(1)
        self.latest = 0

    async def stream(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        mine = self.latest = next(self.arrivals)
        pieces, finish = recite(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse(chunk({"role": "assistant", "content": ""})))
        for piece in pieces:
            await asyncio.sleep(0.02)
            if self.latest != mine:
                await response.write(sse("[DONE]"))
                return response
            await response.write(sse(chunk({"content": piece})))
        await response.write(sse(chunk({}, finish), chunk(usage=usage(words_of(body), len(pieces))), "[DONE]"))
        return response


def test_interrupted_streams_fail_the_concurrency_check():
    checks = run(InterruptsStreams(), only=["concurrency", "chat_stream"])
    assert checks["chat_stream"].outcome == "pass"  # one stream alone is fine
    concurrency = checks["concurrency"]
    assert concurrency.outcome == "fail"
    assert "ended without a finish_reason" in concurrency.reason and "and [DONE]" in concurrency.reason
    assert concurrency.reason.startswith("1 of 4 streams reached a finish_reason")
    assert concurrency.response_excerpt is not None and concurrency.response_excerpt.startswith("stream ")


def test_the_number_of_concurrent_streams_is_a_parameter():
    fake = FakeOpenAI()
    checks = run(fake, only=["concurrency"], concurrency=6)
    assert checks["concurrency"].reason.startswith("6 of 6 streams reached a finish_reason")
    assert sum(1 for r in fake.requests if r["body"].get("stream")) == 6


# ---- limits --------------------------------------------------------------------------------------------------------


class IgnoresLimits(FakeOpenAI):
    """Generates 12 words whatever max_tokens says, and never stops at a stop sequence."""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        pieces, _ = recite(body | {"max_tokens": 12, "stop": None})
        return web.json_response(completion("".join(pieces), "length", words_of(body), len(pieces)))

    async def stream(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        pieces, _ = recite(body | {"max_tokens": 12, "stop": None})
        events: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": p}) for p in pieces]
        events += [chunk({}, "length"), chunk(usage=usage(words_of(body), len(pieces))), "[DONE]"]
        return await write_events(request, events)


def test_a_server_that_ignores_max_tokens_and_stop_fails_both_checks():
    checks = run(IgnoresLimits(), only=["max_tokens", "stop"])
    assert checks["max_tokens"].outcome == "fail"
    assert "plain: 12 completion tokens, more than max_tokens 8" in checks["max_tokens"].reason
    assert "streamed: 12 completion tokens, more than max_tokens 8" in checks["max_tokens"].reason
    stop = checks["stop"]
    assert stop.outcome == "fail"
    assert 'plain: the stop sequence "time" was emitted at character 12' in stop.reason
    assert "streamed: the stop sequence" in stop.reason
    assert "finish_reason is 'length', expected 'stop'" in stop.reason
    assert stop.request is not None and stop.request["stop"] == ["time"]


class LeaksStopStart(FakeOpenAI):
    """Stops at the stop sequence in plain answers, but a stream lets its first two characters out first."""

    async def stream(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        pieces, finish = recite(body)
        if body.get("stop"):
            pieces = pieces + [body["stop"][0][:2]]
        events: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": p}) for p in pieces]
        events += [chunk({}, finish), chunk(usage=usage(words_of(body), len(pieces))), "[DONE]"]
        return await write_events(request, events)


def test_a_partial_stop_sequence_leaking_from_a_stream_fails():
    stop = run(LeaksStopStart(), only=["stop"])["stop"]
    assert stop.outcome == "fail"
    assert stop.reason.endswith('streamed: the start of the stop sequence, "ti", was emitted')


# ---- usage ---------------------------------------------------------------------------------------------------------


class OvercountsUsage(FakeOpenAI):
    """Reports twice the completion tokens it generated (and a total that does not add up, streamed)."""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        pieces, finish = recite(body)
        return web.json_response(completion("".join(pieces), finish, words_of(body), 2 * len(pieces)))

    async def stream(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        pieces, finish = recite(body)
        events: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": p}) for p in pieces]
        events += [chunk({}, finish), chunk(usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 5}),
                   "[DONE]"]
        return await write_events(request, events)


def test_usage_that_does_not_add_up_or_match_the_tokenizer_fails():
    checks = run(OvercountsUsage(), only=["usage", "usage_count"])
    assert checks["usage"].outcome == "fail"
    assert "the stream usage does not add up: prompt_tokens 1 + completion_tokens 1 != total_tokens 5" in \
        checks["usage"].reason
    count = checks["usage_count"]
    assert count.outcome == "fail"
    assert "completion_tokens 48, llama.cpp /tokenize counts 24 for the answer: off by 24" in count.reason


def test_without_a_tokenizer_endpoint_usage_count_is_skipped_saying_what_was_tried():
    async def missing(request: web.Request) -> web.StreamResponse:
        return web.json_response(error_body("not found", "not_found_error"), status=404)
    count = run(FakeOpenAI(tokenize=missing), only=["usage_count"])["usage_count"]
    assert count.outcome == "skip"
    assert count.reason.startswith("no tokenizer endpoint to count with (tried /extras/tokenize, /tokenize)")


# ---- determinism ---------------------------------------------------------------------------------------------------


class Drifts(FakeOpenAI):
    """Every answer differs a little from the one before, as a sampler that ignores temperature 0 would."""

    def __init__(self) -> None:
        super().__init__()
        self.served = itertools.count()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        pieces, finish = recite(body)
        return web.json_response(completion("".join(pieces) + f" #{next(self.served)}", finish, words_of(body),
                                            len(pieces) + 1))


def test_sequential_differences_fail_and_concurrent_ones_only_warn_with_the_count():
    checks = run(Drifts(), only=["determinism", "determinism_concurrent"])
    assert checks["determinism"].outcome == "fail"
    assert "3 distinct texts in 3 repeats" in checks["determinism"].reason
    concurrent = checks["determinism_concurrent"]
    assert concurrent.outcome == "warn"
    assert concurrent.reason.startswith("4 simultaneous requests gave 4 distinct text(s); 4 of 4 differ from the "
                                        "sequential answer")


# ---- reasoning -----------------------------------------------------------------------------------------------------

THOUGHT = "The user asks for 17 + 25. 17 + 25 = 42."


class ThinksInContent(FakeOpenAI):
    """A server without a reasoning parser (llama-cpp-python, TGI): the thoughts stay in content."""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(completion(f"<think>{THOUGHT}</think>42", "stop", 20, 30))


class SeparatesReasoning(FakeOpenAI):
    """vLLM >= 0.11: message.reasoning and delta.reasoning, counted in completion_tokens_details when
    `reasoning_tokens` is given."""

    def __init__(self, reasoning_tokens: int | None) -> None:
        super().__init__()
        self.reasoning_tokens = reasoning_tokens

    def usage(self) -> dict[str, Any]:
        counted = usage(20, 30)
        if self.reasoning_tokens is not None:
            counted["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return counted

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = completion("42", "stop", usage=self.usage())
        body["choices"][0]["message"]["reasoning"] = THOUGHT
        return web.json_response(body)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        events: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": ""}), chunk({"reasoning": THOUGHT}),
                                              chunk({"content": "42"}), chunk({}, "stop"), chunk(usage=self.usage()),
                                              "[DONE]"]
        return await write_events(request, events)


def test_reasoning_inside_content_fails():
    reasoning = run(ThinksInContent(), only=["reasoning"])["reasoning"]
    assert reasoning.outcome == "fail"
    assert 'reasoning arrived inside content: "<think>" at character 0' in reasoning.reason


def test_reasoning_in_its_own_field_and_counted_passes():
    reasoning = run(SeparatesReasoning(reasoning_tokens=12), only=["reasoning"])["reasoning"]
    assert reasoning.outcome == "pass", reasoning.reason
    assert "reasoning in message.reasoning" in reasoning.reason and "12 reasoning tokens counted" in reasoning.reason


def test_reasoning_that_is_not_counted_is_a_warning():
    reasoning = run(SeparatesReasoning(reasoning_tokens=None), only=["reasoning"])["reasoning"]
    assert reasoning.outcome == "warn"
    assert "usage has no reasoning_tokens" in reasoning.reason


# ---- tool calls ----------------------------------------------------------------------------------------------------


def tool_answer(arguments: str, **message: Any) -> dict[str, Any]:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    body = completion("", "tool_calls", 60, 9)
    body["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [call]} | message
    return body


def test_tool_call_arguments_that_are_not_json_fail():
    checks = run(FakeOpenAI(tools=json_route(tool_answer("{'city': 'Paris'"))), only=["tool_calls"])
    assert checks["tool_calls"].outcome == "fail"
    assert "tool call 1: arguments are not valid JSON (Expecting property name enclosed in double quotes at char 1)" \
        in checks["tool_calls"].reason


def test_a_server_that_refuses_tools_is_skipped_with_its_answer():
    refuse = json_route(error_body("tools are not supported"), status=400)
    tools = run(FakeOpenAI(tools=refuse), only=["tool_calls"])["tool_calls"]
    assert tools.outcome == "skip"
    assert tools.reason.startswith("the server refuses tools: HTTP 400") and "tools are not supported" in tools.reason


def test_tools_dropped_from_the_prompt_are_told_apart_from_a_model_answering_in_text():
    async def ignores(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        return web.json_response(completion("It is sunny.", "stop", words_of(body), 4))
    tools = run(FakeOpenAI(tools=ignores), only=["tool_calls"])["tool_calls"]
    assert tools.outcome == "warn"
    assert "the server ignored `tools`: the prompt is 12 tokens with and without them" in tools.reason

    async def text_answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        return web.json_response(completion("It is sunny.", "stop", words_of(body) + 50, 4))
    tools = run(FakeOpenAI(tools=text_answer), only=["tool_calls"])["tool_calls"]
    assert tools.outcome == "warn"
    assert "the tools reached the prompt (62 tokens against 12 without)" in tools.reason


# ---- errors --------------------------------------------------------------------------------------------------------


class BadAtErrors(FakeOpenAI):
    """Unknown model: 500. max_tokens -1: drops the connection. temperature "hot": hangs. Too long: 200."""

    def refuse(self, body: dict[str, Any]) -> web.StreamResponse | None:
        return None

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body["model"] != MODEL:
            return web.Response(status=500, text="Internal Server Error")
        if body["max_tokens"] == -1:
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if body["temperature"] == "hot":
            await asyncio.sleep(60)
        return web.json_response(completion("ok", "length", words_of(body), 1))


def test_errors_that_are_500s_drops_hangs_or_acceptance_fail_each_named():
    checks = run(BadAtErrors(), only=["error_unknown_model", "error_invalid_params", "error_context"],
                 check_timeout_s=3)
    assert checks["error_unknown_model"].outcome == "fail"
    assert checks["error_unknown_model"].reason == (
        "model 'servelab-no-such-model': HTTP 500, a server error where a 4xx belongs: Internal Server Error")
    invalid = checks["error_invalid_params"]
    assert invalid.outcome == "fail"
    assert "max_tokens -1: the server closed the connection without answering" in invalid.reason
    assert 'temperature "hot": no answer within 1s' in invalid.reason
    context = checks["error_context"]
    assert context.outcome == "fail"
    assert context.reason.startswith("a 768-word prompt for a 512-token context (/props n_ctx): accepted (HTTP 200)")
    assert context.request is not None and context.request["messages"][0]["content"] == '"hello " × 768'


def test_a_4xx_without_an_openai_error_body_is_a_warning():
    async def fastapi_422(request: web.Request) -> web.StreamResponse:
        return web.json_response({"detail": [{"msg": "Input should be a valid number"}]}, status=422)

    class Fastapi(FakeOpenAI):
        def refuse(self, body: dict[str, Any]) -> web.StreamResponse | None:
            return None
    fake = Fastapi(chat=fastapi_422)
    unknown = run(fake, only=["error_unknown_model"])["error_unknown_model"]
    assert unknown.outcome == "warn"
    assert "HTTP 422 but no OpenAI-style `error` object" in unknown.reason


# ---- the openai SDK ------------------------------------------------------------------------------------------------


def test_an_answer_the_sdk_cannot_read_fails_with_the_sdk_s_exception():
    async def not_json(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("stream"):
            return web.Response(body=b"data: {broken\n\n", headers={"Content-Type": "text/event-stream"})
        return web.Response(text="<html>oops</html>", content_type="text/html")
    sdk = run(FakeOpenAI(chat_route=not_json), only=["openai_sdk"])["openai_sdk"]
    assert sdk.outcome == "fail"
    assert "streamed: the SDK raised JSONDecodeError" in sdk.reason


def test_completions_missing_is_a_skip():
    async def missing(request: web.Request) -> web.StreamResponse:
        return web.json_response(error_body("not found", "not_found_error"), status=404)
    completions = run(FakeOpenAI(completions=missing), only=["completions"])["completions"]
    assert completions.outcome == "skip"
    assert completions.reason.startswith("the server has no /v1/completions (HTTP 404")


# ---- the API key ---------------------------------------------------------------------------------------------------

SECRET = "sk-servelab-test-7f3a9c"


class NeedsKey(FakeOpenAI):
    """Answers 401 to any request without `Authorization: Bearer <SECRET>`."""

    def app(self) -> web.Application:
        app = super().app()

        @web.middleware
        async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.headers.get("Authorization") != f"Bearer {SECRET}":
                return web.json_response(error_body("invalid api key", "authentication_error"), status=401)
            return await handler(request)
        app.middlewares.append(auth)
        return app


def test_the_api_key_reaches_every_request_including_the_sdk_s_and_is_written_nowhere():
    fake = NeedsKey()
    with serving(fake.app()) as url:
        result = verify(url, api_key=SECRET, check_timeout_s=20)
        refused = verify(url, only=["models"], check_timeout_s=20)
    outcomes = {c.id: c.outcome for c in result.checks}
    assert outcomes.pop("reasoning") == "skip"
    assert set(outcomes.values()) == {"pass"}
    assert SECRET not in result.model_dump_json()
    assert refused.checks[0].outcome == "fail" and "HTTP 401" in refused.checks[0].reason


def test_the_cli_takes_the_api_key_from_the_environment_and_never_prints_it():
    with serving(NeedsKey().app()) as url:
        out = CliRunner().invoke(cli_app, ["verify", url, "--only", "models", "--only", "openai_sdk", "--json"],
                                 env={"SERVELAB_API_KEY": SECRET})
    assert out.exit_code == 0, out.output
    assert SECRET not in out.output
    checks = {c["id"]: c["outcome"] for c in json.loads(out.output)["checks"]}
    assert checks["models"] == "pass" and checks["openai_sdk"] == "pass"
