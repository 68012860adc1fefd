"""verify against servers that misbehave: each fault must become a failed (or warned) check with a clear reason,
never a traceback, and the run must go on. The servers are small aiohttp apps: test doubles for broken engines."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest
from aiohttp import web
from openai_fake import USAGE, FakeOpenAI, Handler, bytes_route, chunk, completion, json_route, serving, sse

from servelab.errors import UserError
from servelab.records import VerifyResult
from servelab.verify import verify

# The story's checks: these tests break the models, chat and stream routes; the other checks have their own
# fault tests (test_verify_checks.py).
STORY_CHECKS = ["models", "chat", "chat_stream"]


def openai_stream(text: str = "4") -> bytes:
    """What OpenAI (and llama.cpp) send: role chunk, content, finish, a usage-only chunk, [DONE]."""
    return sse(chunk({"role": "assistant", "content": ""}), chunk({"content": text}), chunk({}, "stop"),
               chunk(usage=USAGE), "[DONE]")


def fake_openai(models: Handler | None = None, chat: Handler | None = None,
                stream: Handler | None = None) -> web.Application:
    routes = {"models": models, "chat": chat or json_route(completion()),
              "stream": stream or bytes_route(openai_stream())}
    return FakeOpenAI(**{name: handler for name, handler in routes.items() if handler is not None}).app()


def by_id(result: VerifyResult) -> dict[str, Any]:
    return {c.id: c for c in result.checks if c.reason != "not selected"}


def run(app: web.Application, **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("only", STORY_CHECKS)
    with serving(app) as url:
        return by_id(verify(url, **kwargs))


def test_the_fake_server_itself_passes_the_story_checks():
    # Guards the doubles: every fault below differs from this baseline in exactly the broken part.
    checks = run(fake_openai())
    assert {i: c.outcome for i, c in checks.items()} == {"models": "pass", "chat": "pass", "chat_stream": "pass"}


# ----------------------------------------------------------------------------------------------------------------
# Nothing there
# ----------------------------------------------------------------------------------------------------------------


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_port_nobody_listens_on_is_one_user_error_before_any_check():
    port = unused_port()
    started = time.monotonic()
    with pytest.raises(UserError) as info:
        verify(f"http://127.0.0.1:{port}")
    assert time.monotonic() - started < 10
    assert info.value.message == f"cannot reach http://127.0.0.1:{port}: connection refused"


def test_a_host_that_does_not_resolve_is_a_user_error_within_10s(monkeypatch):
    # The name fails here, as the resolver would answer it (EAI_NONAME), without asking one: no DNS query leaves
    # the machine. verify runs in this process on asyncio's loop, which resolves through socket.getaddrinfo.
    real = socket.getaddrinfo
    asked = []

    def getaddrinfo(host, *args, **kwargs):
        if host == "no-such-host.invalid":
            asked.append(host)
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    started = time.monotonic()
    with pytest.raises(UserError, match=r"^cannot reach http://no-such-host\.invalid:8000: "):
        verify("http://no-such-host.invalid:8000")
    assert time.monotonic() - started < 10
    assert asked, "verify resolved the name some other way than socket.getaddrinfo"


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:8000", "http://", "http://[::1"])
def test_a_url_that_is_not_http_is_a_user_error(url):
    with pytest.raises(UserError, match="invalid server URL"):
        verify(url)


# ----------------------------------------------------------------------------------------------------------------
# Something there, but not an OpenAI server
# ----------------------------------------------------------------------------------------------------------------

HTML = b"<!doctype html><html><head><title>Welcome to nginx!</title></head><body>hello</body></html>"


def html_app() -> web.Application:
    async def page(request: web.Request) -> web.StreamResponse:
        return web.Response(body=HTML, content_type="text/html")
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", page)
    return app


def test_an_html_server_fails_every_check_naming_what_it_sent():
    checks = run(html_app(), model="m")
    assert checks["models"].reason.startswith("expected JSON, got text/html: <!doctype html><html>")
    assert checks["chat"].reason.startswith("expected JSON, got text/html: <!doctype html>")
    assert checks["chat_stream"].reason.startswith(
        "expected an SSE stream (text/event-stream), got text/html: <!doctype html>")
    for c in checks.values():
        assert c.outcome == "fail"
        assert c.response_excerpt and c.response_excerpt.startswith("<!doctype html>")


def test_without_a_model_the_checks_that_need_one_are_skipped_saying_why():
    checks = run(html_app())
    assert checks["models"].outcome == "fail"
    for check_id in ("chat", "chat_stream"):
        assert checks[check_id].outcome == "skip"
        assert "no model" in checks[check_id].reason


def test_invalid_json_is_named_as_such():
    checks = run(fake_openai(chat=bytes_route(b'{"choices": [', content_type="application/json")))
    assert checks["chat"].outcome == "fail"
    assert checks["chat"].reason.startswith('invalid JSON (Expecting value at char 13): {"choices": [')
    assert checks["models"].outcome == "pass"
    assert checks["chat_stream"].outcome == "pass"


def test_an_error_status_fails_with_status_and_body():
    checks = run(fake_openai(chat=bytes_route(b'{"error": "model not loaded"}', "application/json", 500)))
    assert checks["chat"].outcome == "fail"
    assert checks["chat"].reason == 'HTTP 500 from POST /v1/chat/completions: {"error": "model not loaded"}'


def test_a_connection_dropped_without_an_answer_fails_the_check_only():
    async def drop(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.close()
        return web.Response()
    checks = run(fake_openai(chat=drop))
    assert checks["chat"].outcome == "fail"
    assert "closed the connection" in checks["chat"].reason
    assert checks["chat_stream"].outcome == "pass"


# ----------------------------------------------------------------------------------------------------------------
# Hangs and broken streams
# ----------------------------------------------------------------------------------------------------------------


async def hang(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(60)
    return web.Response()


def test_a_check_that_hangs_times_out_and_the_rest_still_run():
    started = time.monotonic()
    checks = run(fake_openai(chat=hang), check_timeout_s=1)
    assert time.monotonic() - started < 8
    assert checks["chat"].outcome == "fail"
    assert checks["chat"].reason == "timed out after 1s"
    assert checks["chat"].request is not None and checks["chat"].request["max_tokens"] == 32
    assert checks["models"].outcome == "pass"
    assert checks["chat_stream"].outcome == "pass"
    assert "not compared" in checks["chat_stream"].reason


def test_a_stream_that_stalls_keeps_what_arrived_as_evidence():
    async def stall(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse(chunk({"role": "assistant", "content": "fo"})))
        await asyncio.sleep(60)
        return response
    checks = run(fake_openai(stream=stall), check_timeout_s=1)
    assert checks["chat_stream"].reason == "timed out after 1s"
    assert '"content": "fo"' in checks["chat_stream"].response_excerpt


def test_a_connection_closed_mid_stream_fails_before_done():
    async def cut(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse(chunk({"role": "assistant", "content": "fo"}), chunk({"content": "ur"})))
        assert request.transport is not None
        request.transport.close()
        return response
    checks = run(fake_openai(stream=cut))
    stream = checks["chat_stream"]
    assert stream.outcome == "fail"
    assert "connection closed before [DONE] after 2 events" in stream.reason
    assert checks["chat"].outcome == "pass"


def test_transformers_serve_style_stream_fails_for_missing_done_and_says_where_usage_was():
    body = sse(chunk({"role": "assistant", "content": "4"}), chunk({}, "stop", usage=USAGE))  # no [DONE]
    reason = run(fake_openai(stream=bytes_route(body)))["chat_stream"].reason
    assert "the stream ended without `data: [DONE]`" in reason
    assert "usage inside the chunk with finish_reason" in reason


def test_llama_cpp_python_style_stream_without_usage_is_a_warning():
    body = sse(chunk({"role": "assistant", "content": "4"}), chunk({}, "stop"), "[DONE]")
    stream = run(fake_openai(stream=bytes_route(body)))["chat_stream"]
    assert stream.outcome == "warn"
    assert "no usage despite stream_options.include_usage" in stream.reason


def test_streamed_text_that_differs_from_the_non_streamed_text_fails_at_the_first_difference():
    stream = run(fake_openai(chat=json_route(completion("four.")),
                             stream=bytes_route(openai_stream("four!"))))["chat_stream"]
    assert stream.outcome == "fail"
    assert 'differs from the non-streamed answer at character 4: stream "!" vs chat "."' in stream.reason


def test_a_stream_with_broken_events_lists_each_problem():
    body = (sse(chunk({"content": "4"}))  # no role on the first delta
            + b"data: {not json\n\n"
            + sse(chunk({}, "stop"), chunk({}, "stop"), {"error": {"message": "boom"}}, "[DONE]", chunk({})))
    stream = run(fake_openai(stream=bytes_route(body)))["chat_stream"]
    assert stream.outcome == "fail"
    for expected in ("1 data event(s) are not JSON objects (event 2)", "finish_reason arrived 2 times",
                     'the stream carried an error: {"message": "boom"}', "1 event(s) after [DONE]",
                     "the first delta has role None", "no usage despite"):
        assert expected in stream.reason


def test_invalid_utf8_in_a_stream_fails():
    body = sse(chunk({"role": "assistant", "content": ""})) + b'data: {"choices": [], "x": "\xff"}\n\n' + \
        sse(chunk({"content": "4"}), chunk({}, "stop"), chunk(usage=USAGE), "[DONE]")
    stream = run(fake_openai(stream=bytes_route(body)))["chat_stream"]
    assert stream.outcome == "fail"
    assert "not valid UTF-8" in stream.reason


# ----------------------------------------------------------------------------------------------------------------
# Malformed answers
# ----------------------------------------------------------------------------------------------------------------


def test_a_malformed_completion_lists_every_deviation():
    bad = completion("4", object="text_completion",
                     usage={"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 12})
    bad["choices"][0] |= {"finish_reason": "eos", "message": {"role": "bot", "content": "4"}}
    chat = run(fake_openai(chat=json_route(bad)))["chat"]
    assert chat.outcome == "fail"
    for expected in ("object is 'text_completion'", "message.role is 'bot'", "finish_reason is 'eos'",
                     "prompt_tokens 10 + completion_tokens 1 != total_tokens 12"):
        assert expected in chat.reason


def test_a_completion_without_usage_or_content_fails():
    bad = completion("")
    del bad["usage"]
    chat = run(fake_openai(chat=json_route(bad)))["chat"]
    assert chat.outcome == "fail"
    assert "message content is empty" in chat.reason
    assert "the response has no usage object" in chat.reason


def test_a_wrong_answer_is_only_a_warning():
    chat = run(fake_openai(chat=json_route(completion("five")), stream=bytes_route(openai_stream("five"))))["chat"]
    assert chat.outcome == "warn"
    assert chat.reason.startswith('answer: "five"; the answer is not 4')


def test_llama_cpp_models_shape_is_accepted_with_a_warning_and_names_the_model():
    models = json_route({"models": [{"name": "alias", "model": "alias"}]})
    with serving(fake_openai(models=models)) as url:
        result = verify(url)
    assert result.model == "alias"
    assert by_id(result)["models"].outcome == "warn"


def test_an_empty_model_list_fails_and_the_checks_needing_a_model_skip():
    checks = run(fake_openai(models=json_route({"object": "list", "data": []})))
    assert checks["models"].outcome == "fail"
    assert checks["models"].reason == "the server lists no models"
    assert checks["chat"].outcome == "skip"
