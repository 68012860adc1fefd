"""Streamed tool calls: the tool_calls check's request, streamed. The `tool_calls` deltas (an `index` on each, the
`id`, `type` and `function.name` on the first delta of a call, `function.arguments` in fragments) must reassemble
into calls whose arguments parse and whose name is a declared tool, ending with finish_reason "tool_calls".

No tool-call deltas at all: skipped when the tools never reached the prompt (the same prompt-token comparison as
tool_calls: the chat template dropped them), a warning when they did and the model chose text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servelab.verify.checks.common import chat_body, judge_stream_end, judge_stream_format, quoted, read_chat_stream, \
    send_stream
from servelab.verify.checks.registry import CheckContext, CheckFailed, CheckVerdict, Evidence, Findings, check, skip
from servelab.verify.checks.served import server_words, status_of
from servelab.verify.checks.tools import (TOOL_MAX_TOKENS, TOOL_PROMPT, WEATHER_TOOL, judge_call,
                                          prompt_tokens_with_and_without_tools)
from servelab.verify.http import BadResponse, one_line


@dataclass
class StreamedCall:
    """One tool call as its deltas built it."""

    id: Any = None
    type: Any = None
    name: Any = None
    arguments: str = ""
    fragments: int = 0  # deltas that carried a piece of the arguments
    late_fields: list[str] = field(default_factory=list)  # id/name first seen after the call's first delta


def gather_calls(chunks: list[dict[str, Any]], findings: Findings) -> dict[int, StreamedCall]:
    """The tool calls of a stream, by their delta `index`."""
    calls: dict[int, StreamedCall] = {}
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            pieces = delta.get("tool_calls") if isinstance(delta, dict) else None
            if not pieces:
                continue
            if not isinstance(pieces, list):
                findings.fail(f"delta.tool_calls is a {type(pieces).__name__}, expected a list")
                continue
            for piece in pieces:
                read_piece(piece, calls, findings)
    return calls


def read_piece(piece: Any, calls: dict[int, StreamedCall], findings: Findings) -> None:
    if not isinstance(piece, dict):
        findings.fail("a tool_calls delta is not an object")
        return
    index = piece.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        findings.fail(f"a tool_calls delta has index {index!r}: streaming clients join fragments by it")
        return
    first = index not in calls
    call = calls.setdefault(index, StreamedCall())
    function = piece.get("function") if isinstance(piece.get("function"), dict) else {}
    for name, value in (("id", piece.get("id")), ("type", piece.get("type")), ("name", function.get("name"))):
        if value is None:
            continue
        if getattr(call, name) is None:
            setattr(call, name, value)
            if not first:
                call.late_fields.append(name)
        elif value != getattr(call, name) and value != "":
            findings.fail(f"tool call {index}: {name} changes from {getattr(call, name)!r} to {value!r} mid-stream")
    fragment = function.get("arguments")
    if isinstance(fragment, str) and fragment:
        call.arguments += fragment
        call.fragments += 1
    elif fragment is not None and not isinstance(fragment, str):
        findings.fail(f"tool call {index}: an arguments fragment is a {type(fragment).__name__}, not a string")


@check("tool_calls_stream", "Streamed tools: tool_calls deltas reassemble into a call with valid JSON arguments")
async def tool_calls_stream(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    body = chat_body(ctx.model, TOOL_PROMPT, TOOL_MAX_TOKENS, stream=True, tools=[WEATHER_TOOL],
                     tool_choice="required")
    try:
        reply = await send_stream(ctx, evidence, body)
    except BadResponse as exc:
        status = status_of(exc)
        if status is not None and 400 <= status < 500:
            evidence.response_excerpt = evidence.response_excerpt or exc.excerpt
            return skip(f"the server refuses streamed tools: HTTP {status}: {server_words(exc.excerpt or '')}")
        raise
    if not reply.events:
        raise CheckFailed(f"the stream carried no events ({reply.disconnect or reply.content_type})")
    findings = Findings()
    reading = read_chat_stream([event.data for event in reply.events])
    cut_off = judge_stream_end(reply, reading, findings)
    judge_stream_format(reply, reading, findings)
    calls = gather_calls(reading.chunks, findings)
    if not calls:
        return await judge_no_streamed_calls(ctx, reading, findings, cut_off)
    cut_at_length = not cut_off and bool(reading.finishes) and reading.finishes[-1] == "length"
    for number, (index, call) in enumerate(sorted(calls.items()), 1):
        if call.late_fields:
            findings.warn(f"tool call {index}: {', '.join(call.late_fields)} arrived after the call's first delta "
                          f"(OpenAI sends them on the first)")
        judge_streamed_call(number, call, findings, cut_at_length)
    if reading.text.strip():
        findings.note(f"content alongside the calls: {quoted(reading.text, 40)}")
    if not cut_off:
        if not reading.finishes:
            findings.fail("no choice reached a finish_reason")
        elif reading.finishes[-1] != "tool_calls":
            findings.warn(f"finish_reason is {reading.finishes[-1]!r}, OpenAI says 'tool_calls'")
    first = calls[min(calls)]
    fragments = ", ".join(str(call.fragments) for _, call in sorted(calls.items()))
    return findings.verdict(f"{len(calls)} streamed tool call(s): {first.name}({one_line(first.arguments)}), "
                            f"arguments in {fragments} fragment(s)")


def judge_streamed_call(number: int, call: StreamedCall, findings: Findings, cut_at_length: bool) -> None:
    """The reassembled call, judged as tool_calls judges one. Arguments that do not parse because the stream was
    cut at max_tokens inside them (finish_reason "length": vLLM's streaming parsers send a call as it is written)
    are the budget's doing, not the server's: a warning."""
    judged = Findings()
    judge_call(number, {"id": call.id, "type": call.type, "function": {"name": call.name, "arguments": call.arguments}},
               judged)
    unparsed = f"tool call {number}: arguments are not valid JSON"
    if cut_at_length and any(fail.startswith(unparsed) for fail in judged.fails):
        judged.fails = [fail for fail in judged.fails if not fail.startswith(unparsed)]
        judged.warn(f"tool call {number}: the stream was cut at max_tokens={TOOL_MAX_TOKENS} inside its arguments "
                    f"(finish_reason length), so they could not be parsed: {quoted(call.arguments)}")
    findings.fails += judged.fails
    findings.warns += judged.warns
    findings.notes += judged.notes


async def judge_no_streamed_calls(ctx: CheckContext, reading: Any, findings: Findings, cut_off: bool) -> CheckVerdict:
    said = f"no tool_calls deltas; text {quoted(reading.text, 60)}"
    if cut_off:
        return findings.verdict(said)
    counts = await prompt_tokens_with_and_without_tools(ctx, reading.usage)
    if counts is not None and counts[0] == counts[1]:
        return skip(f"the server ignored `tools`: the prompt is {counts[0]} tokens with and without them, so the "
                    f"definitions never reached the model (the model's chat template may not render tools); {said}")
    if counts is not None:
        findings.warn(f"the tools reached the prompt ({counts[0]} tokens against {counts[1]} without) but the stream "
                      f"has no tool_calls although tool_choice was 'required'")
    else:
        findings.warn("no tool_calls deltas although tool_choice was 'required' (no usage to tell whether the tools "
                      "reached the prompt)")
    return findings.verdict(said)
