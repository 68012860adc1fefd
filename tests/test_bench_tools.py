"""Tool calling and structured output in `bench`: the streamed tool_calls joined and timed, each call judged, each
answer checked against its schema (docs/metrics.md#tool-calls, #structured-output).

Against a scripted server in OpenAI's streaming format (the fake of tests/openai_fake.py, each prompt naming the
script its answer follows): calls split across many deltas, two parallel calls (index 0 and 1), a call to an
undeclared tool, arguments that do not parse or break the tool's schema; each counted right in the records and the
level's shares. Against the real engine: the embedded llama.cpp with a chat template that renders tools
(tests/llamacpp_tools_server.py), whose jinja path constrains and parses the calls and streams them as deltas."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from aiohttp import web
from openai_fake import FakeOpenAI, chunk, serving, usage, write_events

import servelab.api
from servelab.bench.options import BenchArgs, build_options
from servelab.bench.runner import bench
from servelab.bench.tool_calls import judge_calls, requested_schema
from servelab.bench.workloads.tools import BUILTIN_TOOLS
from servelab.errors import UserError
from servelab.models import resolve_model
from servelab.records import RequestRecord, ToolCall
from tests.conftest import embedded_argv, running_engine

HERE = Path(__file__).resolve().parent
WEATHER = '{"city": "Paris", "unit": "celsius"}'


def call_start(index: int, name: str, call_id: str) -> dict[str, Any]:
    return {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}


def fragments(index: int, text: str, size: int) -> list[dict[str, Any]]:
    return [chunk({"tool_calls": [{"index": index, "function": {"arguments": text[i:i + size]}}]})
            for i in range(0, len(text), size)]


def script(case: str) -> list[dict[str, Any] | str]:
    """The chunks of one answer, as an OpenAI-compatible server streams a tool call (tool_call_events in
    endpoints_fake.py is llama.cpp's order: the name on the first delta, the arguments in fragments after)."""
    head = [chunk({"role": "assistant", "content": None})]
    if case == "split":  # one character per delta
        body = [chunk({"tool_calls": [call_start(0, "get_weather", "call_a")]})] + fragments(0, WEATHER, 1)
    elif case == "parallel":  # two calls, their fragments interleaved
        flights = '{"origin": "Lisbon", "destination": "Oslo", "date": "2027-03-14"}'
        body = [chunk({"tool_calls": [call_start(0, "get_weather", "call_a")]}),
                chunk({"tool_calls": [call_start(1, "search_flights", "call_b")]})]
        for a, b in zip(fragments(0, WEATHER, 9), fragments(1, flights, 17)):
            body += [a, b]
        body += fragments(1, flights, 17)[len(fragments(0, WEATHER, 9)):]
    elif case == "undeclared":
        body = [chunk({"tool_calls": [call_start(0, "delete_everything", "call_a")]})] + fragments(0, "{}", 2)
    elif case == "unparsed":
        body = [chunk({"tool_calls": [call_start(0, "get_weather", "call_a")]})] + fragments(0, '{"city": "Par', 4)
    elif case == "schema":  # parses, names a declared tool, lacks the required city
        body = [chunk({"tool_calls": [call_start(0, "get_weather", "call_a")]})] + fragments(0, '{"unit": "K"}', 5)
    elif case == "text":  # the model chose to answer in words
        return head + [chunk({"content": w}) for w in ("It", " is", " sunny.")] + [chunk({}, "stop"),
                                                                                   chunk(usage=usage(9, 3)), "[DONE]"]
    else:
        raise AssertionError(case)
    return head + body + [chunk({}, "tool_calls"), chunk(usage=usage(9, len(body))), "[DONE]"]


async def scripted_tools(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    case = body["messages"][-1]["content"]
    if "tools" not in body:
        return await write_events(request, script("text"))
    return await write_events(request, script(case), gap_s=0.001)


def prompts(tmp_path: Path, cases: list[str]) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": case}) + "\n" for case in cases))
    return path


def _bench(url: str, **args: Any):
    records: list = []
    opts = build_options(BenchArgs(mode="single", max_tokens=64, warmup=0, **{"tokenizer": "none", **args}))
    result = bench(url, opts, on_record=records.append)
    return result, [r for r in records if not r.warmup]


def test_calls_split_parallel_undeclared_and_unparsed_are_each_counted_right(tmp_path) -> None:
    cases = ["split", "parallel", "undeclared", "unparsed", "schema", "text"]
    with serving(FakeOpenAI(chat_route=scripted_tools).app()) as url:
        result, records = _bench(url, tools="builtin", dataset=prompts(tmp_path, cases), requests=len(cases))
    by_case = dict(zip(cases, sorted(records, key=lambda r: r.index)))
    split = by_case["split"]
    assert [(c.index, c.id, c.name, c.arguments, c.fragments) for c in split.tool_calls] == [
        (0, "call_a", "get_weather", WEATHER, len(WEATHER))]
    assert (split.tool_calls_parse, split.tool_calls_valid, split.tool_problem) == (True, True, None)
    # every tool-call delta is a token of the answer (one per delta, counted by chunk: no running count here)
    assert split.count_method == "chunk_count" and split.output_tokens == 1 + len(WEATHER) and split.text == ""
    parallel = by_case["parallel"]
    assert [(c.index, c.name) for c in parallel.tool_calls] == [(0, "get_weather"), (1, "search_flights")]
    assert json.loads(parallel.tool_calls[1].arguments)["destination"] == "Oslo"
    assert parallel.tool_calls_valid is True
    assert (by_case["undeclared"].tool_calls_parse, by_case["undeclared"].tool_calls_valid) == (True, False)
    assert "'delete_everything', which is not a declared tool" in by_case["undeclared"].tool_problem
    assert (by_case["unparsed"].tool_calls_parse, by_case["unparsed"].tool_calls_valid) == (False, False)
    assert "arguments are not JSON" in by_case["unparsed"].tool_problem
    assert (by_case["schema"].tool_calls_parse, by_case["schema"].tool_calls_valid) == (True, False)
    assert "'city' is a required property" in by_case["schema"].tool_problem
    text = by_case["text"]
    assert text.tool_calls == [] and text.t_first_tool_ns is None and text.tool_calls_parse is None
    for r in records:
        if r.tool_calls:
            assert r.t_send_ns < r.t_first_tool_ns <= r.t_tool_done_ns <= r.t_end_ns
    figures = result.levels[0].figures
    assert figures["tool_call_share"].value == pytest.approx(5 / 6)
    assert figures["tool_parse_share"].value == pytest.approx(4 / 5)  # all but unparsed
    assert figures["tool_valid_share"].value == pytest.approx(2 / 5)  # split and parallel
    assert figures["tool_first_ms"].dist.n == 5 and figures["tool_call_ms"].dist.n == 5
    assert figures["tool_first_ms"].dist.max <= figures["tool_call_ms"].dist.max <= figures["e2e_ms"].dist.max
    assert "schema_valid_share" not in figures


def test_a_run_without_tools_has_no_tool_figures_and_its_records_no_tool_fields(tmp_path) -> None:
    with serving(FakeOpenAI(chat_route=scripted_tools).app()) as url:
        result, records = _bench(url, dataset=prompts(tmp_path, ["split"]), requests=1)
    assert not [k for k in result.levels[0].figures if k.startswith(("tool_", "schema_"))]
    assert records[0].tool_calls is None and records[0].schema_valid is None


async def json_answers(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    answer = {"valid": '{"name": "Ada", "age": 36}', "old": '{"name": "Ada", "age": 400}',
              "prose": "Ada is 36.", "list": "[1, 2]"}.get(body["messages"][-1]["content"], "Hello.")
    pieces = [answer[i:i + 3] for i in range(0, len(answer), 3)]
    return await write_events(request, [chunk({"content": p}) for p in pieces]
                              + [chunk({}, "stop"), chunk(usage=usage(5, len(pieces))), "[DONE]"])


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "maximum": 150}},
          "required": ["name", "age"]}


