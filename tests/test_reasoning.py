"""Reasoning, end to end (issue 12): thinking that leaks into content, the missing parser at launch, and reasoning
and answer tokens counted apart in every figure.

The servers here speak each engine's real reasoning format: the SGLang and vLLM replays (engines/replay_http.py)
with and without `--reasoning-parser` (SGLang `reasoning_content` and top-level `usage.reasoning_tokens`, vLLM
`reasoning` and `completion_tokens_details.reasoning_tokens`), a llama.cpp-shaped server (`/props`,
`reasoning_content`, or `<think>` left in content by `--reasoning-format none`), a server that leaves `<think>`
in content as TGI and llama-cpp-python do, and the calibration server for the bench. The story's reply is played
byte for byte by the SGLang replay serving `/shared/kimi-k2.5-int4` without a parser.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from rich.console import Console
from typer.testing import CliRunner

import synthetic_runs
from openai_fake import serving, write_events
from servelab.bench.metrics import summarize
from servelab.bench.steady import apply as apply_steady
from servelab.calibration import Script, start_calibration_server
from servelab.cli import app as cli_app
from servelab.compare.compare import compare_runs, regressions
from servelab.compare.sources import from_summary
from servelab.engines import EngineSpec, get_engine
from servelab.engines.reasoning_families import FAMILIES, family_of, fix_for
from servelab.engines.replay_http import ReplayHTTP, ReplayState
from servelab.engines.sglang import sglang_lint
from servelab.engines.vllm import vllm_lint
from servelab.records import RequestRecord, SteadyState, TokenEvent
from servelab.report.html import render_report
from servelab.report.terminal import render_reasoning
from servelab.verify import verify

KIMI = "/shared/kimi-k2.5-int4"
STORY_QUESTION = "What is 2+2? Reply in one word."
# The story's reply, as SGLang sent it for Kimi-K2.5 without a reasoning parser (issue 12).
STORY_CONTENT = (" The user is asking for the answer to \"2+2\" and wants me to reply in one word.\n\n 2+2 = 4\n\n"
                 " The word")
STORY_MESSAGE = {"role": "assistant", "content": STORY_CONTENT, "reasoning_content": None}


def checks_of(url: str, *ids: str) -> dict[str, Any]:
    result = verify(url, only=list(ids) or None)
    return {c.id: c for c in result.checks if c.reason != "not selected"}


@contextmanager
def replay(engine: str, model: str = KIMI, parser: str | None = None) -> Iterator[tuple[str, ReplayState]]:
    """The engine's HTTP side as its replay answers it, serving `model`, with or without a reasoning parser."""
    state = ReplayState(engine=engine, version="0.33.0" if engine == "vllm" else "0.5.10.post1", model=model,
                        server_args={"model_path": model, "reasoning_parser": parser, "disable_cuda_graph": False,
                                     "enable_metrics": True}, health=200)
    http = ReplayHTTP("127.0.0.1", 0, state)
    http.listen()
    try:
        yield f"http://127.0.0.1:{http.port}", state
    finally:
        http.close()


def story_request(max_tokens: int = 32, **extra: Any) -> dict[str, Any]:
    return {"model": KIMI, "messages": [{"role": "user", "content": STORY_QUESTION}], "temperature": 0,
            "max_tokens": max_tokens} | extra


# ---------------------------------------------------------------------------------------------------------------
# The family table
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model, sglang, vllm", [
    (KIMI, "kimi_k2", "kimi_k2"),
    ("moonshotai/Kimi-K2-Thinking", "kimi_k2", "kimi_k2"),
    ("deepseek-ai/DeepSeek-R1-0528", "deepseek-r1", "deepseek_r1"),
    ("deepseek-ai/DeepSeek-V3.1-Terminus", "deepseek-v3", "deepseek_v3"),
    ("Qwen/Qwen3-235B-A22B", "qwen3", "qwen3"),
    ("Qwen/Qwen3-30B-A3B-Thinking-2507", "qwen3-thinking", "qwen3"),
    ("Qwen/QwQ-32B", "deepseek-r1", "deepseek_r1"),
    ("openai/gpt-oss-120b", "gpt-oss", "openai_gptoss"),
    ("zai-org/GLM-4.6", "glm45", "glm45"),
    ("MiniMaxAI/MiniMax-M2", "minimax", "minimax_m2"),
])
def test_known_families_name_each_engines_parser(model: str, sglang: str, vllm: str) -> None:
    family = family_of(model)
    assert family is not None and (family.sglang, family.vllm) == (sglang, vllm)


