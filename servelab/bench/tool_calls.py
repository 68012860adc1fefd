"""Tool calls and structured output in a streamed chat answer: joined as they arrive, judged once it ended
(definitions: docs/metrics.md#tool-calls and #structured-output).

A streamed call arrives in `choices[0].delta.tool_calls` pieces: each carries the call's `index` (parallel calls
are 0, 1, ...), the first one of a call its `id`, `type` and `function.name`, the later ones `function.arguments`
fragments to append. `ToolCallJoiner` is the stream's side: it keeps the time of the first piece and joins the
fragments per index; a piece it cannot place (not an object, no integer index) is kept as the stream's problem, so
the request counts as one whose calls do not parse, and the run goes on.

`judge_answer` runs once per finished request, on what the request declared: its `tools` (a call parses when its
arguments are a JSON object; it is valid when it also names a declared tool and its arguments validate against
that tool's `parameters` schema) and its schema (`response_format` json_schema or json_object, or an engine's own
guided field: vLLM's `guided_json` and `structured_outputs.json`, llama.cpp's and SGLang's `json_schema`), against
which the answer's text must validate. Validators are compiled once per distinct schema.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import jsonschema

from servelab.records import RequestRecord, ToolCall

_PROBLEM_CHARS = 200


class ToolCallJoiner:
    """One stream's tool calls, joined from their delta pieces."""

    __slots__ = ("calls", "first_ns", "problem", "items")

    def __init__(self) -> None:
        self.calls: dict[int, ToolCall] = {}
        self.first_ns: int | None = None  # arrival of the first event that carried tool_calls pieces
        self.problem: str | None = None
        self.items: dict[str, int] = {}  # a Responses call's item id: the index its pieces are joined at

    def add(self, pieces: list, now_ns: int) -> None:
        if self.first_ns is None:
            self.first_ns = now_ns
        for piece in pieces:
            index = piece.get("index") if isinstance(piece, dict) else None
            item = piece.get("item_id") if isinstance(piece, dict) else None
            if isinstance(item, str) and item:
                # Responses events name their call's item; llama.cpp sends no output_index, so the item places them
                known = self.items.get(item)
                if known is None:
                    known = index if isinstance(index, int) and not isinstance(index, bool) else len(self.items)
                    self.items[item] = known
                index = known
            if not isinstance(index, int) or isinstance(index, bool):
                self.problem = self.problem or f"a tool_calls piece without an integer index: {_short(piece)}"
                continue
            call = self.calls.get(index)
            if call is None:
                call = self.calls[index] = ToolCall(index=index)
            if isinstance(piece.get("id"), str) and piece["id"] and call.id is None:
                call.id = piece["id"]
            function = piece.get("function")
            if not isinstance(function, dict):
                continue
            name = function.get("name")
            if isinstance(name, str) and name:
                call.name = name if call.name is None else call.name
            fragment = function.get("arguments")
            if isinstance(fragment, str):
                if fragment:
                    call.arguments += fragment
                    call.fragments += 1
            elif isinstance(fragment, dict):  # a server that sends the arguments as an object, not a JSON string
                call.arguments += json.dumps(fragment)
                call.fragments += 1
            elif fragment is not None:
                self.problem = self.problem or f"tool call {index}: an arguments fragment is a " \
                                               f"{type(fragment).__name__}: {_short(fragment)}"

    def ordered(self) -> list[ToolCall]:
        return [self.calls[i] for i in sorted(self.calls)]


# ---- what a request declared ----------------------------------------------------------------------------------

def declared_tools(body: dict[str, Any]) -> dict[str, Any] | None:
    """{name: parameters schema (None: none given)} of the request's `tools`; None when it declared none. Chat nests
    each in `function` ({"type": "function", "function": {"name", "parameters"}}); Responses declares it flat
    ({"type": "function", "name", "parameters"}), Messages flat with `input_schema`."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    out: dict[str, Any] = {}
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        if isinstance(function.get("name"), str):
            out[function["name"]] = function.get("parameters", function.get("input_schema"))
    return out


def requested_schema(body: dict[str, Any]) -> tuple[str, dict[str, Any] | None] | None:
    """(kind, schema) the answer must follow: ("json_schema", schema) or ("json_object", None); None when the
    request constrained nothing. Read from `response_format`, else an engine's own field."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict):
        if fmt.get("type") == "json_object":
            schema = fmt.get("schema")  # llama.cpp accepts a schema beside json_object
            return ("json_schema", schema) if isinstance(schema, dict) else ("json_object", None)
        if fmt.get("type") == "json_schema":
            inner = fmt.get("json_schema")
            schema = inner.get("schema") if isinstance(inner, dict) else None
            return "json_schema", schema if isinstance(schema, dict) else {}
    structured = body.get("structured_outputs")
    for candidate in (body.get("guided_json"), structured.get("json") if isinstance(structured, dict) else None,
                      body.get("json_schema")):
        if isinstance(candidate, str):
            try:
                candidate = json.loads(candidate)
            except ValueError:
                continue
        if isinstance(candidate, dict):
            return "json_schema", candidate
    return None


