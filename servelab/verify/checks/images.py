"""Chat with an image: the same question with one image and without it; the image's answer has content, and the
server's prompt count grows by what the image cost (a vision encoder's tokens spliced into the prompt).

A server with no vision model is skipped in its own words: llama.cpp without `--mmproj` answers 500 "image input is
not supported - hint: if this is unexpected, you may need to provide the mmproj"; vLLM and SGLang refuse a text-only
model's image with a 4xx naming images or multimodal input."""

from __future__ import annotations

import re
from typing import Any

from servelab.bench.workloads.images import SyntheticImages, data_url
from servelab.verify.checks.registry import CheckContext, CheckFailed, CheckVerdict, Evidence, Findings, check, skip
from servelab.verify.checks.served import check_token_counts, server_words, unserved
from servelab.verify.http import excerpt, parse_json, request_raw

IMAGE_SIZE = (64, 64)
QUESTION = "Describe this image in one sentence."
MAX_TOKENS = 8
# What engines say when no vision model is loaded (llama.cpp: server-common.cpp; vLLM: "At most 0 image(s) may be
# provided in one prompt" and "... is not a multimodal model"); a vision server that fails to read the image is a fail.
_NO_VISION = re.compile(r"image input is not supported|provide the mmproj|not a multimodal model|at most 0 image"
                        r"|does not support (image|vision|multimodal)", re.I)


@check("images", "POST /v1/chat/completions with an image: an answer, and the image's tokens in usage")
async def images(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    png = SyntheticImages("verify").png(*IMAGE_SIZE, "images")
    url = data_url(png, "image/png")
    with_image = _body(ctx.model, [{"type": "text", "text": QUESTION},
                                   {"type": "image_url", "image_url": {"url": url}}])
    shown = url[:40] + f"…({len(url):,} characters)"  # the evidence keeps the request, not 16 kB of base64
    evidence.request = _body(ctx.model, [{"type": "text", "text": QUESTION},
                                         {"type": "image_url", "image_url": {"url": shown}}])
    reply = await request_raw(ctx.session, "POST", ctx.base_url, "/v1/chat/completions", with_image)
    evidence.response_excerpt = excerpt(reply.text)
    if not 200 <= reply.status < 300:
        said = server_words(reply.text)
        if reply.status in (400, 500, 501, 422) and _NO_VISION.search(said):
            return skip(f"the server has no vision model loaded: HTTP {reply.status}: {said}")
        why_not = unserved(reply, "chat with images")
        if why_not:
            return skip(why_not)
    body = parse_json(reply.text, reply.content_type)
    findings = Findings()
    answer = _answer(body)
    if not answer:
        findings.fail("the answer to the image has no content")
    counts = check_token_counts(body.get("usage") if isinstance(body, dict) else None, findings,
                                "the answer to the image", ("prompt_tokens",))
    text = await request_raw(ctx.session, "POST", ctx.base_url, "/v1/chat/completions",
                             _body(ctx.model, QUESTION))
    if not 200 <= text.status < 300:
        raise CheckFailed(f"HTTP {text.status} for the same question without the image: {server_words(text.text)}")
    plain = check_token_counts((parse_json(text.text, text.content_type) or {}).get("usage"), findings,
                               "the answer without the image", ("prompt_tokens",))
    if counts is None or plain is None:
        return findings.verdict()
    extra = counts["prompt_tokens"] - plain["prompt_tokens"]
    if extra <= 0:
        findings.fail(f"the image added no prompt tokens ({counts['prompt_tokens']} with it, "
                      f"{plain['prompt_tokens']} without): the server may have dropped it")
    return findings.verdict(f"a {IMAGE_SIZE[0]}x{IMAGE_SIZE[1]} PNG cost {extra} prompt tokens "
                            f"({plain['prompt_tokens']} → {counts['prompt_tokens']})")


def _body(model: str, content: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": MAX_TOKENS,
            "temperature": 0}


def _answer(body: Any) -> str:
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise CheckFailed("the answer has no choices[0].message") from None
    return content if isinstance(content, str) else ""