@pytest.mark.parametrize("model", ["moonshotai/Kimi-K2-Instruct-0905", "/models/DeepSeek-V3-0324-INT4",
                                   "Qwen/Qwen3-235B-A22B-Instruct-2507", "Qwen/Qwen3-Coder-480B-A35B-Instruct",
                                   "SmolLM2-135M-Instruct", "meta-llama/Llama-3.1-70B-Instruct"])
def test_models_that_do_not_reason_are_not_a_family(model: str) -> None:
    assert family_of(model) is None


def test_every_parser_name_is_one_the_engines_register() -> None:
    # SGLang 0.5.10.post1's DetectorMap and vLLM's _REASONING_PARSERS_TO_REGISTER (reasoning_families.py)
    sglang = {"deepseek-r1", "deepseek-v3", "qwen3", "qwen3-thinking", "glm45", "gpt-oss", "kimi", "kimi_k2", "mimo",
              "minimax", "minimax-append-think", "step3", "step3p5", "mistral", "nemotron_3", "interns1"}
    vllm = {"deepseek_r1", "deepseek_v3", "ernie45", "glm45", "glm47", "openai_gptoss", "granite", "hunyuan_a13b",
            "kimi_k2", "kimi_k3", "mimo", "minimax_m2", "minimax_m2_append_think", "mistral", "nemotron_v3",
            "olmo3", "qwen3", "seed_oss", "step3", "step3p5"}
    for family in FAMILIES:
        assert {family.sglang, *family.sglang_also} - {None} <= sglang, family.name
        assert {family.vllm, *family.vllm_also} - {None} <= vllm, family.name


def test_the_fix_names_the_engine_it_recognised_or_every_engine() -> None:
    kimi = family_of(KIMI)
    assert fix_for("sglang", kimi) == "SGLang: start it with --reasoning-parser kimi_k2"
    assert fix_for("vllm", kimi) == "vLLM: start it with --reasoning-parser kimi_k2"
    assert "--reasoning-format deepseek" in fix_for("llamacpp", kimi)
    every = fix_for(None, kimi)
    assert "SGLang: start it with --reasoning-parser kimi_k2" in every and "vLLM" in every and "llama.cpp" in every


# ---------------------------------------------------------------------------------------------------------------
# verify: the story's reply, and each engine's formats
# ---------------------------------------------------------------------------------------------------------------

def test_the_sglang_replay_without_a_parser_answers_the_story_byte_for_byte() -> None:
    state = ReplayState(engine="sglang", version="0.5.10.post1", model=KIMI, server_args={"reasoning_parser": None})
    status, raw, _ = state.post("/v1/chat/completions", story_request())
    body = json.loads(raw)
    assert status == 200
    assert json.dumps(STORY_MESSAGE).encode() in raw  # the message as the story quotes it, byte for byte
    assert body["choices"][0]["message"] == STORY_MESSAGE
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 32


def test_verify_fails_the_storys_reply_naming_sglangs_kimi_parser() -> None:
    with replay("sglang") as (url, _):
        out = CliRunner().invoke(cli_app, ["verify", url, "--only", "models", "--only", "chat", "--json"])
    assert out.exit_code == 1, out.output
    chat = next(c for c in json.loads(out.stdout)["checks"] if c["id"] == "chat")
    assert chat["outcome"] == "fail"
    assert json.loads(chat["response_excerpt"])["choices"][0]["message"] == STORY_MESSAGE
    reason = chat["reason"]
    assert "SGLang: start it with --reasoning-parser kimi_k2" in reason
    for evidence in ("asked for one word, got 22 words", "finish_reason length at the budget (max_tokens 32, "
                     "completion_tokens 32)", "the text talks about the request", "reasoning_content null",
                     f"model '{KIMI}' is Kimi"):
        assert evidence in reason


