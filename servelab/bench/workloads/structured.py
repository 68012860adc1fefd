"""Structured output: another workload's requests with a response format (docs/workloads.md#structured-output).

`--response-format json_object` asks for any JSON object; `json_schema:FILE` for JSON that validates against the
schema in FILE (a JSON schema, or OpenAI's {"name": ..., "schema": {...}} wrapper). The schema travels in the
field `--schema-field` names: OpenAI's `response_format` (every engine here reads it), or an engine's own guided
field: vLLM's `guided_json` (older releases) or `structured_outputs: {"json": ...}`, llama.cpp's and SGLang's
native `json_schema`. Each answer is judged against it as it ends (bench/tool_calls.py `judge_structured`).

`ignore_eos` and `min_tokens` are not sent: a constrained answer ends where its JSON closes, and forcing tokens past
that end would either break the JSON or make the engine pad it. Latency against unconstrained output is a
comparison of two runs on the same prompts and seed (docs/workloads.md#structured-output).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jsonschema

from servelab.bench.client import RequestSpec
from servelab.bench.workloads.base import CHAT, WorkloadSource
from servelab.bench.workloads.prompt_tokens import PromptTokenCounter
from servelab.bench.workloads.tools import in_series
from servelab.errors import UserError

SCHEMA_FIELDS = ("response_format", "guided_json", "structured_outputs", "json_schema")


def parse_response_format(value: str) -> tuple[str, dict[str, Any] | None, str | None]:
    """(kind, schema, file) of --response-format json_object | json_schema:FILE."""
    if value == "json_object":
        return "json_object", None, None
    kind, colon, path = value.partition(":")
    if kind != "json_schema" or not colon or not path:
        raise UserError(f"bad --response-format '{value}'", hint="use json_object or json_schema:FILE")
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"cannot read the schema {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UserError(f"the schema {path} is not JSON: {exc}") from None
    schema = doc.get("schema") if isinstance(doc, dict) and isinstance(doc.get("schema"), dict) else doc
    if not isinstance(schema, dict):
        raise UserError(f"the schema {path} is not a JSON object")
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise UserError(f"the schema {path} is not a valid JSON schema: {exc.message}") from None
    return "json_schema", schema, path


@dataclass
class StructuredWorkload:
    inner: WorkloadSource
    format: str  # "json_object" | "json_schema"
    schema: dict[str, Any] | None = None
    schema_file: str | None = None
    field: str = "response_format"
    series: str = ""  # numbers the wrapped workload's prompts apart per bench, where it numbers them (pipeline.py)
    temperature: float | None = None  # an experiment's sampling temperature, handed to the wrapped workload

    kind = "structured"

    @property
    def endpoint(self) -> str:
        return self.inner.endpoint

    def __post_init__(self) -> None:
        if self.inner.endpoint != CHAT:
            raise UserError("--response-format needs the chat endpoint", hint="use --endpoint chat")
        if self.field not in SCHEMA_FIELDS:
            raise UserError(f"unknown --schema-field '{self.field}'", hint=f"use {', '.join(SCHEMA_FIELDS)}")
        if self.format == "json_object" and self.field != "response_format":
            raise UserError("--response-format json_object is a response_format; the guided fields take a schema",
                            hint="use json_schema:FILE with --schema-field")
        self.inner = in_series(self.inner, self.series, self.temperature)

    async def prepare(self, counter: PromptTokenCounter | None, needed: int | None = None) -> None:
        await self.inner.prepare(counter, needed)

    def constraint(self) -> dict[str, Any]:
        """The request fields that carry the format."""
        if self.format == "json_object":
            return {"response_format": {"type": "json_object"}}
        schema = self.schema or {}
        return {"response_format": {"response_format": {"type": "json_schema", "json_schema": {
                    "name": "answer", "strict": True, "schema": schema}}},
                "guided_json": {"guided_json": schema},
                "structured_outputs": {"structured_outputs": {"json": schema}},
                "json_schema": {"json_schema": schema}}[self.field]

    def request(self, index: int, model: str, *, tag: str = "", warmup: bool = False,
                accepts_ignore_eos: bool = False, accepts_min_tokens: bool = False) -> RequestSpec:
        spec = self.inner.request(index, model, tag=tag, warmup=warmup)  # neither ignore_eos nor min_tokens
        return replace(spec, body={**spec.body, **self.constraint()})

    def describe(self, accepts_ignore_eos: bool, accepts_min_tokens: bool = False) -> dict[str, Any]:
        d = dict(self.inner.describe(False, False))
        d["structured"] = {"format": self.format, "schema_file": self.schema_file, "field": self.field,
                           "schema": self.schema,
                           "not_sent": "ignore_eos and min_tokens: a constrained answer ends where its JSON does"}
        return d