def test_answers_are_checked_against_the_schema_and_the_share_counts_the_valid_ones(tmp_path) -> None:
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps({"name": "person", "schema": PERSON}))  # OpenAI's wrapper is read too
    cases = ["valid", "old", "prose", "list"]
    seen: list[dict] = []

    async def recording(request: web.Request) -> web.StreamResponse:
        seen.append(await request.json())
        return await json_answers(request)
    fake = FakeOpenAI(chat_route=recording)
    with serving(fake.app()) as url:
        result, records = _bench(url, response_format=f"json_schema:{schema}", dataset=prompts(tmp_path, cases),
                                 requests=4)
        object_result, object_records = _bench(url, response_format="json_object",
                                               dataset=prompts(tmp_path, cases), requests=4)
    sent = [b for b in seen if b["messages"][-1]["content"] in cases][0]  # not the bench's own probes
    assert sent["response_format"]["json_schema"]["schema"] == PERSON
    assert "ignore_eos" not in sent and requested_schema(sent) == ("json_schema", PERSON)
    verdicts = {r.text: r.schema_valid for r in records}
    assert verdicts == {'{"name": "Ada", "age": 36}': True, '{"name": "Ada", "age": 400}': False,
                        "Ada is 36.": False, "[1, 2]": False}
    assert result.levels[0].figures["schema_valid_share"].value == 0.25
    assert object_result.levels[0].figures["schema_valid_share"].value == 0.5  # both objects, whatever the age
    assert {r.text: r.schema_valid for r in object_records}["[1, 2]"] is False


