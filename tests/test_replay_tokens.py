"""Exact input lengths and output-length control on vLLM and SGLang, through the replays that speak their HTTP
formats (engines/replay_http.py): their tokenize endpoints, their usage, and the fields each engine honours.

The replays' stand-in tokenizer counts words and its chat template adds a fixed number of them, so every count
here is known; the checks compare what the workload built with what the replay's own usage says it received.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from servelab.bench.options import BenchArgs, build_options
from servelab.bench.runner import bench
from servelab.bench.workloads.filler import OPENER
from servelab.bench.workloads.prompt_tokens import (COUNTERS, LlamaCppPromptCounter, SGLangPromptCounter,
                                                    UsagePromptCounter, VLLMPromptCounter, counter_for)
from servelab.engines import REGISTRY, get_engine
from servelab.engines.replay_http import NATURAL_ANSWER_TOKENS, ReplayHTTP, ReplayState
from openai_fake import FakeOpenAI, json_route, serving

MODEL = "org/replayed-model"
# The stand-in template around one user message: "<|im_start|> user ... <|im_end|>" and "<|im_start|> assistant".
CHAT_OVERHEAD = 5


@contextmanager
def replay(engine: str, **state: object) -> Iterator[tuple[str, ReplayState]]:
    st = ReplayState(engine=engine, version="0.33.0" if engine == "vllm" else "0.5.10.post1", model=MODEL,
                     server_args={"disable_cuda_graph": False, "enable_metrics": True}, health=200, **state)
    http = ReplayHTTP("127.0.0.1", 0, st)
    http.listen()
    try:
        yield f"http://127.0.0.1:{http.port}", st
    finally:
        http.close()


def post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def generated(st: ReplayState) -> list[dict]:
    """The run's own requests (streamed), not the counter's probes."""
    return [r["body"] for r in st.requests if r["body"].get("stream")]


# ---------------------------------------------------------------------------------------------------------------
# The replays answer the engines' tokenize formats, consistently with their usage
# ---------------------------------------------------------------------------------------------------------------

def test_vllm_replay_tokenize_has_vllms_fields_and_defaults() -> None:
    messages = [{"role": "user", "content": "one two three"}]
    with replay("vllm") as (url, _):
        status, chat = post(url + "/tokenize", {"messages": messages})
        assert status == 200 and set(chat) == {"count", "max_model_len", "tokens", "token_strs"}
        assert chat["count"] == len(chat["tokens"]) == 3 + CHAT_OVERHEAD  # no extra special tokens by default
        assert post(url + "/tokenize", {"messages": messages, "add_special_tokens": True})[1]["count"] == 9
        assert post(url + "/tokenize", {"messages": messages, "add_generation_prompt": False})[1]["count"] == 6
        assert post(url + "/tokenize", {"prompt": "one two three"})[1]["count"] == 4  # BOS by default
        assert post(url + "/tokenize", {"prompt": "one two", "add_special_tokens": False})[1]["count"] == 2
        assert post(url + "/tokenize", {"content": "a b", "with_pieces": True})[0] == 400  # llama.cpp's shape
        assert post(url + "/v1/tokenize", {"prompt": "x"})[0] == 404  # vLLM serves /tokenize only
        # usage.prompt_tokens is what /tokenize said, for the chat endpoint and for completions
        _, answer = post(url + "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1})
        assert answer["usage"]["prompt_tokens"] == chat["count"]
        _, answer = post(url + "/v1/completions", {"model": MODEL, "prompt": "one two three", "max_tokens": 1})
        assert answer["usage"]["prompt_tokens"] == 4
        assert post(url + "/v1/chat/completions", {"model": "other", "messages": messages})[0] == 404


def test_sglang_replay_tokenize_takes_messages_or_a_prompt_and_an_older_one_only_a_prompt() -> None:
    messages = [{"role": "user", "content": "one two three"}]
    with replay("sglang") as (url, _):
        for path in ("/v1/tokenize", "/tokenize"):
            status, chat = post(url + path, {"messages": messages})
            assert status == 200 and set(chat) == {"tokens", "count", "max_model_len"}
            assert chat["count"] == 3 + CHAT_OVERHEAD
        assert post(url + "/v1/tokenize", {"prompt": "one two three"})[1]["count"] == 4
        assert post(url + "/v1/tokenize", {"prompt": ["a b", "c"], "add_special_tokens": False})[1]["count"] == [2, 1]
        status, err = post(url + "/v1/tokenize", {"prompt": "a", "messages": messages})
        assert status == 400 and "Exactly one" in err["message"]
        _, answer = post(url + "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1})
        assert answer["usage"]["prompt_tokens"] == 3 + CHAT_OVERHEAD
    with replay("sglang", chat_tokenize=False) as (url, _):
        status, err = post(url + "/v1/tokenize", {"messages": messages})
        assert status == 400 and "prompt" in err["message"]
        assert post(url + "/v1/tokenize", {"prompt": "one two three"})[1]["count"] == 4


# ---------------------------------------------------------------------------------------------------------------
# Synthetic workloads get exactly the requested input length
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine,counter", [("vllm", "vLLM /tokenize"), ("sglang", "SGLang /v1/tokenize")])
def test_synthetic_input_lengths_are_exact_on_the_replay(engine: str, counter: str) -> None:
    records = []
    with replay(engine) as (url, st):
        opts = build_options(BenchArgs(mode="concurrency", concurrency=2, requests=8, max_tokens=4, warmup=0,
                                       input_tokens="uniform:30..120", seed=11))
        result = bench(url, opts, on_record=records.append)
        sent = generated(st)
    (level,) = result.levels
    assert level.ok == 8 and result.workload["engine_detected"] == engine
    assert counter in result.workload["prompts"]
    assert result.workload["template_overhead_tokens"] == CHAT_OVERHEAD + len(OPENER.split())
    lengths = [r.input_tokens for r in records]
    assert all(30 <= n <= 120 for n in lengths) and len(set(lengths)) > 4
    for r in records:
        assert r.usage.prompt_tokens == r.input_tokens, (r.index, r.input_tokens, r.usage)
    # The replay counted each prompt it received: the same lengths, request by request.
    assert sorted(len(b["messages"][0]["content"].split()) + CHAT_OVERHEAD for b in sent) == sorted(lengths)
    assert len(st.requests) == len(sent)  # counted by the tokenize endpoint alone: nothing was prefilled
    assert not any("prompt the workload built" in w for w in level.warnings)


def test_synthetic_completions_lengths_are_exact_on_the_vllm_replay() -> None:
    records = []
    with replay("vllm") as (url, _):
        opts = build_options(BenchArgs(mode="single", requests=4, max_tokens=2, warmup=0, endpoint="completions",
                                       input_tokens="uniform:20..50", seed=2))
        bench(url, opts, on_record=records.append)
    assert len(records) == 4
    assert all(r.usage.prompt_tokens == r.input_tokens for r in records), [(r.input_tokens, r.usage) for r in records]


def test_an_sglang_without_chat_tokenize_is_counted_by_usage_and_still_exact() -> None:
    records = []
    with replay("sglang", chat_tokenize=False) as (url, st):
        opts = build_options(BenchArgs(mode="single", requests=4, max_tokens=2, warmup=0,
                                       input_tokens="uniform:30..60", seed=4))
        result = bench(url, opts, on_record=records.append)
        probes = [r["body"] for r in st.requests if not r["body"].get("stream")]
    assert [r.usage.prompt_tokens for r in records] == [r.input_tokens for r in records]
    assert "usage.prompt_tokens" in result.workload["prompts"]
    # The fallback asked for one token, unstreamed, with the served model: the opener and the sample prompts.
    assert probes and all(p["max_tokens"] == 1 and p["model"] == MODEL and "messages" in p for p in probes)


# ---------------------------------------------------------------------------------------------------------------
# min_tokens: sent where honoured, and only there
# ---------------------------------------------------------------------------------------------------------------

def test_min_tokens_is_sent_to_vllm_and_honoured() -> None:
    records = []
    with replay("vllm") as (url, st):
        opts = build_options(BenchArgs(mode="single", requests=3, max_tokens=32, warmup=0, ignore_eos=False,
                                       min_tokens=20, input_tokens="40"))
        result = bench(url, opts, on_record=records.append)
        sent = generated(st)
    assert [b["min_tokens"] for b in sent] == [20, 20, 20] and not any("ignore_eos" in b for b in sent)
    assert result.workload["min_tokens"] == 20 and "min_tokens_not_sent" not in result.workload
    assert all(r.sampling.get("min_tokens") == 20 for r in records)
    # The replay would have stopped after NATURAL_ANSWER_TOKENS; min_tokens kept it going.
    assert NATURAL_ANSWER_TOKENS < 20
    assert [r.usage.completion_tokens for r in records] == [20, 20, 20]


def test_min_tokens_is_not_sent_to_llamacpp(tmp_path: Path) -> None:
    """llama.cpp's server reads no minimum length and ignores unknown fields: sending one would look honoured."""
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "Tell me about the sea."}\n{"prompt": "And the harbour."}\n')
    fake = FakeOpenAI(props=json_route({"default_generation_settings": {"n_ctx": 512}, "total_slots": 4}))

    async def apply_template(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": " ".join(m["content"] for m in body["messages"])})

    app = fake.app()
    app.router.add_post("/apply-template", apply_template)
    records = []
    with serving(app) as url:
        opts = build_options(BenchArgs(mode="single", requests=2, max_tokens=8, warmup=0, min_tokens=6,
                                       dataset=data))
        result = bench(url, opts, on_record=records.append)
    bodies = [r["body"] for r in fake.requests]
    assert result.workload["engine_detected"] == "llamacpp" and len(bodies) == 2
    assert not any("min_tokens" in b for b in bodies) and all(b.get("ignore_eos") is True for b in bodies)
    assert result.workload["min_tokens"] is None and "min_tokens_not_sent" in result.workload
    assert all("min_tokens" not in r.sampling or r.sampling["min_tokens"] is None for r in records)


def test_each_engine_says_whether_it_honours_min_tokens_and_ignore_eos() -> None:
    expected = {  # (min_tokens, ignore_eos), from each engine's request models (see the adapters' comments)
        "vllm": (True, True), "sglang": (True, True), "replay-vllm": (True, True), "replay-sglang": (True, True),
        "llamacpp": (False, True), "llama-server": (False, True), "llama-cpp-python": (True, False),
        "tgi": (False, False), "transformers-serve": (False, False), "command": (False, False),
    }
    assert set(expected) == set(REGISTRY)
    for name, (min_tokens, ignore_eos) in expected.items():
        adapter = get_engine(name)
        assert (adapter.accepts_min_tokens, adapter.accepts_ignore_eos) == (min_tokens, ignore_eos), name


def test_every_counter_is_registered_under_an_engine_name() -> None:
    assert set(COUNTERS) <= set(REGISTRY)
    assert COUNTERS["vllm"] is VLLMPromptCounter and COUNTERS["sglang"] is SGLangPromptCounter
    assert COUNTERS["llamacpp"] is LlamaCppPromptCounter and COUNTERS["tgi"] is UsagePromptCounter

    async def made() -> tuple:
        async with aiohttp.ClientSession() as session:
            return counter_for("command", session, "http://x"), counter_for(None, session, "http://x"), \
                counter_for("vllm", session, "http://x/", model="m")

    none, unknown, vllm = asyncio.run(made())
    assert none is None and unknown is None and vllm.model == "m" and vllm.base_url == "http://x"


# ---------------------------------------------------------------------------------------------------------------
# The usage fallback on a real engine: the same counts as llama.cpp's own tokenizer endpoints
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.engine
def test_the_usage_fallback_counts_what_llamacpps_tokenizer_counts(embedded_server) -> None:
    chat = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Continue this list of words: river stone cloud"}]
    prompt = "Once upon a time, in a harbour town,"
    answer = "The robot painted the sea at dawn."

    async def counts() -> tuple[list[int], list[int]]:
        async with aiohttp.ClientSession() as session:
            exact = LlamaCppPromptCounter(session, embedded_server["url"])
            usage = UsagePromptCounter(session, embedded_server["url"])  # model from /v1/models
            a = [await exact.count_prompt_tokens(chat), await exact.count_prompt_tokens(prompt),
                 await exact.count_text_tokens(answer)]
            b = [await usage.count_prompt_tokens(chat), await usage.count_prompt_tokens(prompt),
                 await usage.count_text_tokens(answer)]
            assert usage.model == embedded_server["model"]
            return a, b

    exact, usage = asyncio.run(counts())
    assert usage == exact and exact[0] > 15
