"""`bench`'s tool-calling and structured-output options applied to the text workload it built: each wraps it
(bench/workloads/tools.py, structured.py), and `--tools builtin` alone brings the built-in prompts that ask for
the built-in tools in place of the default story prompts."""

from __future__ import annotations

from typing import Any

from servelab.bench.workloads.base import OutputSpec
from servelab.bench.workloads.stories import Workload
from servelab.bench.workloads.structured import SCHEMA_FIELDS, StructuredWorkload, parse_response_format
from servelab.bench.workloads.tools import BUILTIN, ToolsWorkload, builtin_prompts, load_tools, parse_tool_choice
from servelab.errors import UserError


def with_answer_options(workload: Any, a: Any) -> Any:
    if a.tools is None and a.tool_choice is not None:
        raise UserError("--tool-choice needs --tools")
    if a.response_format is None and a.schema_field != "response_format":
        raise UserError("--schema-field needs --response-format json_schema:FILE")
    if a.schema_field not in SCHEMA_FIELDS:
        raise UserError(f"unknown --schema-field '{a.schema_field}'", hint=f"use {', '.join(SCHEMA_FIELDS)}")
    if (a.tools is not None or a.response_format is not None) and a.mode in ("multiturn", "replay"):
        raise UserError("--tools and --response-format apply to single-turn workloads, not --mode "
                        f"{a.mode}")
    if a.tools is not None:
        tools = load_tools(a.tools)
        if a.tools == BUILTIN and type(workload) is Workload:  # the default stories: the prompts that call them
            workload = builtin_prompts(workload.endpoint, OutputSpec(max_tokens=a.max_tokens, ignore_eos=False))
        workload = ToolsWorkload(inner=workload, tools=tools, source=a.tools,
                                 tool_choice=parse_tool_choice(a.tool_choice, tools))
    if a.response_format is not None:
        kind, schema, path = parse_response_format(a.response_format)
        workload = StructuredWorkload(inner=workload, format=kind, schema=schema, schema_file=path,
                                      field=a.schema_field)
    return workload
