"""Tool calls: a request with `tools` yields `tool_calls` whose arguments are valid JSON.

A server may support tools, refuse them (a 4xx: skip), or silently drop them from the prompt (llama.cpp with
SmolLM2, whose chat template does not render tools). The last is told apart from a model that merely chose to
answer in text by asking the same question without tools: equal prompt_tokens mean the definitions never reached
the model."""

from __future__ import annotations

import json
from typing import Any

from servelab.verify.checks.common import chat_body, quoted, read_chat_answer, send_chat, usage_counts
from servelab.verify.checks.registry import CheckContext, CheckFailed, CheckVerdict, Evidence, Findings, check, skip
from servelab.verify.http import excerpt, one_line, parse_json, request_raw

TOOL_PROMPT = "What is the weather in Paris right now? Use the get_weather tool."
TOOL_MAX_TOKENS = 48
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
                   "required": ["city"]}}}


@check("tool_calls", "A request with tools yields tool_calls with valid JSON arguments")
async def tool_calls(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    evidence.request = chat_body(ctx.model, TOOL_PROMPT, TOOL_MAX_TOKENS, tools=[WEATHER_TOOL],
                                 tool_choice="required")
    reply = await request_raw(ctx.session, "POST", ctx.base_url, "/v1/chat/completions", evidence.request)
    evidence.response_excerpt = excerpt(reply.text)
    if 400 <= reply.status < 500:
        return skip(f"the server refuses tools: HTTP {reply.status}: {one_line(reply.text, 200) or '(empty body)'}")
    if not 200 <= reply.status < 300:
        raise CheckFailed(f"HTTP {reply.status} for a request with tools: {one_line(reply.text) or '(empty body)'}")
    answer = read_chat_answer(parse_json(reply.text, reply.content_type))
    calls = answer.message.get("tool_calls")
    findings = Findings()
    if not calls:
        await judge_no_calls(ctx, answer.usage, findings)
        return findings.verdict(f"no tool_calls; text {quoted(answer.text, 60)}")
    if not isinstance(calls, list):
        findings.fail(f"tool_calls is a {type(calls).__name__}, expected a list")
        return findings.verdict()
    for number, call in enumerate(calls, 1):
        judge_call(number, call, findings)
    if answer.finish_reason != "tool_calls":
        findings.warn(f"finish_reason is {answer.finish_reason!r}, OpenAI says 'tool_calls'")
    first = calls[0] if isinstance(calls[0], dict) else {}
    function = first.get("function") if isinstance(first.get("function"), dict) else {}
    return findings.verdict(f"{len(calls)} tool call(s): {function.get('name')}({function.get('arguments')})")


def judge_call(number: int, call: Any, findings: Findings) -> None:
    where = f"tool call {number}"
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        findings.fail(f"{where} has no function object")
        return
    function = call["function"]
    if call.get("type") != "function":
        findings.warn(f"{where}: type is {call.get('type')!r}, expected 'function'")
    if not isinstance(call.get("id"), str) or not call["id"]:
        findings.warn(f"{where} has no id (a client cannot answer it with a tool message)")
    if function.get("name") != WEATHER_TOOL["function"]["name"]:
        findings.fail(f"{where} names {function.get('name')!r}, which is not an offered tool")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        findings.fail(f"{where}: arguments is a {type(arguments).__name__}, expected a JSON string")
        return
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError as exc:
        findings.fail(f"{where}: arguments are not valid JSON ({exc.msg} at char {exc.pos}): {quoted(arguments)}")
        return
    if not isinstance(parsed, dict):
        findings.fail(f"{where}: arguments are JSON but not an object: {quoted(arguments)}")
    elif "city" not in parsed:
        findings.warn(f"{where}: arguments lack the required 'city': {quoted(arguments)}")


async def prompt_tokens_with_and_without_tools(ctx: CheckContext, usage: Any) -> tuple[int, int] | None:
    """The prompt tokens of the request with tools (from its `usage`) and of the same question without them (asked
    now); None when either is unknown. Equal counts mean the definitions never reached the model."""
    assert ctx.model is not None
    with_tools = usage_counts(usage)
    bare = await send_chat(ctx, None, chat_body(ctx.model, TOOL_PROMPT, 1))
    without = usage_counts(bare.usage)
    return (with_tools[0], without[0]) if with_tools and without else None


async def judge_no_calls(ctx: CheckContext, usage: Any, findings: Findings) -> None:
    """No tool_calls came back: did the tool definitions reach the prompt at all?"""
    counts = await prompt_tokens_with_and_without_tools(ctx, usage)
    if counts is not None and counts[0] == counts[1]:
        with_tools, without = counts
        findings.warn(f"the server ignored `tools`: the prompt is {with_tools} tokens with and without them, so "
                      f"the definitions never reached the model (the model's chat template may not render tools)")
    elif counts is not None:
        with_tools, without = counts
        findings.warn(f"the tools reached the prompt ({with_tools} tokens against {without} without) but the "
                      f"answer has no tool_calls although tool_choice was 'required'")
    else:
        findings.warn("no tool_calls although tool_choice was 'required' (no usage to tell whether the tools "
                      "reached the prompt)")