def test_the_guided_fields_carry_the_schema_and_are_read_back(tmp_path) -> None:
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    for field, sent in (("guided_json", lambda b: b["guided_json"]),
                        ("structured_outputs", lambda b: b["structured_outputs"]["json"]),
                        ("json_schema", lambda b: b["json_schema"])):
        opts = build_options(BenchArgs(response_format=f"json_schema:{schema}", schema_field=field))
        body = opts.workload.request(0, "m").body
        assert sent(body) == PERSON and "response_format" not in body
        assert requested_schema(body) == ("json_schema", PERSON)


def test_judging_calls_by_hand_agrees_with_a_reparse() -> None:
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in BUILTIN_TOOLS}
    calls = [ToolCall(index=0, name="get_weather", arguments='{"city": "Rome"}'),
             ToolCall(index=1, name="convert_currency", arguments='{"amount": -1, "from_currency": "EUR", '
                                                                   '"to_currency": "USD"}')]
    parse, valid, problem = judge_calls(calls, tools)
    assert (parse, valid) == (True, False) and "tool call 1 (convert_currency)" in problem
    assert judge_calls(calls[:1], tools) == (True, True, None)
    assert judge_calls([ToolCall(index=0, name="get_weather", arguments="[1]")], tools)[:2] == (False, False)


def test_tool_and_format_options_are_refused_in_one_line(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('[{"type": "function"}]')
    for args, words in ((dict(tool_choice="required"), "--tool-choice needs --tools"),
                        (dict(tools=str(bad)), "tool 1 has no function.name"),
                        (dict(tools=str(tmp_path / "missing.json")), "cannot read --tools"),
                        (dict(tools="builtin", tool_choice="get_time"), "bad --tool-choice 'get_time'"),
                        (dict(tools="builtin", endpoint="completions"), "--tools needs the chat endpoint"),
                        (dict(response_format="yaml"), "bad --response-format 'yaml'"),
                        (dict(response_format="json_object", schema_field="guided_json"),
                         "json_object is a response_format"),
                        (dict(schema_field="guided_json"), "--schema-field needs --response-format")):
        with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
            build_options(BenchArgs(**args))
    forced = build_options(BenchArgs(tools="builtin", tool_choice="get_weather")).workload.request(0, "m").body
    assert forced["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert [t["function"]["name"] for t in forced["tools"]] == ["get_weather", "convert_currency", "search_flights"]
    assert "ignore_eos" not in forced and "Use the get_weather tool" in forced["messages"][0]["content"]


# ---- the real engine -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tools_engine(tmp_path_factory):
    log = tmp_path_factory.mktemp("tools-engine") / "engine.log"
    with running_engine(embedded_argv("--ctx-size", "2048", parallel=2, launcher="llamacpp_tools_server.py"),
                        log) as url:
        yield {"url": url, "model": resolve_model("smollm2").served_name}


def stored_records(run_dir: Path) -> list[dict]:
    path = next(Path(run_dir).rglob("records.jsonl*"))
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.mark.engine
@pytest.mark.slow  # the real engine: the slow tier (CI runs it); the scripted streams above stay in the default suite
def test_the_real_engine_streams_tool_calls_that_are_timed_in_order_and_judged_as_a_reparse_says(
        tools_engine, tmp_path) -> None:
    tool_file = tmp_path / "weather.json"
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    tool_file.write_text(json.dumps([weather]))
    # SmolLM2-135M answers in prose before a call; an assistant turn that opens the call (a prefill the engine
    # continues) makes it write one, which llama.cpp's grammar then holds to the tool's schema.
    dataset = tmp_path / "prefill.jsonl"
    dataset.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"What is the weather in {city}? Use the get_weather tool."},
        {"role": "assistant", "content": "<tool_call>\n"}]}) + "\n" for city in ("Paris", "Rome", "Oslo")))
    records: list = []
    opts = build_options(BenchArgs(mode="single", max_tokens=20, warmup=0, requests=3, tools=str(tool_file),
                                   tool_choice="required", dataset=dataset, tokenizer="none"))
    result = bench(tools_engine["url"], opts, on_record=records.append)
    measured = [r for r in records if not r.warmup]
    assert len(measured) == 3 and all(r.ok for r in measured), [r.error_detail for r in measured]
    assert all(r.tool_calls for r in measured), [r.text for r in measured]
    for r in measured:
        assert r.t_send_ns < r.t_first_tool_ns <= r.t_tool_done_ns <= r.t_end_ns
        assert r.tool_calls[0].name == "get_weather" and r.tool_calls[0].fragments > 1
        # the call's tokens are counted from llama.cpp's running counts, to the server's own total
        assert r.count_method == "server_per_chunk" and r.output_tokens == r.usage.completion_tokens > 0
    # the share, reparsed from the calls as recorded: their arguments parse and validate against the tool's schema
    def reparsed_valid(r) -> bool:
        try:
            return all(c.name == "get_weather" and not list(jsonschema.Draft202012Validator(
                weather["function"]["parameters"]).iter_errors(json.loads(c.arguments))) for c in r.tool_calls)
        except ValueError:
            return False
    figures = result.levels[0].figures
    assert figures["tool_call_share"].value == 1.0
    assert figures["tool_valid_share"].value == sum(map(reparsed_valid, measured)) / 3
    assert figures["tool_first_ms"].dist.n == 3


