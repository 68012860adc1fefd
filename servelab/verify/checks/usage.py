"""Token usage: consistent sums, the same counts streamed and not, and counts that match a tokenizer's."""

from __future__ import annotations

from typing import Any

from servelab.protocol.tokenize import ENDPOINTS, LLAMA_CPP_APPLY_TEMPLATE, TokenizeEndpoint, token_count
from servelab.verify.checks.common import (chat_body, check_usage, quoted, read_chat_stream, send_chat,
                                           send_stream, usage_counts)
from servelab.verify.checks.limits import LONG_PROMPT
from servelab.verify.checks.registry import CheckContext, CheckVerdict, Evidence, Findings, check, skip
from servelab.verify.http import BadResponse, request_raw

USAGE_MAX_TOKENS = 16
COUNT_MAX_TOKENS = 24


@check("usage", "usage adds up (prompt + completion = total) and is the same streamed and not")
async def usage_consistent(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    findings = Findings()
    plain = await send_chat(ctx, evidence, chat_body(ctx.model, LONG_PROMPT, USAGE_MAX_TOKENS))
    check_usage(plain.usage, findings, "the response")
    stream = await send_stream(ctx, None, chat_body(ctx.model, LONG_PROMPT, USAGE_MAX_TOKENS, stream=True))
    reading = read_chat_stream([event.data for event in stream.events])
    counts = usage_counts(plain.usage)
    if reading.usage is None:
        findings.note("the stream carried no usage to compare (see stream_framing)")
    else:
        check_usage(reading.usage, findings, "the stream")
        streamed = usage_counts(reading.usage)
        if counts and streamed and counts != streamed:
            text = "the same text" if reading.text == plain.text else "a different text"
            (findings.fail if reading.text == plain.text else findings.warn)(
                f"streamed usage {fmt(streamed)} differs from plain usage {fmt(counts)} for {text}")
        elif counts and streamed:
            findings.note("the streamed usage equals the plain one")
    return findings.verdict(f"usage {fmt(counts) if counts else plain.usage!r}")


def fmt(counts: tuple[int, int, int]) -> str:
    return f"{counts[0]} prompt + {counts[1]} completion = {counts[2]}"


# ---- usage_count -------------------------------------------------------------------------------------------------

# Tokenizer endpoints, tried in order (the server may be any engine, or none servelab knows): the families whose
# bare-text count `tokenize_body` can ask for. `TokenizeEndpoint.title` names one in verdicts.
TOKENIZERS: list[TokenizeEndpoint] = [ENDPOINTS["llama.cpp"], ENDPOINTS["vllm"], ENDPOINTS["llama-cpp-python"]]


def tokenize_body(endpoint: TokenizeEndpoint, model: str, text: str, special: bool) -> dict[str, Any]:
    if endpoint.api == "llama.cpp":
        return {"content": text, "add_special": special}
    if endpoint.api == "vllm":
        return {"model": model, "prompt": text, "add_special_tokens": special}
    return {"input": text}  # llama-cpp-python adds special tokens its own way; the empty-text count corrects it


async def count_tokens(ctx: CheckContext, endpoint: TokenizeEndpoint, text: str, special: bool = False
                       ) -> int | None:
    assert ctx.model is not None
    try:
        reply = await request_raw(ctx.session, "POST", ctx.base_url, endpoint.path,
                                  tokenize_body(endpoint, ctx.model, text, special))
    except BadResponse:
        return None
    return token_count(reply.json()) if 200 <= reply.status < 300 else None


async def find_tokenizer(ctx: CheckContext) -> TokenizeEndpoint | None:
    """The first tokenizer endpoint that counts a test text, remembered for the run."""
    if "tokenizer" not in ctx.facts:
        ctx.facts["tokenizer"] = None
        for endpoint in TOKENIZERS:
            if await count_tokens(ctx, endpoint, "Hello world") is not None:
                ctx.facts["tokenizer"] = endpoint
                break
    return ctx.facts["tokenizer"]


@check("usage_count", "completion_tokens matches the server's tokenizer count of the answer")
async def usage_count(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    tokenizer = await find_tokenizer(ctx)
    if tokenizer is None:
        tried = ", ".join(sorted({endpoint.path for endpoint in TOKENIZERS}))
        return skip(f"no tokenizer endpoint to count with (tried {tried}); servelab does not ship tokenizers")
    answer = await send_chat(ctx, evidence, chat_body(ctx.model, LONG_PROMPT, COUNT_MAX_TOKENS))
    counts = usage_counts(answer.usage)
    if counts is None:
        return CheckVerdict("fail", f"no integer usage to compare: {answer.usage!r}")
    overhead = await count_tokens(ctx, tokenizer, "")  # a BOS token some endpoints always add
    counted = await count_tokens(ctx, tokenizer, answer.text)
    if counted is None or overhead is None:
        return CheckVerdict("fail", f"{tokenizer.title} stopped answering")
    counted -= overhead
    findings = Findings()
    completion = counts[1]
    # Re-tokenizing a text need not give back the tokens that produced it (merges differ at the edges), and a
    # finish by end-of-sequence counts a token that has no text: allow a little.
    slack = max(2, completion // 10) + (1 if answer.finish_reason == "stop" else 0)
    summary = f"completion_tokens {completion}, {tokenizer.title} counts {counted} for the answer"
    if abs(completion - counted) > slack:
        findings.fail(f"{summary}: off by {abs(completion - counted)}, more than re-tokenization explains")
    elif completion != counted:
        findings.note(f"{summary}: within {slack} (re-tokenizing text need not give back the same tokens)")
    else:
        findings.note(summary)
    await judge_prompt_count(ctx, tokenizer, counts[0], findings)
    return findings.verdict(f"{completion} completion tokens for {quoted(answer.text, 40)}")


async def judge_prompt_count(ctx: CheckContext, tokenizer: TokenizeEndpoint, prompt_tokens: int,
                             findings: Findings) -> None:
    """llama.cpp can render its chat template (/apply-template): then prompt_tokens can be checked too."""
    if tokenizer.api != "llama.cpp":
        return
    request = chat_body(ctx.model or "", LONG_PROMPT, COUNT_MAX_TOKENS)
    try:
        reply = await request_raw(ctx.session, "POST", ctx.base_url, LLAMA_CPP_APPLY_TEMPLATE,
                                  {"messages": request["messages"]})
    except BadResponse:
        return
    rendered = reply.json()
    if not (200 <= reply.status < 300 and isinstance(rendered, dict) and isinstance(rendered.get("prompt"), str)):
        return
    counted = await count_tokens(ctx, tokenizer, rendered["prompt"], special=True)
    if counted is None:
        return
    if abs(counted - prompt_tokens) > 1:
        findings.fail(f"prompt_tokens {prompt_tokens}, but the templated prompt counts {counted}")
    else:
        findings.note(f"prompt_tokens {prompt_tokens} matches the templated prompt ({counted})")
