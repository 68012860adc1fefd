"""Embeddings: a batch of inputs gives one finite vector each, in order, all of one dimension; whether they are
L2-normalised is stated; two near-identical inputs are closer than an unrelated one.

A server that does not serve embeddings is skipped in its own words: 404 (SGLang, vLLM without a pooling model),
501 (llama.cpp started without `--embeddings`), or llama.cpp's 400 when the model has no pooling."""

from __future__ import annotations

import math
from typing import Any

from servelab.verify.checks.registry import CheckContext, CheckFailed, CheckVerdict, Evidence, Findings, check, skip
from servelab.verify.checks.served import check_token_counts, is_number, unserved
from servelab.verify.http import excerpt, parse_json, request_raw

# The first two differ in one word; the third shares nothing with them. Any embedding model worth serving puts the
# first two closer together, but a tiny model may not: that is a warning, the check is about the interface.
EMBEDDING_INPUTS = ("The cat sat on the mat.", "The cat sat on a mat.", "Stock markets fell sharply on Monday.")
NORM_TOLERANCE = 1e-3


@check("embeddings", "POST /v1/embeddings: one finite vector per input, in order, of one dimension")
async def embeddings(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    evidence.request = {"model": ctx.model, "input": list(EMBEDDING_INPUTS), "encoding_format": "float"}
    reply = await request_raw(ctx.session, "POST", ctx.base_url, "/v1/embeddings", evidence.request)
    evidence.response_excerpt = excerpt(reply.text)
    why_not = unserved(reply, "embeddings", refusals_skip=True)
    if why_not:
        return skip(why_not)
    body = parse_json(reply.text, reply.content_type)
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise CheckFailed("the answer has no `data` list of embeddings")
    findings = Findings()
    vectors = read_vectors(body["data"], findings)
    if vectors is None:
        return findings.verdict()
    dimension = len(vectors[0])
    norms = [math.sqrt(sum(x * x for x in vector)) for vector in vectors]
    normalised = all(abs(norm - 1) <= NORM_TOLERANCE for norm in norms)
    if any(norm == 0 for norm in norms):
        findings.fail(f"vector {norms.index(0)} is all zeros")
    else:
        judge_similarity(vectors, findings)
    judge_usage(body.get("usage"), findings)
    shape = "L2-normalised" if normalised else f"not L2-normalised (norms {min(norms):.3g} to {max(norms):.3g})"
    return findings.verdict(f"{len(vectors)} vectors of dimension {dimension}, {shape}")


def read_vectors(data: list[Any], findings: Findings) -> list[list[float]] | None:
    """The vectors in input order (by `index`), or None after a fail that leaves nothing to compare."""
    wanted = len(EMBEDDING_INPUTS)
    if len(data) != wanted:
        findings.fail(f"{len(data)} embeddings for {wanted} inputs")
        return None
    by_index: dict[int, list[float]] = {}
    order: list[Any] = []
    for position, item in enumerate(data):
        if not isinstance(item, dict):
            findings.fail(f"data[{position}] is not an object")
            return None
        index, vector = item.get("index"), item.get("embedding")
        order.append(index)
        if isinstance(vector, str):
            findings.fail(f"data[{position}].embedding is a string (base64?) although encoding_format 'float' was "
                          f"asked for")
            return None
        if not isinstance(vector, list) or not vector:
            findings.fail(f"data[{position}].embedding is not a non-empty list of numbers")
            return None
        bad = sum(1 for x in vector if not is_number(x))
        if bad:
            findings.fail(f"data[{position}].embedding has {bad} value(s) that are not finite numbers")
            return None
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < wanted or index in by_index:
            findings.fail(f"data[{position}].index is {index!r}: each input's index 0-{wanted - 1} must appear once")
            return None
        by_index[index] = [float(x) for x in vector]
    if order != list(range(wanted)):
        findings.warn(f"data is in index order {order}, not in input order as OpenAI returns it")
    dimensions = sorted({len(vector) for vector in by_index.values()})
    if len(dimensions) > 1:
        findings.fail(f"the vectors have different dimensions: {', '.join(map(str, dimensions))}")
        return None
    return [by_index[index] for index in range(wanted)]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def judge_similarity(vectors: list[list[float]], findings: Findings) -> None:
    near = cosine(vectors[0], vectors[1])
    far = max(cosine(vectors[0], vectors[2]), cosine(vectors[1], vectors[2]))
    said = f"cosine {near:.3f} between the near-identical inputs, at most {far:.3f} to the unrelated one"
    if near > far:
        findings.note(said)
    else:
        findings.warn(f"{said}: the near-identical inputs are not the closest (a tiny or non-embedding model may do "
                      f"this; the check is about the interface)")


def judge_usage(usage: Any, findings: Findings) -> None:
    if usage is None:
        findings.note("no usage block")
        return
    counts = check_token_counts(usage, findings, "the response", ("prompt_tokens", "total_tokens"))
    if counts is None:
        return
    if counts["prompt_tokens"] == 0:
        findings.fail("usage.prompt_tokens is 0 for three non-empty inputs")
    elif counts["total_tokens"] != counts["prompt_tokens"]:
        findings.warn(f"usage.total_tokens {counts['total_tokens']} differs from prompt_tokens "
                      f"{counts['prompt_tokens']} (an embedding request generates nothing)")
    else:
        findings.note(f"usage: {counts['prompt_tokens']} prompt tokens")