@pytest.mark.engine
@pytest.mark.slow  # the real engine, as above
def test_the_real_engine_answers_in_the_schema_and_the_share_is_what_jsonschema_says_of_the_stored_answers(
        tools_engine, tmp_path) -> None:
    schema = tmp_path / "person.json"
    person = {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["name", "age"], "additionalProperties": False}
    schema.write_text(json.dumps(person))
    dataset = tmp_path / "people.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"Describe {who}: give their name and age."}) + "\n"
                               for who in ("a baker", "a pilot", "a poet")))
    out = tmp_path / "run"
    run = servelab.api.bench(tools_engine["url"], mode="single", max_tokens=24, warmup=0, requests=3,
                             dataset=dataset, response_format=f"json_schema:{schema}", tokenizer="none", out=out)
    result = run.result
    stored = [r for r in stored_records(run.run_dir) if not r["warmup"]]

    def valid(text: str) -> bool:
        try:
            return not list(jsonschema.Draft202012Validator(person).iter_errors(json.loads(text)))
        except ValueError:
            return False
    texts = [RequestRecord.model_validate(r).text for r in stored]
    assert len(texts) == 3 and all(texts)
    assert result.levels[0].figures["schema_valid_share"].value == sum(map(valid, texts)) / 3
    assert [r["schema_valid"] for r in stored] == [valid(t) for t in texts]


def test_the_exports_and_compare_carry_the_tool_figures_and_a_run_without_tools_shows_none(tmp_path) -> None:
    from servelab.compare.compare import compare_runs
    from servelab.compare.sources import load_run_dir
    from servelab.report.html_sections import answers_table
    from servelab.store.export import export_csv

    cases = ["split", "unparsed", "text"]
    with serving(FakeOpenAI(chat_route=scripted_tools).app()) as url:
        runs = [servelab.api.bench(url, mode="single", max_tokens=64, warmup=0, tokenizer="none", requests=3,
                                   dataset=prompts(tmp_path, cases), out=tmp_path / name, **extra)
                for name, extra in (("tools", {"tools": "builtin"}), ("again", {"tools": "builtin"}),
                                    ("plain", {}))]
    records = [RequestRecord.model_validate(r) for r in stored_records(runs[0].run_dir)]
    header, *rows = (line.split(",") for line in export_csv(records, runs[0].result.levels, tmp_path / "csv")[0]
                     .read_text().splitlines())
    by_prompt = {row[header.index("index")]: dict(zip(header, row)) for row in rows}
    assert [by_prompt[str(i)]["tool_calls"] for i in range(3)] == ["1", "1", "0"]
    assert [by_prompt[str(i)]["tool_calls_valid"] for i in range(3)] == ["True", "False", ""]
    assert float(by_prompt["0"]["tool_first_ms"]) <= float(by_prompt["0"]["tool_call_ms"])
    loaded = [load_run_dir(run.run_dir) for run in runs]
    comparison = compare_runs(loaded)
    html = answers_table(loaded[0].trials)  # the HTML report's table, trial by trial
    assert "Tool calls and structured output" in html and "66.7 %" in html and "50.0 %" in html
    assert answers_table(loaded[2].trials) == ""
    shares = next(r for r in comparison.rows if r.key == "single.tool_valid_share")
    assert [cell.value for cell in shares.figures[:2]] == [50.0, 50.0]  # 1 of the 2 requests that called
    assert shares.figures[2].value is None  # the run without tools has no such figure
    assert "single.schema_valid_share" not in [r.key for r in comparison.rows]


