"""Tool calling: another workload's requests with `tools` (and `tool_choice`) added (docs/workloads.md#tools).

The prompts are the wrapped workload's (stories, synthetic, a dataset); `--tools builtin` without a dataset wraps
a small built-in set of prompts that ask for the built-in tools. What the figures need comes from the streamed
`tool_calls` deltas (bench/tool_calls.py, bench/answer_figures.py).

Two fields of the wrapped request are changed, and `describe` says so: `ignore_eos` and `min_tokens` are not sent
(a call ends where the model closes it, with finish_reason "tool_calls"; forcing more tokens would run past it),
and the request's counted `input_tokens` are dropped (the server renders the tool definitions into the prompt, so
the prompt it counts is longer than the one the workload measured).
"""

from __future__ import annotations

import json
import dataclasses
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from servelab.bench.client import RequestSpec
from servelab.bench.workloads.base import CHAT, OutputSpec, WorkloadSource
from servelab.bench.workloads.dataset import DatasetItem, DatasetWorkload
from servelab.bench.workloads.prompt_tokens import PromptTokenCounter
from servelab.errors import UserError

BUILTIN = "builtin"
TOOL_CHOICES = ("auto", "required", "none")

BUILTIN_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city name", "minLength": 1},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount of money from one currency to another.",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number", "minimum": 0},
            "from_currency": {"type": "string", "description": "ISO 4217 code, e.g. EUR"},
            "to_currency": {"type": "string", "description": "ISO 4217 code, e.g. USD"}},
            "required": ["amount", "from_currency", "to_currency"]}}},
    {"type": "function", "function": {
        "name": "search_flights", "description": "Find flights between two cities on a date.",
        "parameters": {"type": "object", "properties": {
            "origin": {"type": "string"}, "destination": {"type": "string"},
            "date": {"type": "string", "description": "YYYY-MM-DD"}},
            "required": ["origin", "destination", "date"]}}},
]

BUILTIN_PROMPTS = [
    "What is the weather in Paris right now? Use the get_weather tool.",
    "How much is 120 euros in US dollars? Use the convert_currency tool.",
    "Find me a flight from Lisbon to Oslo on 2027-03-14. Use the search_flights tool.",
    "Is it raining in Tokyo? Check with the get_weather tool, in celsius.",
    "Convert 75.5 British pounds to Japanese yen with the convert_currency tool.",
    "Search flights from Madrid to Berlin on 2027-05-02 with the search_flights tool.",
    "What is the temperature in Nairobi in fahrenheit? Use the get_weather tool.",
    "I have 3000 Swiss francs. How many euros is that? Use the convert_currency tool.",
    "Are there flights from Toronto to Mexico City on 2027-01-20? Use the search_flights tool.",
    "Tell me the weather in Buenos Aires with the get_weather tool.",
    "Convert 9.99 US dollars to Indian rupees using the convert_currency tool.",
    "Look up flights from Seoul to Sydney on 2027-07-07 with the search_flights tool.",
]


def builtin_prompts(endpoint: str, output: OutputSpec) -> DatasetWorkload:
    """The built-in prompts as a dataset workload, in order."""
    items = [DatasetItem(text, f"builtin tool prompt {n}") for n, text in enumerate(BUILTIN_PROMPTS, 1)]
    # a path no file has: the workload's description names the built-in set, and no file's hash stands for it
    return DatasetWorkload(path=Path("<builtin tool prompts>"), format="builtin-tool-prompts", items=items,
                           endpoint=endpoint, output=output)


