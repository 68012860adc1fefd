"""verify against the real embedded engine (llama.cpp via xllamacpp, SmolLM2), plus the pure parts of verify."""

from __future__ import annotations

import asyncio

import pytest

from servelab.errors import UserError
from servelab.verify import CHECKS, run_checks, verify
from servelab.verify.checks import first_difference, read_chat_stream
from servelab.verify.http import EXCERPT_CHARS, excerpt, excerpt_ends, normalize_base_url
from servelab.verify.runner import select_checks

# The machine may be busy with other work (a 2-core CI box running the engine and a benchmark); the deadline is
# generous so these tests judge the engine's answers, not the box's load.
REAL_TIMEOUT_S = 120.0


@pytest.mark.engine
def test_the_real_engine_passes_every_check(embedded_server):
    result = verify(embedded_server["url"], check_timeout_s=REAL_TIMEOUT_S)
    checks = {c.id: c for c in result.checks}
    assert list(checks) == ["models", "chat", "chat_stream"]
    assert result.model == embedded_server["model"]  # picked from /v1/models, none was given
    assert not result.failed

    assert checks["models"].outcome == "pass"
    assert checks["models"].reason.startswith(f"lists 1 model: {embedded_server['model']}")

    chat = checks["chat"]
    # SmolLM2-135M answers this arithmetic wrongly at temperature 0 ("The answer is "2+2""), which is a warning
    # about the model, not the interface: nothing else may be wrong.
    assert chat.outcome in ("pass", "warn")
    assert chat.reason.startswith('answer: "')
    if chat.outcome == "warn":
        assert "the answer is not 4" in chat.reason
        assert chat.reason.count(";") == 1
    assert chat.request is not None
    assert chat.request["messages"][0]["content"] == "What is 2+2? Reply in one word."

    stream = checks["chat_stream"]
    assert stream.outcome == "pass", stream.reason
    assert "usage in a separate final chunk (choices: [])" in stream.reason  # llama.cpp does it the OpenAI way
    assert "same text as the non-streamed answer" in stream.reason
    assert stream.request is not None and stream.request["stream_options"] == {"include_usage": True}
    assert stream.response_excerpt is not None and stream.response_excerpt.rstrip().endswith("data: [DONE]")

    for c in result.checks:
        assert c.duration_ms is not None and c.duration_ms > 0
        assert c.response_excerpt and len(c.response_excerpt) <= EXCERPT_CHARS


@pytest.mark.engine
def test_only_and_skip_select_checks_and_the_model_is_still_found(embedded_server):
    # The base URL with /v1, as OpenAI SDK users write it, names the same server.
    result = asyncio.run(run_checks(embedded_server["url"] + "/v1/", only=["chat"], check_timeout_s=REAL_TIMEOUT_S))
    outcomes = {c.id: (c.outcome, c.reason) for c in result.checks}
    assert outcomes["models"] == ("skip", "not selected")
    assert outcomes["chat_stream"] == ("skip", "not selected")
    assert outcomes["chat"][0] in ("pass", "warn")
    assert result.model == embedded_server["model"]


@pytest.mark.engine
def test_a_model_the_server_does_not_list_is_a_warning(embedded_server):
    result = verify(embedded_server["url"], model="not-served", only=["models"], check_timeout_s=REAL_TIMEOUT_S)
    models = result.checks[0]
    assert models.outcome == "warn"
    assert "'not-served' is not among the listed models" in models.reason


# ---- the pure parts ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "base"), [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
    ("https://example.com/proxy/v1", "https://example.com/proxy"),
])
def test_base_urls_are_normalized(given, base):
    assert normalize_base_url(given) == base


def test_unknown_check_ids_are_a_user_error_naming_the_known_ones():
    with pytest.raises(UserError) as info:
        select_checks(only=["chat", "nope"], skip=None)
    assert info.value.message == "unknown check 'nope'"
    assert info.value.hint == "known checks: " + ", ".join(c.id for c in CHECKS)


def test_skip_wins_over_only_for_the_same_check():
    assert select_checks(only=["chat"], skip=["chat"])["chat"] == "skipped on request"


def test_a_non_positive_timeout_is_a_user_error():
    with pytest.raises(UserError, match="must be positive"):
        verify("http://127.0.0.1:1", check_timeout_s=0)


def test_excerpts_stay_within_the_limit_and_show_a_stream_s_end():
    text = "a" * 300 + "b" * 300
    assert len(excerpt(text)) == EXCERPT_CHARS and excerpt(text).endswith("…")
    ends = excerpt_ends(text + "data: [DONE]")
    assert len(ends) <= EXCERPT_CHARS and ends.startswith("aaa") and ends.endswith("data: [DONE]")
    assert excerpt("short") == "short"


def test_first_difference():
    assert first_difference("abc", "abd") == 2
    assert first_difference("ab", "abc") == 2
    assert first_difference("", "x") == 0


def test_usage_position_is_told_apart():
    role = '{"choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}}]}'
    finish_with_usage = '{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {}}'
    usage_only = '{"choices": [], "usage": {}}'
    assert read_chat_stream([role, finish_with_usage]).usage_where == "inside the chunk with finish_reason"
    reading = read_chat_stream([role, usage_only, "[DONE]"])
    assert reading.usage_where == "in a separate final chunk (choices: [])"
    assert reading.text == "hi" and reading.first_role == "assistant" and reading.done_seen
