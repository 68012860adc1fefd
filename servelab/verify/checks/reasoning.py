"""Reasoning output: in its own field, never as <think> inside content, and counted.

Servers disagree on the field: llama.cpp, SGLang and transformers serve use `reasoning_content`, vLLM >= 0.11
`reasoning`; a server without a reasoning parser (llama-cpp-python, TGI) leaves `<think>…</think>` in content,
which breaks every client that shows or parses the answer (shared/research/engines.md §0.5)."""

from __future__ import annotations

import re
from typing import Any

from servelab.verify.checks.common import (chat_body, is_int, quoted, read_chat_stream, send_chat, send_stream,
                                           usage_counts)
from servelab.verify.checks.registry import CheckContext, CheckVerdict, Evidence, Findings, check, skip
from servelab.engines.reasoning_families import family_of, fix_for
from servelab.verify.checks.thinking import judge_thinking, read_signals, served_engine

REASONING_PROMPT = "What is 17 + 25? Think it through step by step, then give the answer."
REASONING_MAX_TOKENS = 32
THINK_TAG = re.compile(r"</?think>", re.IGNORECASE)


def reasoning_field(message: dict[str, Any]) -> str | None:
    for name in ("reasoning_content", "reasoning"):
        if isinstance(message.get(name), str) and message[name]:
            return name
    return None


def reasoning_tokens(usage: Any) -> int | None:
    """OpenAI's usage.completion_tokens_details.reasoning_tokens, or SGLang's top-level usage.reasoning_tokens."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("completion_tokens_details")
    if isinstance(details, dict) and is_int(details.get("reasoning_tokens")):
        return details["reasoning_tokens"]
    return usage["reasoning_tokens"] if is_int(usage.get("reasoning_tokens")) else None


@check("reasoning", "Reasoning arrives in reasoning_content/reasoning, not as <think> in content, and is counted")
async def reasoning(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    answer = await send_chat(ctx, evidence, chat_body(ctx.model, REASONING_PROMPT, REASONING_MAX_TOKENS))
    field = reasoning_field(answer.message)
    tag = THINK_TAG.search(answer.text)
    if field is None and tag is None:
        # Untagged thinking in content counts only for a known reasoning family here: the prompt asks for steps,
        # so any model's answer talks about the request.
        seen = read_signals(prompt=REASONING_PROMPT, text=answer.text, message=answer.message,
                            finish_reason=answer.finish_reason, usage=answer.usage, max_tokens=REASONING_MAX_TOKENS,
                            models=[ctx.model, answer.body.get("model")])
        if seen.thinking_in_content:
            findings = Findings()
            await judge_thinking(ctx, seen, findings, "message")
            return findings.verdict(f"content {quoted(answer.text, 60)}")
        return skip("the model shows no reasoning: no reasoning_content or reasoning field, no <think> in content")
    findings = Findings()
    if tag is not None:
        family = family_of(ctx.model, answer.body.get("model"))
        fix = fix_for(await served_engine(ctx), family)
        findings.fail(f"reasoning arrived inside content: {quoted(tag.group())} at character {tag.start()}"
                      + (f" ({family.name} is a reasoning model)" if family else "")
                      + f"; fix: {fix}")
    if field is not None:
        findings.note(f"reasoning in message.{field} ({len(answer.message[field])} characters)")
        judge_reasoning_count(answer.usage, findings)
        stream = await send_stream(ctx, None, chat_body(ctx.model, REASONING_PROMPT, REASONING_MAX_TOKENS,
                                                        stream=True))
        reading = read_chat_stream([event.data for event in stream.events])
        streamed_tag = THINK_TAG.search(reading.text)
        if streamed_tag is not None:
            findings.fail(f"streamed: reasoning arrived inside delta.content ({quoted(streamed_tag.group())})")
        if not reading.reasoning:
            findings.fail("streamed: no delta.reasoning_content or delta.reasoning, though the plain answer has "
                          f"message.{field}")
    return findings.verdict(f"content {quoted(answer.text, 60)}")


def judge_reasoning_count(usage: Any, findings: Findings) -> None:
    counted = reasoning_tokens(usage)
    counts = usage_counts(usage)
    if counted is None:
        # llama.cpp and transformers serve count reasoning inside completion_tokens without saying how much.
        findings.warn("usage has no reasoning_tokens (completion_tokens_details.reasoning_tokens): the reasoning "
                      "is not counted separately")
    elif counts is not None and counted > counts[1]:
        findings.fail(f"reasoning_tokens {counted} exceed completion_tokens {counts[1]}")
    elif counted == 0:
        findings.warn("reasoning_tokens is 0 although reasoning arrived")
    else:
        findings.note(f"{counted} reasoning tokens counted")