def test_the_same_server_with_the_parser_passes() -> None:
    """Thinking in reasoning_content and a one-word answer, as SGLang sends them with --reasoning-parser kimi_k2:
    here the thinking is longer than 32 tokens, so chat asks once more with a larger budget."""
    with replay("sglang", parser="kimi_k2") as (url, state):
        checks = checks_of(url, "models", "chat", "chat_stream", "reasoning")
    assert {k: c.outcome for k, c in checks.items()} == {"models": "pass", "chat": "pass", "chat_stream": "pass",
                                                          "reasoning": "pass"}
    assert "asked again with max_tokens 512: answer \"Four\"" in checks["chat"].reason
    retry = next(r["body"] for r in state.requests if r["body"].get("max_tokens") == 512 and not r["body"].get(
        "stream"))
    assert retry["messages"][0]["content"] == STORY_QUESTION
    assert "reasoning tokens counted" in checks["reasoning"].reason  # SGLang's top-level usage.reasoning_tokens


def sglang_like(message: dict[str, Any], finish: str, completion: int, *, reasoning_tokens: int = 0,
                model: str = KIMI) -> web.Application:
    """A server that answers the chat request with `message` (and the same, streamed, piece by piece)."""
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        usage = {"prompt_tokens": 14, "completion_tokens": completion, "total_tokens": 14 + completion,
                 "reasoning_tokens": reasoning_tokens}
        if not body.get("stream"):
            return web.json_response({"id": "c1", "object": "chat.completion", "model": model, "choices": [
                {"index": 0, "message": message, "finish_reason": finish}], "usage": usage})
        def piece(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {"id": "c1", "object": "chat.completion.chunk", "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
        events: list[Any] = [piece({"role": "assistant", "content": ""})]
        for field in ("reasoning_content", "reasoning", "content"):
            if message.get(field):
                events += [piece({field: word}) for word in re.findall(r"\s*\S+", message[field])]
        events += [piece({}, finish), {"id": "c1", "object": "chat.completion.chunk", "model": model, "choices": [],
                                       "usage": usage}, "[DONE]"]
        return await write_events(request, events)

    async def models(request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def test_thinking_in_reasoning_content_and_a_one_word_answer_pass_at_once() -> None:
    message = {"role": "assistant", "content": "Four",
               "reasoning_content": "The user asks for 2+2 in one word. 2+2 = 4, so: Four."}
    with serving(sglang_like(message, "stop", 21, reasoning_tokens=20)) as url:
        checks = checks_of(url, "models", "chat", "chat_stream")
    assert [c.outcome for c in checks.values()] == ["pass", "pass", "pass"]
    assert "asked again" not in checks["chat"].reason


def test_a_model_that_spends_every_budget_thinking_is_warned_about() -> None:
    message = {"role": "assistant", "content": None, "reasoning_content": "Let me think. " * 8}
    with serving(sglang_like(message, "length", 32, reasoning_tokens=32)) as url:
        checks = checks_of(url, "models", "chat")
    assert checks["chat"].outcome == "warn"
    assert "spent the whole max_tokens=32 thinking" in checks["chat"].reason
    assert "asked again with max_tokens 512: still no content" in checks["chat"].reason


@pytest.mark.parametrize("parser", [None, "kimi_k2"])
def test_vllm_replay_reasoning_field_with_and_without_its_parser(parser: str | None) -> None:
    with replay("vllm", parser=parser) as (url, state):
        checks = checks_of(url, "models", "chat", "reasoning")
        _, raw, _ = state.post("/v1/chat/completions", story_request(512))
    message = json.loads(raw)["choices"][0]["message"]
    if parser is None:
        assert checks["chat"].outcome == "fail"
        assert "vLLM: start it with --reasoning-parser kimi_k2" in checks["chat"].reason
        assert "reasoning null" in checks["chat"].reason
        assert message["reasoning"] is None and "</think>Four" in message["content"]
        assert checks["reasoning"].outcome == "fail" and "</think>" in checks["reasoning"].reason
    else:
        assert checks["chat"].outcome == "pass" and checks["reasoning"].outcome == "pass"
        assert message["content"] == "Four" and message["reasoning"].startswith(STORY_CONTENT)
        assert "reasoning_content" not in message  # vLLM >= 0.16 says `reasoning` only


def llamacpp_like(reasoning_format: str) -> web.Application:
    """llama.cpp's server serving a Qwen3 GGUF: /props, and chat with `--reasoning-format deepseek` (thinking in
    reasoning_content) or `none` (thinking, tags and all, in content)."""
    model_path = "/models/Qwen3-8B-Q4_K_M.gguf"
    thinking = "Okay, so the user is asking what 2+2 is, in one word. That is four."

    async def props(request: web.Request) -> web.StreamResponse:
        return web.json_response({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 4,
                                  "model_path": model_path, "build_info": "b6153-0c1e570"})

    async def models(request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": "Qwen3-8B-Q4_K_M.gguf", "object": "model"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if reasoning_format == "none":
            message = {"role": "assistant", "content": f"<think>\n{thinking}\n</think>\n\nFour"}
        else:
            message = {"role": "assistant", "content": "Four", "reasoning_content": thinking}
        usage = {"prompt_tokens": 16, "completion_tokens": 24, "total_tokens": 40}
        if not body.get("stream"):
            return web.json_response({"object": "chat.completion", "model": "Qwen3-8B-Q4_K_M.gguf", "choices": [
                {"index": 0, "message": message, "finish_reason": "stop"}], "usage": usage})
        def piece(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta,
                                                                    "finish_reason": finish}]}
        events: list[Any] = [piece({"role": "assistant", "content": None})]
        if message.get("reasoning_content"):
            events += [piece({"reasoning_content": w}) for w in re.findall(r"\s*\S+", thinking)]
        events += [piece({"content": w}) for w in re.findall(r"\s*\S+", message["content"])]
        events += [piece({}, "stop"), {"object": "chat.completion.chunk", "choices": [], "usage": usage}, "[DONE]"]
        return await write_events(request, events)

    app = web.Application()
    app.router.add_get("/props", props)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def test_llamacpp_with_reasoning_format_none_fails_naming_reasoning_format() -> None:
    with serving(llamacpp_like("none")) as url:
        checks = checks_of(url, "models", "chat", "reasoning")
    assert checks["chat"].outcome == "fail"
    assert "llama.cpp: --reasoning-format deepseek" in checks["chat"].reason
    assert "thinking tags in content" in checks["chat"].reason and "Qwen3" in checks["chat"].reason
    assert checks["reasoning"].outcome == "fail"


def test_llamacpp_reasoning_content_passes() -> None:
    with serving(llamacpp_like("deepseek")) as url:
        checks = checks_of(url, "models", "chat", "chat_stream", "reasoning")
    assert checks["chat"].outcome == "pass" and checks["chat_stream"].outcome == "pass"
    # llama.cpp counts reasoning inside completion_tokens without saying how much: a warning, never a fail
    assert checks["reasoning"].outcome == "warn" and "not counted separately" in checks["reasoning"].reason


def test_think_tags_from_an_unknown_model_are_a_warning_naming_every_engines_fix() -> None:
    message = {"role": "assistant", "content": "<think>\nThe user wants 2+2 in a word.\n</think>\n\nFour"}
    with serving(sglang_like(message, "stop", 20, model="org/house-model-7b")) as url:
        checks = checks_of(url, "models", "chat")
    assert checks["chat"].outcome == "warn"
    reason = checks["chat"].reason
    assert "looks like thinking in content" in reason and "thinking tags in content" in reason
    assert "SGLang: --reasoning-parser NAME" in reason and "llama.cpp: --reasoning-format deepseek" in reason


def test_a_plain_one_word_answer_from_a_plain_model_raises_nothing() -> None:
    with serving(sglang_like({"role": "assistant", "content": "Four."}, "stop", 2, model="org/plain-7b")) as url:
        checks = checks_of(url, "models", "chat")
    assert checks["chat"].outcome == "pass", checks["chat"].reason


# ---------------------------------------------------------------------------------------------------------------
# Lint at launch: a known reasoning family without its parser
# ---------------------------------------------------------------------------------------------------------------

SGLANG_STORY = ["python", "-m", "sglang.launch_server", "--model-path", KIMI, "--tp-size", "8",
                "--trust-remote-code", "--tool-call-parser", "kimi_k2"]


def reasoning_finding(findings):
    return next((f for f in findings if "reasoning" in f.setting), None)


def test_sglang_lint_flags_kimi_without_its_parser_from_the_command_line_and_server_info() -> None:
    alone = reasoning_finding(sglang_lint(SGLANG_STORY, None))
    assert alone.severity == "serious" and "--reasoning-parser kimi_k2" in alone.why
    assert "TTFO and answer-token figures count thinking as answer" in alone.why and "[command line]" in alone.why
    # /server_info says reasoning_parser null (and names the model, even when the command line is not known)
    config = {"model_path": KIMI, "reasoning_parser": None}
    both = reasoning_finding(sglang_lint(SGLANG_STORY, config))
    assert both.severity == "serious" and "[command line and /server_info]" in both.why
    server = reasoning_finding(sglang_lint(["python"], config))
    assert server.severity == "serious" and "[/server_info]" in server.why
    assert reasoning_finding(sglang_lint([*SGLANG_STORY, "--reasoning-parser", "kimi_k2"], None)) is None
    assert reasoning_finding(sglang_lint(["python"], {**config, "reasoning_parser": "kimi_k2"})) is None
    wrong = reasoning_finding(sglang_lint([*SGLANG_STORY, "--reasoning-parser", "deepseek-r1"], None))
    assert wrong.severity == "warn" and "names kimi_k2" in wrong.why
    # a model that does not reason is not a finding
    assert reasoning_finding(sglang_lint(["python", "--model-path", "/models/DeepSeek-V3-0324-INT4"], None)) is None


def test_vllm_lint_and_hybrids_that_think_only_when_asked() -> None:
    serve = ["vllm", "serve", "Qwen/Qwen3-235B-A22B", "--tensor-parallel-size", "8"]
    found = reasoning_finding(vllm_lint(serve, None))
    assert found.severity == "serious" and "--reasoning-parser qwen3" in found.why
    assert reasoning_finding(vllm_lint([*serve, "--reasoning-parser", "qwen3"], None)) is None
    hybrid = reasoning_finding(vllm_lint(["python", "-m", "vllm.entrypoints.openai.api_server", "--model",
                                          "deepseek-ai/DeepSeek-V3.1"], None))
    assert hybrid.severity == "warn" and "whenever a request turns thinking on" in hybrid.why
    dev_mode = {"model_config": {"model": "openai/gpt-oss-120b"}, "structured_outputs_config": {
        "reasoning_parser": ""}}
    assert reasoning_finding(vllm_lint(["python"], dev_mode)).severity == "serious"


def test_llamacpp_lint_flags_reasoning_format_none_for_a_reasoning_model() -> None:
    adapter = get_engine("llama-server")
    spec = EngineSpec(engine="llama-server", model="/models/Qwen3-8B-Q4_K_M.gguf")
    command = ["llama-server", "-m", "/models/Qwen3-8B-Q4_K_M.gguf", "--reasoning-format", "none"]
    found = [f for f in adapter.lint(spec, command) if "reasoning" in f.setting]
    assert found and found[0].severity == "serious" and "--reasoning-format deepseek" in found[0].why
    assert not [f for f in adapter.lint(spec, command[:-2]) if "reasoning" in f.setting]  # auto: extracted
    env = spec.model_copy(update={"env": {"LLAMA_ARG_THINK": "none"}})
    assert [f for f in adapter.lint(env, command[:-2]) if "reasoning" in f.setting]


def read_until(proc: subprocess.Popen, needle: str, timeout_s: float) -> str:
    """stdout of `proc` up to the line that holds `needle` (or all of it when the process ends first)."""
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    os.set_blocking(proc.stdout.fileno(), False)
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line:
            seen.append(line)
            if needle in line:
                break
        elif proc.poll() is not None:
            break
        else:
            time.sleep(0.05)
    return "".join(seen)


def test_up_replay_sglang_with_a_kimi_path_and_no_parser_shows_the_serious_finding(tmp_path: Path) -> None:
    """`servelab up replay-sglang -- --model-path /shared/kimi-k2.5-int4`: the serious lint before anything is
    measured, and the server it keeps up then fails verify as the story's did."""
    proc = subprocess.Popen([sys.executable, "-m", "servelab.cli", "up", "replay-sglang", "--option", "speed=200",
                             "--log-dir", str(tmp_path), "--", "--model-path", KIMI],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "COLUMNS": "200"})
    try:
        out = read_until(proc, "press Ctrl-C", 120)
        flat = " ".join(out.split())
        assert "SERIOUS --reasoning-parser" in flat, out
        assert "Kimi" in flat and "start it with --reasoning-parser kimi_k2" in flat
        assert "NOT REPRESENTATIVE" in flat
        url = re.search(r"at (http://127\.0\.0\.1:\d+)", flat).group(1)
        chat = checks_of(url, "chat")["chat"]
        assert chat.outcome == "fail" and "SGLang: start it with --reasoning-parser kimi_k2" in chat.reason
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


# ---------------------------------------------------------------------------------------------------------------
# Reasoning and answer tokens as figures
# ---------------------------------------------------------------------------------------------------------------

def thinking_record(index: int, t0_ms: float, reasoning: int, answer: int, gap_ms: float = 10.0) -> RequestRecord:
    ms = 1_000_000
    events = [TokenEvent(t_ns=int((t0_ms + 20 + i * gap_ms) * ms), kind="reasoning" if i < reasoning else "answer",
                         tokens=1, text=" x") for i in range(reasoning + answer)]
    return RequestRecord(index=index, tag="c1", endpoint="/v1/chat/completions", t_send_ns=int(t0_ms * ms),
                         t_end_ns=events[-1].t_ns + ms, events=events, count_method="server_per_chunk", ok=True)


def test_a_level_counts_reasoning_and_answer_apart() -> None:
    records = [thinking_record(i, i * 1000.0, 16, 48) for i in range(4)]
    s = summarize(records, tag="c1", mode="concurrency", concurrency=1, window=(0, 4_000_000_000))
    f = s.figures
    assert f["reasoning_tokens"].value == 16 and f["reasoning_tokens"].dist.p50 == 16
    assert f["answer_tokens"].value == 48 and f["answer_tokens"].dist.p50 == 48
    assert f["reasoning_share"].value == pytest.approx(0.25) and f["reasoning_share"].dist.max == pytest.approx(0.25)
    assert f["answer_tok_s"].value == pytest.approx(4 * 48 / 4.0) and f["output_tok_s"].value == pytest.approx(64)
    assert f["ttfo_ms"].value == pytest.approx(20 + 16 * 10.0)
    # a level too short for a steady state withholds answer tok/s with output tok/s
    apply_steady(s, SteadyState(measured=False, reason="too short", ended_by="cap"))
    assert f["answer_tok_s"].value is None and f["output_tok_s"].value is None
    assert f["answer_tokens"].value == 48  # per-request figures stay


def test_bench_json_and_table_report_16_reasoning_and_48_answer_tokens_per_request() -> None:
    with start_calibration_server(Script(reasoning_tokens=16, output_tokens=48, ttft_ms=5, itl_ms=1,
                                         finish_reason="stop")) as cal:
        out = CliRunner().invoke(cli_app, ["bench", cal.url, "--mode", "single", "--requests", "3", "--json"])
        assert out.exit_code == 0, out.output
        level = json.loads(out.stdout)["levels"][0]["figures"]
        assert level["reasoning_tokens"]["value"] == 16 and level["reasoning_tokens"]["dist"]["p50"] == 16
        assert level["answer_tokens"]["value"] == 48 and level["answer_tokens"]["dist"]["p50"] == 48
        assert level["reasoning_share"]["value"] == pytest.approx(0.25)
        assert 0 < level["answer_tok_s"]["value"] < level["output_tok_s"]["value"]
        table = CliRunner().invoke(cli_app, ["bench", cal.url, "--mode", "single", "--requests", "3"],
                                   terminal_width=80)
    assert table.exit_code == 0, table.output
    assert "reasoning and answer tokens" in table.output
    row = next(line for line in table.output.splitlines() if "25 %" in line)
    assert "16.0" in row and "48.0" in row


def test_the_reasoning_table_stays_away_when_nothing_reasoned() -> None:
    records = [thinking_record(i, i * 1000.0, 0, 8) for i in range(3)]
    s = summarize(records, tag="c1", mode="concurrency", concurrency=1, window=(0, 3_000_000_000))
    console = Console(record=True, width=80)
    render_reasoning(console, [s])
    assert console.export_text() == ""


def thinking_run(name: str, reasoning: int, monkeypatch: pytest.MonkeyPatch, **kw):
    """A synthetic run whose requests think `reasoning` of their 32 tokens first."""
    plain = synthetic_runs.request

    def request(*args, **kwargs):
        r = plain(*args, **kwargs)
        r.events = [e._replace(kind="reasoning") if i < reasoning else e for i, e in enumerate(r.events)]
        return r

    monkeypatch.setattr(synthetic_runs, "request", request)
    summary, records = synthetic_runs.synthetic_run(name, **kw)
    monkeypatch.setattr(synthetic_runs, "request", plain)
    return from_summary(summary, records, name, name), summary, records


def test_compare_warns_when_reasoning_shares_differ_and_adds_the_answer_only_rows(monkeypatch) -> None:
    # two trials each: a better/worse verdict needs them
    parsed, _, _ = thinking_run("with-parser", 8, monkeypatch, seed=1, trials=2)
    leaked, _, _ = thinking_run("no-parser", 0, monkeypatch, seed=2, trials=2)  # its thinking counted as answer
    c = compare_runs([parsed, leaked])
    keys = [r.key for r in c.rows]
    assert {"single.ttfo_ms", "peak.answer_tok_s", "reasoning_share"} <= set(keys)
    share = next(r for r in c.rows if r.key == "reasoning_share")
    assert share.neutral and [f.value for f in share.figures] == [pytest.approx(25.0), 0.0]
    assert share.ratios[1].verdict == "no interval"  # a share is compared, never judged
    warning = next(w for w in c.warnings if "reasoning shares differ" in w)
    assert "with-parser 25 %" in warning and "no-parser 0 %" in warning
    assert "TTFO and answer tok/s" in warning and "launched without its reasoning parser" in warning
    # the answer starts after the thinking: TTFO is much later than TTFT for the run that separates it
    ttfo = next(r for r in c.rows if r.key == "single.ttfo_ms")
    assert ttfo.figures[0].value > 8 * 15 and ttfo.ratios[1].verdict == "better"
    assert not any("reasoning share" in line for line in regressions(c, 1))  # no direction, never a regression


def test_runs_that_do_not_reason_get_no_reasoning_rows_or_warning(monkeypatch) -> None:
    a, _, _ = thinking_run("a", 0, monkeypatch, seed=1)
    b, _, _ = thinking_run("b", 0, monkeypatch, seed=2)
    c = compare_runs([a, b])
    assert not {"single.ttfo_ms", "peak.answer_tok_s", "reasoning_share"} & {r.key for r in c.rows}
    assert not any("reasoning" in w for w in c.warnings)


def test_the_html_report_shows_reasoning_per_level_and_the_share_row(monkeypatch) -> None:
    parsed, _, _ = thinking_run("with-parser", 8, monkeypatch, seed=1)
    leaked, _, _ = thinking_run("no-parser", 0, monkeypatch, seed=2)
    page = render_report([parsed, leaked], compare_runs([parsed, leaked]))
    assert page.count("Reasoning and answer tokens") == 1  # only the run that reasoned
    assert "25.0 %" in page and "reasoning share of output tokens %" in page
    assert "answer tok/s at peak" in page
