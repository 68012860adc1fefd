"""Rerank: a query and two documents, one plainly relevant and one not, come back with the relevant one scored
higher, every document once, with a finite score.

Engines name the endpoint differently: llama.cpp (`--reranking`) and vLLM serve `/v1/rerank` and `/rerank` with
{"query", "documents"} and answer {"results": [{"index", "relevance_score"}]}; SGLang serves `/v1/rerank` and answers
a bare list of {"index", "score", "document"}; vLLM's `/score` and `/v1/score` take {"text_1", "text_2"} and answer
{"data": [{"index", "score"}]}. The first that answers 2xx is judged; the check is skipped when none does."""

from __future__ import annotations

from typing import Any

from servelab.verify.checks.registry import CheckContext, CheckFailed, CheckVerdict, Evidence, Findings, check, skip
from servelab.verify.checks.served import UNSERVED_STATUSES, is_number, server_words
from servelab.verify.http import excerpt, parse_json, request_raw

RERANK_QUERY = "capital of France"
# The relevant document second: a server that echoes the documents in order, unscored, cannot pass by position.
RERANK_DOCUMENTS = ("Bananas are a yellow fruit rich in potassium.", "Paris is the capital and largest city of France.")
RELEVANT = 1
RERANK_PATHS = ("/v1/rerank", "/rerank")
SCORE_PATHS = ("/v1/score", "/score")


def rerank_attempts(model: str) -> list[tuple[str, dict[str, Any]]]:
    rerank = {"model": model, "query": RERANK_QUERY, "documents": list(RERANK_DOCUMENTS)}
    score = {"model": model, "text_1": RERANK_QUERY, "text_2": list(RERANK_DOCUMENTS)}
    return [(path, rerank) for path in RERANK_PATHS] + [(path, score) for path in SCORE_PATHS]


@check("rerank", "Rerank (/v1/rerank, /rerank, /v1/score, /score): the relevant document of an obvious pair first")
async def rerank(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    tried: list[str] = []
    told = False  # the evidence holds an answer that says more than "not found"
    for path, body in rerank_attempts(ctx.model):
        reply = await request_raw(ctx.session, "POST", ctx.base_url, path, body)
        if 200 <= reply.status < 300 or not told:
            evidence.request, evidence.response_excerpt = body, excerpt(reply.text)
            told = reply.status not in (404, 405)
        if 200 <= reply.status < 300:
            return judge_rerank(path, parse_json(reply.text, reply.content_type))
        if reply.status in UNSERVED_STATUSES or 400 <= reply.status < 500:
            tried.append(f"{path} HTTP {reply.status}" + ("" if reply.status in (404, 405) else
                                                         f" ({server_words(reply.text, 120)})"))
            continue
        raise CheckFailed(f"HTTP {reply.status} from {path}: {server_words(reply.text)}")
    return skip(f"no rerank endpoint answers: {'; '.join(tried)}")


def judge_rerank(path: str, body: Any) -> CheckVerdict:
    items, shape = rerank_items(body)
    findings = Findings()
    scores: dict[int, float] = {}
    listed: list[float] = []
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            raise CheckFailed(f"result {position} is not an object")
        index = item.get("index")
        score = item.get("relevance_score", item.get("score"))
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(RERANK_DOCUMENTS):
            findings.fail(f"result {position} has index {index!r}, not a document's index (0-1)")
            continue
        if index in scores:
            findings.fail(f"document {index} is ranked twice")
            continue
        if not is_number(score):
            findings.fail(f"result {position} (document {index}) has score {score!r}, not a finite number")
            continue
        scores[index] = float(score)
        listed.append(float(score))
    missing = [index for index in range(len(RERANK_DOCUMENTS)) if index not in scores]
    if missing:
        findings.fail(f"no score for document(s) {', '.join(map(str, missing))} (all were asked for)")
        return findings.verdict(f"{path}")
    relevant, other = scores[RELEVANT], scores[1 - RELEVANT]
    findings.note(f"{shape}, {listing_order(items, listed)}")
    if relevant > other:
        return findings.verdict(f"{path}: the Paris document scored {relevant:.4g}, above bananas {other:.4g}")
    findings.fail(f"wrong order: the bananas document scored {other:.4g}, "
                  f"{'equal to' if relevant == other else 'above'} the Paris document {relevant:.4g}, "
                  f"for the query {RERANK_QUERY!r}")
    return findings.verdict(f"{path}")


def listing_order(items: list[Any], listed_scores: list[float]) -> str:
    """How the results are listed: llama.cpp, vLLM's rerank and SGLang sort them by score, vLLM's score keeps the
    documents' order; clients that take the first result as the best care which."""
    if listed_scores == sorted(listed_scores, reverse=True):
        return "results sorted by score"
    if [item.get("index") for item in items] == list(range(len(items))):
        return "results in document order"
    return "results in neither score nor document order"


def rerank_items(body: Any) -> tuple[list[Any], str]:
    """The scored items and the shape they came in."""
    if isinstance(body, list):
        return body, "a bare list (SGLang's shape)"
    if isinstance(body, dict):
        for key in ("results", "data"):
            if isinstance(body.get(key), list):
                fields = sorted({name for item in body[key] if isinstance(item, dict) for name in item
                                 if name in ("relevance_score", "score")})
                return body[key], f"`{key}` with {'/'.join(fields) or 'no score field'}"
    raise CheckFailed("the answer has no `results` or `data` list of scores")
