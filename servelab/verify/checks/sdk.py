"""The official `openai` Python SDK reads the server's answers, plain and streamed, without error.

The SDK is what most applications use; it is lenient (it reads a stream to the connection's end when [DONE] never
comes) but raises on what it cannot parse. Any exception it raises fails the check with its type and message."""

from __future__ import annotations

import importlib.util
from typing import Any

from servelab.verify.checks.common import CHAT_PROMPT, quoted
from servelab.verify.checks.registry import CheckContext, CheckVerdict, Evidence, Findings, check, skip
from servelab.verify.http import excerpt

SDK_MAX_TOKENS = 16
NO_KEY = "servelab-no-key"  # the SDK insists on a key; a server without auth ignores it


@check("openai_sdk", "The official openai Python SDK reads a plain and a streamed chat answer")
async def openai_sdk(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    if ctx.hostile is not None:
        # The SDK reads with its own client (httpx), without verify's bounds: not against a body already hostile.
        return skip(f"not run against a hostile server: an earlier check's answer went past verify's bounds "
                    f"({ctx.hostile})")
    if importlib.util.find_spec("openai") is None:
        return skip("the openai package is not installed (pip install openai)")
    import openai

    request: dict[str, Any] = {"model": ctx.model, "messages": [{"role": "user", "content": CHAT_PROMPT}],
                               "temperature": 0, "max_tokens": SDK_MAX_TOKENS}
    evidence.request = request
    findings = Findings()
    from servelab.verify.sdk_client import capped_client

    # The SDK's own httpx, bounded like verify's reader (sdk_client.py) and never following a redirect.
    client = openai.AsyncOpenAI(base_url=ctx.base_url + "/v1", api_key=ctx.api_key or NO_KEY, max_retries=0,
                                timeout=ctx.check_timeout_s, http_client=capped_client(ctx.check_timeout_s))
    async with client:
        try:
            completion = await client.chat.completions.create(**request)
            text = completion.choices[0].message.content or ""
            evidence.response_excerpt = excerpt(completion.model_dump_json())
        except Exception as exc:  # noqa: BLE001 - whatever the SDK raises is the finding
            findings.fail(f"plain: the SDK raised {sdk_error(exc)}")
            text = None
        evidence.request = request | {"stream": True, "stream_options": {"include_usage": True}}
        try:
            stream = await client.chat.completions.create(**request, stream=True,
                                                          stream_options={"include_usage": True})
            chunks, streamed, usage = 0, "", None
            try:
                async for chunk in stream:
                    chunks += 1
                    usage = chunk.usage or usage
                    for choice in chunk.choices:
                        streamed += choice.delta.content or ""
            finally:  # a stream left half-read is closed now, not by the collector at exit (a warning on stderr)
                await stream.close()
        except Exception as exc:  # noqa: BLE001
            findings.fail(f"streamed: the SDK raised {sdk_error(exc)}")
            return findings.verdict()
    findings.note(f"streamed: {chunks} chunks, usage {'read' if usage else 'absent'}")
    if text is not None and streamed != text:
        findings.warn("the SDK's streamed text differs from its plain text")
    return findings.verdict(f"plain {quoted(text or '', 40)}, streamed {quoted(streamed, 40)}")


def sdk_error(exc: Exception) -> str:
    message = " ".join(str(exc).split())
    shown = f"{type(exc).__name__}: {message[:200]}" if message else type(exc).__name__
    from servelab.verify.sdk_client import SDKOverflow

    cause: BaseException | None = exc
    for _ in range(8):  # the SDK wraps what its transport raised ("Connection error."): name the bound it hit
        if cause is None or isinstance(cause, SDKOverflow):
            break
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, SDKOverflow) and cause is not exc:
        shown += f" ({cause})"
    return shown