def in_series(inner: Any, series: str, temperature: float | None = None) -> Any:
    """The wrapped workload numbered by `series`, where it numbers its prompts, and sampling at `temperature` (an
    experiment's, set on the wrapper: pipeline.py and experiment/model.py set both by dataclass field)."""
    names = {f.name for f in dataclasses.fields(inner)} if dataclasses.is_dataclass(inner) else set()
    if series and "series" in names:
        inner = dataclasses.replace(inner, series=series)
    if temperature is not None:
        if "temperature" in names:
            inner = dataclasses.replace(inner, temperature=temperature)
        elif "output" in names and dataclasses.is_dataclass(inner.output):
            inner = dataclasses.replace(inner, output=dataclasses.replace(inner.output, temperature=temperature))
    return inner


def load_tools(source: str) -> list[dict[str, Any]]:
    """`builtin`, or a JSON file holding OpenAI tool definitions: a list, or {"tools": [...]}."""
    if source == BUILTIN:
        return BUILTIN_TOOLS
    path = Path(source)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"cannot read --tools {source}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UserError(f"--tools {source} is not JSON: {exc}") from None
    tools = doc.get("tools") if isinstance(doc, dict) else doc
    if not isinstance(tools, list) or not tools:
        raise UserError(f"--tools {source}: expected a list of tool definitions (or {{\"tools\": [...]}})",
                        hint='each {"type": "function", "function": {"name": ..., "parameters": {...}}}')
    for n, tool in enumerate(tools, 1):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise UserError(f"--tools {source}: tool {n} has no function.name",
                            hint='each {"type": "function", "function": {"name": ..., "parameters": {...}}}')
        if "parameters" in function and not isinstance(function["parameters"], dict):
            raise UserError(f"--tools {source}: tool {n} ({function['name']}): parameters is not a JSON schema")
    return tools


def parse_tool_choice(value: str | None, tools: list[dict[str, Any]]) -> str | dict[str, Any] | None:
    """auto, required, none, or a declared tool's name (that tool forced); None: not sent (the server's default,
    auto)."""
    if value is None:
        return None
    if value in TOOL_CHOICES:
        return value
    names = [t["function"]["name"] for t in tools]
    if value not in names:
        raise UserError(f"bad --tool-choice '{value}'",
                        hint=f"use {', '.join(TOOL_CHOICES)} or a declared tool's name ({', '.join(names)})")
    return {"type": "function", "function": {"name": value}}


@dataclass
class ToolsWorkload:
    inner: WorkloadSource
    tools: list[dict[str, Any]]
    source: str  # "builtin" or the file's path
    tool_choice: str | dict[str, Any] | None = None
    series: str = ""  # numbers the wrapped workload's prompts apart per bench, where it numbers them (pipeline.py)
    temperature: float | None = None  # an experiment's sampling temperature, handed to the wrapped workload

    kind = "tools"

    @property
    def endpoint(self) -> str:
        return self.inner.endpoint

    def __post_init__(self) -> None:
        if self.inner.endpoint != CHAT:
            raise UserError("--tools needs the chat endpoint", hint="use --endpoint chat")
        self.inner = in_series(self.inner, self.series, self.temperature)

    async def prepare(self, counter: PromptTokenCounter | None, needed: int | None = None) -> None:
        await self.inner.prepare(counter, needed)

    def request(self, index: int, model: str, *, tag: str = "", warmup: bool = False,
                accepts_ignore_eos: bool = False, accepts_min_tokens: bool = False) -> RequestSpec:
        spec = self.inner.request(index, model, tag=tag, warmup=warmup)  # neither ignore_eos nor min_tokens
        body = {**spec.body, "tools": self.tools}
        if self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        return replace(spec, body=body, input_tokens=None)

    def describe(self, accepts_ignore_eos: bool, accepts_min_tokens: bool = False) -> dict[str, Any]:
        d = dict(self.inner.describe(False, False))
        d["tools"] = {"source": self.source, "names": [t["function"]["name"] for t in self.tools],
                      "tool_choice": self.tool_choice if self.tool_choice is not None else "not sent (auto)",
                      "not_sent": "ignore_eos and min_tokens: a call ends where the model closes it",
                      "input_tokens": "not compared with usage: the server renders the tools into the prompt"}
        return d