def test_an_experiments_series_and_temperature_reach_the_wrapped_prompts(tmp_path) -> None:
    import dataclasses

    from servelab.pipeline import in_series

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps({"tools": BUILTIN_TOOLS[:1]}))
    workload = build_options(BenchArgs(tools=str(tools), response_format="json_object")).workload
    numbered = dataclasses.replace(in_series(workload, 2, "single"), temperature=0.7)
    body = numbered.request(3, "m").body
    assert body["temperature"] == 0.7 and body["response_format"] == {"type": "json_object"}
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather"]
    assert "Story number t2-single-3." in body["messages"][0]["content"]  # the stories, numbered for this bench


def test_a_piece_without_an_index_spoils_its_requests_calls_and_object_arguments_are_joined() -> None:
    from servelab.bench.tool_calls import ToolCallJoiner, judge_answer

    joiner = ToolCallJoiner()
    joiner.add([{"index": 0, "id": "c", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}], 5)
    joiner.add([{"function": {"arguments": "}"}}], 7)  # no index: a streaming client cannot place it
    record = RequestRecord(index=0, endpoint="/v1/chat/completions", t_send_ns=1, t_end_ns=9, ok=True)
    judge_answer(record, {"tools": BUILTIN_TOOLS}, joiner, 8)
    assert json.loads(record.tool_calls[0].arguments) == {"city": "Oslo"}
    assert (record.t_first_tool_ns, record.t_tool_done_ns) == (5, 8)
    assert (record.tool_calls_parse, record.tool_calls_valid) == (False, False)
    assert record.tool_problem.startswith("a tool_calls piece without an integer index")


def judged(index: int, body: dict, joiner) -> RequestRecord:
    from servelab.bench.tool_calls import judge_answer

    t = 10**12 + index * 10**8
    record = RequestRecord(index=index, endpoint="/v1/chat/completions", t_send_ns=t, t_end_ns=t + 10**7, ok=True)
    judge_answer(record, body, joiner, t + 5 * 10**6)
    return record


def joined(index: int, *pieces: dict):
    """The pieces of request `index` (as judged() times it), each arriving 1 ms after it was sent."""
    from servelab.bench.tool_calls import ToolCallJoiner

    joiner = ToolCallJoiner()
    for piece in pieces:
        joiner.add([piece], 10**12 + index * 10**8 + 10**6)
    return joiner


def test_the_call_share_is_over_the_requests_that_declared_tools_and_unplaced_pieces_are_calls() -> None:
    from servelab.bench.answer_figures import answer_figures
    from servelab.bench.tally import LevelTally

    call = {"index": 0, "id": "c", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    records = [
        judged(0, {"tools": BUILTIN_TOOLS}, joined(0, call)),  # declared, called: parses and is valid
        judged(1, {"tools": BUILTIN_TOOLS}, None),  # declared, answered in words
        # declared, and its only piece has no index: a call was made, and it does not parse
        judged(2, {"tools": BUILTIN_TOOLS}, joined(2, {"function": {"arguments": "{}"}})),
        judged(3, {}, joined(3, call)),  # declared none, got a call anyway: recorded, in no share
    ]
    assert [r.tools_declared for r in records] == [len(BUILTIN_TOOLS)] * 3 + [None]
    assert records[3].tool_calls and records[3].tool_calls_valid is False  # named a tool nobody declared
    assert records[2].tool_calls == [] and records[2].tool_calls_parse is False
    assert records[2].t_send_ns < records[2].t_first_tool_ns <= records[2].t_tool_done_ns <= records[2].t_end_ns
    figures = answer_figures(LevelTally.from_records(records).tool_rows, [])
    assert figures["tool_call_share"].value == pytest.approx(2 / 3)  # requests 0 and 2, of the three that declared
    assert figures["tool_parse_share"].value == pytest.approx(1 / 2)  # request 0 of the two that called
    assert figures["tool_valid_share"].value == pytest.approx(1 / 2)
