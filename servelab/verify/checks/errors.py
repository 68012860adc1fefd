"""Bad requests get a 4xx with an OpenAI-style error body: not a 500, a hang, a dropped connection or a 200.

OpenAI's shape: {"error": {"message": "...", "type": "...", "param": ..., "code": ...}}. Each request here has a
deadline of its own (a third of the check's), so one that hangs is named while the others are still judged."""

from __future__ import annotations

import asyncio
from typing import Any

from servelab.verify.checks.common import chat_body, is_int
from servelab.verify.checks.registry import CheckContext, CheckVerdict, Evidence, Findings, check
from servelab.verify.http import BadResponse, RawReply, excerpt, one_line, request_json, request_raw

SHORT_PROMPT = "Reply with the single word: yes."
UNKNOWN_MODEL = "servelab-no-such-model"
# A prompt this many words longer than the context; one common word is about one token in every tokenizer.
OVERFLOW_MARGIN_WORDS = 256
# When the server does not say its context length: a prompt longer than most small-model contexts.
FALLBACK_PROMPT_WORDS = 9000


async def send_bad(ctx: CheckContext, evidence: Evidence, body: dict[str, Any]) -> RawReply | str:
    """Send a request that should be refused. Returns the reply, or why there was none."""
    evidence.request = body
    try:
        async with asyncio.timeout(ctx.check_timeout_s / 3):
            reply = await request_raw(ctx.session, "POST", ctx.base_url, "/v1/chat/completions", body)
    except TimeoutError:
        return f"no answer within {ctx.check_timeout_s / 3:g}s"
    except BadResponse as exc:
        return str(exc)
    evidence.response_excerpt = excerpt(reply.text)
    return reply


def judge_refusal(what: str, reply: RawReply | str, findings: Findings, *, accepted_is: str = "warn") -> None:
    """What a refused request must look like. `accepted_is`: how to judge a 2xx (a lenient server)."""
    if isinstance(reply, str):
        findings.fail(f"{what}: {reply}")
        return
    status = f"HTTP {reply.status}"
    if 200 <= reply.status < 300:
        getattr(findings, accepted_is)(f"{what}: accepted ({status}) instead of a 4xx")
    elif reply.status >= 500:
        findings.fail(f"{what}: {status}, a server error where a 4xx belongs: {one_line(reply.text) or '(empty)'}")
    elif not 400 <= reply.status < 500:
        findings.fail(f"{what}: {status}, expected a 4xx")
    else:
        problem = error_body_problem(reply.json())
        if problem:
            findings.warn(f"{what}: {status} but {problem}: {one_line(reply.text) or '(empty body)'}")
        else:
            findings.note(f"{what}: {status} {error_summary(reply.json())}")


def error_body_problem(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    error = body.get("error")
    if not isinstance(error, dict):
        return "no OpenAI-style `error` object"
    if not isinstance(error.get("message"), str) or not error["message"]:
        return "error.message is missing"
    return None


def error_summary(body: dict[str, Any]) -> str:
    error = body["error"]
    kind = error.get("type") or error.get("code")
    return f"{kind}: {one_line(error['message'], 100)}" if kind else one_line(error["message"], 100)


@check("error_unknown_model", "A request for a model the server does not serve gets a 4xx with an error body")
async def error_unknown_model(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    findings = Findings()
    reply = await send_bad(ctx, evidence, chat_body(UNKNOWN_MODEL, SHORT_PROMPT, 4))
    # Single-model servers (llama.cpp, llama-cpp-python) answer for any name: lenient, and said as a warning.
    judge_refusal(f"model {UNKNOWN_MODEL!r}", reply, findings)
    return findings.verdict()


@check("error_invalid_params", "Invalid parameters (max_tokens -1, temperature \"hot\") get a 4xx with an error body")
async def error_invalid_params(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    findings = Findings()
    cases = [("max_tokens -1", chat_body(ctx.model, SHORT_PROMPT, -1)),
             ('temperature "hot"', chat_body(ctx.model, SHORT_PROMPT, 4) | {"temperature": "hot"})]
    for what, body in cases:
        judge_refusal(what, await send_bad(ctx, evidence, body), findings)
    return findings.verdict()


async def context_length(ctx: CheckContext) -> tuple[int | None, str]:
    """The context a request may fill, and where that came from: llama.cpp's /props (per slot), else the
    /v1/models entry (vLLM's max_model_len, llama.cpp's meta.n_ctx, others' context_length)."""
    try:
        props = (await request_json(ctx.session, "GET", ctx.base_url, "/props")).body
        n_ctx = props.get("default_generation_settings", {}).get("n_ctx") if isinstance(props, dict) else None
        if is_int(n_ctx) and n_ctx > 0:
            return n_ctx, "/props n_ctx"
    except BadResponse:
        pass
    try:
        listed = (await request_json(ctx.session, "GET", ctx.base_url, "/v1/models")).body
    except BadResponse:
        return None, "unknown"
    entries = listed.get("data") if isinstance(listed, dict) and isinstance(listed.get("data"), list) else []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("id") not in (ctx.model, None):
            continue
        meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
        for where, value in (("max_model_len", entry.get("max_model_len")), ("meta.n_ctx", meta.get("n_ctx")),
                             ("context_length", entry.get("context_length"))):
            if is_int(value) and value > 0:
                return value, f"/v1/models {where}"
    return None, "unknown"


@check("error_context", "A prompt longer than the context gets a 4xx with an error body")
async def error_context(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    n_ctx, source = await context_length(ctx)
    words = n_ctx + OVERFLOW_MARGIN_WORDS if n_ctx else FALLBACK_PROMPT_WORDS
    body = chat_body(ctx.model, "hello " * words, 1)
    findings = Findings()
    reply = await send_bad(ctx, evidence, body)
    evidence.request = body | {"messages": [{"role": "user", "content": f"\"hello \" × {words}"}]}  # not 50 KB
    if n_ctx is None and not isinstance(reply, str) and 200 <= reply.status < 300:
        return CheckVerdict("skip", f"the context length is not published and a {words}-word prompt was accepted: the "
                               f"context is larger or not enforced; overflow not tested")
    what = f"a {words}-word prompt for a {n_ctx}-token context ({source})" if n_ctx else \
        f"a {words}-word prompt (context length not published)"
    judge_refusal(what, reply, findings, accepted_is="fail")
    return findings.verdict()
