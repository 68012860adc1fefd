"""Structured output: `response_format` json_schema gives an answer that parses and validates against the schema,
and json_object gives a JSON object.

A server that refuses response_format (a 4xx) is skipped in its words; one that accepts it and answers prose fails
with the excerpt. An answer cut at max_tokens while still inside the JSON is only a warning: the schema bounds the
name's length and the age, so a constrained decoder closes the object well within the budget, but a model may still
spend it on whitespace."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from servelab.verify.checks.common import chat_body, quoted, read_chat_answer
from servelab.verify.checks.registry import CheckContext, CheckFailed, CheckVerdict, Evidence, Findings, check, skip
from servelab.verify.checks.served import server_words
from servelab.verify.http import excerpt, parse_json, request_raw

SCHEMA_PROMPT = "Describe a person: give their name and their age."
OBJECT_PROMPT = 'Reply with a JSON object whose key "answer" holds the sum of 2 and 2.'
STRUCTURED_MAX_TOKENS = 64
PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 20},
                   "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name", "age"], "additionalProperties": False}
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON_SCHEMA}}
JSON_OBJECT_FORMAT = {"type": "json_object"}


@check("structured_output", "response_format json_schema validates against the schema; json_object gives an object")
async def structured_output(ctx: CheckContext, evidence: Evidence) -> CheckVerdict:
    assert ctx.model is not None
    findings = Findings()
    refused: list[str] = []
    said: list[str] = []
    telling = False  # the evidence holds the first answer that was refused or judged wanting
    for mode, prompt, response_format in (("json_schema", SCHEMA_PROMPT, JSON_SCHEMA_FORMAT),
                                          ("json_object", OBJECT_PROMPT, JSON_OBJECT_FORMAT)):
        body = chat_body(ctx.model, prompt, STRUCTURED_MAX_TOKENS, response_format=response_format)
        reply = await request_raw(ctx.session, "POST", ctx.base_url, "/v1/chat/completions", body)
        if not telling:
            evidence.request, evidence.response_excerpt = body, excerpt(reply.text)
        problems = len(findings.fails) + len(findings.warns)
        if 400 <= reply.status < 500:
            refused.append(f"{mode}: HTTP {reply.status}: {server_words(reply.text)}")
            telling = True
            continue
        if not 200 <= reply.status < 300:
            raise CheckFailed(f"HTTP {reply.status} for response_format {mode}: {server_words(reply.text)}")
        answer = read_chat_answer(parse_json(reply.text, reply.content_type))
        value = judge_json(mode, answer.text, answer.finish_reason, findings)
        telling = telling or len(findings.fails) + len(findings.warns) > problems
        if value is not None:
            said.append(f"{mode} {quoted(json.dumps(value, ensure_ascii=False), 60)}")
    if len(refused) == 2:
        return skip(f"the server refuses response_format: {'; '.join(refused)}")
    for refusal in refused:
        findings.warn(f"refused {refusal}")
    return findings.verdict("; ".join(said) or None)


def judge_json(mode: str, text: str, finish_reason: Any, findings: Findings) -> Any:
    """The parsed answer when it is what `mode` promises; else None, with the fault (or the excuse) recorded."""
    stripped = text.strip()
    try:
        value = json.loads(stripped)
    except json.JSONDecodeError as exc:
        if finish_reason == "length" and stripped.startswith("{"):
            findings.warn(f"{mode}: cut at max_tokens={STRUCTURED_MAX_TOKENS} inside the JSON (finish_reason "
                          f"length), so it could not be validated: {quoted(text)}")
        else:
            findings.fail(f"{mode}: the answer is not JSON ({exc.msg} at char {exc.pos}), so the server ignored "
                          f"response_format: {quoted(text)}")
        return None
    if not isinstance(value, dict):
        findings.fail(f"{mode}: the answer is JSON but not an object: {quoted(text)}")
        return None
    if mode == "json_schema":
        errors = sorted(jsonschema.Draft202012Validator(PERSON_SCHEMA).iter_errors(value), key=lambda e: e.path)
        if errors:
            where = "/".join(map(str, errors[0].absolute_path)) or "the object"
            findings.fail(f"json_schema: {len(errors)} schema violation(s), first at {where}: "
                          f"{quoted(errors[0].message, 120)}; answer {quoted(text)}")
            return None
    return value