# ---- judging a finished request -------------------------------------------------------------------------------

def judge_answer(record: RequestRecord, body: dict[str, Any], joiner: ToolCallJoiner | None,
                 finish_ns: int | None) -> None:
    """Fill the record's tool-call and structured-output fields from what the request declared (left None when it
    declared neither)."""
    tools = declared_tools(body)
    record.tools_declared = len(body["tools"]) if tools is not None else None
    if tools is not None or joiner is not None:
        judge_tool_calls(record, tools or {}, joiner, finish_ns)
    schema = requested_schema(body)
    if schema is not None:
        record.schema_valid, record.schema_problem = judge_structured(record.text, *schema)


def judge_tool_calls(record: RequestRecord, tools: dict[str, Any], joiner: ToolCallJoiner | None,
                     finish_ns: int | None) -> None:
    calls = joiner.ordered() if joiner is not None else []
    record.tool_calls = calls
    if not calls:
        if joiner is not None and joiner.problem:
            # pieces arrived that the client could not place: the request made calls, and they do not parse
            record.tool_calls_parse = record.tool_calls_valid = False
            record.tool_problem = joiner.problem
            record.t_first_tool_ns = joiner.first_ns
            record.t_tool_done_ns = finish_ns if finish_ns is not None else record.t_end_ns
        return
    record.t_first_tool_ns = joiner.first_ns if joiner is not None else None
    # The call is complete when the server says it stopped (the event with finish_reason); a stream that ended
    # without one ended when its last byte arrived.
    record.t_tool_done_ns = finish_ns if finish_ns is not None else record.t_end_ns
    parse, valid, problem = judge_calls(calls, tools)
    if joiner is not None and joiner.problem:
        parse = valid = False
        problem = problem or joiner.problem
    record.tool_calls_parse, record.tool_calls_valid, record.tool_problem = parse, valid, problem


def judge_calls(calls: list[ToolCall], tools: dict[str, Any]) -> tuple[bool, bool, str | None]:
    """(every call's arguments parse as a JSON object, every call also names a declared tool and validates against
    its parameters, the first problem found)."""
    parse = valid = True
    problem: str | None = None
    for call in calls:
        where = f"tool call {call.index}"
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except ValueError as exc:
            parse = valid = False
            problem = problem or f"{where}: arguments are not JSON ({exc}): {_short(call.arguments)}"
            continue
        if not isinstance(arguments, dict):
            parse = valid = False
            problem = problem or f"{where}: arguments are JSON but not an object: {_short(call.arguments)}"
            continue
        if call.name not in tools:
            valid = False
            problem = problem or f"{where} names {call.name!r}, which is not a declared tool"
            continue
        schema = tools[call.name]
        if isinstance(schema, dict):
            error = first_violation(schema, arguments)
            if error is not None:
                valid = False
                problem = problem or f"{where} ({call.name}): {error}"
    return parse, valid, problem


def judge_structured(text: str, kind: str, schema: dict[str, Any] | None) -> tuple[bool, str | None]:
    """Whether an answer is what its response format promised: a JSON object (json_object), or JSON that validates
    against the schema (json_schema); with the problem when it is not."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return False, f"the answer is not JSON ({exc}): {_short(text)}"
    if kind == "json_object":
        return (True, None) if isinstance(value, dict) else (False, f"JSON but not an object: {_short(text)}")
    error = first_violation(schema or {}, value)
    return (True, None) if error is None else (False, error)


def first_violation(schema: dict[str, Any], value: Any) -> str | None:
    try:
        validator = _validator(json.dumps(schema, sort_keys=True))
    except (jsonschema.SchemaError, TypeError, ValueError) as exc:
        return f"the declared schema is not a valid JSON schema: {_short(str(exc))}"
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(map(str, error.absolute_path)) or "the value"
    return f"schema violation at {where}: {_short(error.message)}"


@lru_cache(maxsize=64)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _PROBLEM_CHARS else text[:_PROBLEM_CHARS - 1] + "…"
