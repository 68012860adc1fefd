"""Prefix-cache figures (issue 16): the pure function over per-request rows, the chunk parser reading each engine's
cached-token field, and a whole multi-turn bench against a fake engine whose cache is a real longest-prefix match
over the prompts it has seen, reporting its counts the way llama.cpp (timings.cache_n only) or vLLM
(usage.prompt_tokens_details.cached_tokens) does. The figures must equal what the fake reported."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from aiohttp import web

from servelab.bench.cache_figures import CacheRow, cache_figures
from servelab.protocol.chunks import read_chunk
from servelab.bench.options import BenchArgs, build_options
from servelab.bench.runner import bench
from tests.openai_fake import serving


def test_figures_from_rows() -> None:
    rows = [CacheRow(0, 100, 1, 50.0), CacheRow(90, 120, 2, 10.0), CacheRow(140, 150, 3, 12.0),
            CacheRow(None, 80, 1, 40.0)]
    figures, turns = cache_figures(rows)
    assert figures["cache_hit_ratio"].value == pytest.approx(230 / 370)
    assert figures["cache_hit_ratio"].note == "3 of 4 requests reported cached prompt tokens"
    assert figures["cached_tokens"].value == pytest.approx(230 / 3)
    assert figures["ttft_cached_ms"].value == 11.0 and figures["ttft_uncached_ms"].value == 50.0
    assert [(t.turn, t.requests) for t in turns] == [(1, 2), (2, 1), (3, 1)]
    assert turns[0].cached_share == 0.0 and turns[0].prompt_tokens_mean == 90.0 and turns[0].ttft_ms.p50 == 45.0
    assert turns[2].cached_share == pytest.approx(140 / 150)


def test_no_reported_counts_no_figures_and_single_turn_no_turns() -> None:
    assert cache_figures([CacheRow(None, 10, None, 1.0)]) == ({}, [])
    figures, turns = cache_figures([CacheRow(5, 10, None, 1.0)])
    assert set(figures) == {"cache_hit_ratio", "cached_tokens", "ttft_cached_ms", "ttft_uncached_ms"}
    assert turns == []


def test_each_engines_cached_field_is_read() -> None:
    llama = read_chunk({"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 2},
                        "timings": {"cache_n": 31, "prompt_n": 19, "predicted_n": 2}})
    assert llama.cache_n == 31 and llama.usage.cached_tokens is None
    vllm = read_chunk({"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 2,
                                                "prompt_tokens_details": {"cached_tokens": 32}}})
    assert vllm.usage.cached_tokens == 32 and vllm.cache_n is None
    assert read_chunk({"choices": [], "timings": {"cache_n": True}}).cache_n is None  # a bool is not a count


class PrefixCacheFake:
    """An OpenAI chat server whose tokens are words and whose cache is the longest prefix it shares with any prompt
    seen before (at least one token is always computed, as engines do). It answers each turn with a few fixed
    words and remembers what it reported, per request."""

    def __init__(self, style: str, cache: bool = True, ms_per_uncached_token: float = 0.0):
        self.style, self.cache, self.ms_per_uncached_token = style, cache, ms_per_uncached_token
        self.seen: list[list[str]] = []
        self.reported: list[tuple[int, int]] = []  # (cached, prompt) per request, in arrival order

    def tokens(self, messages) -> list[str]:
        return [w for m in messages for w in f"<{m['role']}> {m['content']}".split()]

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = self.tokens(body["messages"])
        cached = max((n for n in (self._common(prompt, p) for p in self.seen)), default=0)
        cached = min(cached, len(prompt) - 1) if self.cache else 0
        self.seen.append(prompt)
        self.reported.append((cached, len(prompt)))
        answer = ["sure", "thing", "here"][: body.get("max_tokens", 3)]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep((len(prompt) - cached) * self.ms_per_uncached_token / 1000)  # "prefill"
        for w in answer:
            await resp.write(f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': w + ' '}}]})}\n\n"
                             .encode())
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(answer),
                 "total_tokens": len(prompt) + len(answer)}
        final = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        if self.style == "vllm":
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
            tail = {"choices": [], "usage": usage}
        else:  # an older llama.cpp: usage without details, the reuse in timings.cache_n
            tail = {"choices": [], "usage": usage, "timings": {"cache_n": cached, "prompt_n": len(prompt) - cached}}
        for event in (final, tail):
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    @staticmethod
    def _common(a: list[str], b: list[str]) -> int:
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n

    async def models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"data": [{"id": "fake"}]})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app


@pytest.mark.parametrize("style", ["llamacpp", "vllm"])
def test_multiturn_cache_figures_equal_what_the_engine_reported(tmp_path, style) -> None:
    lines = [{"messages": [{"role": "system", "content": "You answer questions about rivers " * 5},
                           *[m for k in range(5) for m in ({"role": "user", "content": f"question {c} {k} " * 4},
                                                           {"role": "assistant", "content": "recorded"})]]}
             for c in range(4)]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    fake = PrefixCacheFake(style)
    records = []
    with serving(fake.app()) as url:
        opts = build_options(BenchArgs(mode="multiturn", users=2, conversations=4, dataset=path, max_tokens=3,
                                       warmup=0, tokenizer="none", min_requests=1))
        result = bench(url, opts, on_record=records.append)
    (level,) = result.levels
    assert level.tag == "u2" and level.ok == 20 and result.mode == "multiturn"
    assert sorted((r.conversation, r.turn) for r in records) == [(c, k) for c in range(4) for k in range(1, 6)]
    # Every turn's history holds the answers the server gave, not the recorded ones.
    assert any("sure thing here" in " ".join(p) for p in fake.seen) and not any("recorded" in p for p in fake.seen)
    # per request (two users: the order requests finish in need not be the order they arrived in)
    assert sorted((r.usage.cached_tokens, r.usage.prompt_tokens) for r in records) == sorted(fake.reported)
    cached, prompt = sum(c for c, _ in fake.reported), sum(p for _, p in fake.reported)
    assert level.figures["cache_hit_ratio"].value == pytest.approx(cached / prompt)
    assert [t.turn for t in level.turns] == [1, 2, 3, 4, 5]
    shares = [t.cached_share for t in level.turns]
    assert all(later > earlier for earlier, later in zip(shares, shares[1:])), shares
    for t in level.turns:
        mine = [(r.usage.cached_tokens, r.usage.prompt_tokens) for r in records if r.turn == t.turn]
        assert t.requests == 4 and t.cached_share == pytest.approx(sum(c for c, _ in mine) / sum(p for _, p in mine))


def test_compare_and_report_show_late_turn_ttft_and_the_cache_behind_it(tmp_path) -> None:
    """bench --out against a fake that prefills 1 ms per uncached token, with its cache and without, then compare
    and report: late-turn TTFT is better with the cache, the hit ratio row says why, the report charts TTFT by
    turn."""
    lines = [{"messages": [m for k in range(6) for m in ({"role": "user", "content": f"question {c} {k} " * 20},
                                                         {"role": "assistant", "content": "recorded"})]}
             for c in range(4)]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cli = [sys.executable, "-m", "servelab.cli"]
    dirs = []
    for cache in (False, True):
        with serving(PrefixCacheFake("llamacpp", cache=cache, ms_per_uncached_token=1.0).app()) as url:
            done = subprocess.run([*cli, "bench", url, "--mode", "multiturn", "--users", "2", "--conversations", "4",
                                   "--dataset", str(path), "--max-tokens", "3", "--warmup", "0", "--tokenizer", "none",
                                   "--out", str(tmp_path / "runs"), "--json"], capture_output=True, text=True,
                                  timeout=60)
        assert done.returncode == 0, done.stderr
        dirs.append(sorted((tmp_path / "runs").glob("*-bench-multiturn*"))[-1])
        assert "by turn" not in done.stdout  # --json: the document only
    shown = subprocess.run([*cli, "bench", "--help"], capture_output=True, text=True)
    assert "--users" in shown.stdout
    done = subprocess.run([*cli, "compare", str(dirs[0]), str(dirs[1]), "--json", "--out", str(tmp_path / "runs"),
                           "-o", str(tmp_path / "r.html")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = {r["key"]: r for r in json.loads(done.stdout)["rows"]}
    late = rows["multiturn.late_ttft_ms"]
    ratio = late["ratios"][1]
    # One bench run a side: the interval says it (well below 1), but a direction needs two clean trials a side
    # ("contended" when other work kept this machine busy during a level)
    assert ratio["verdict"] in ("too few trials", "contended") and ratio["ratio"] < 0.5 and ratio["ci"][1] < 1, ratio
    assert ratio["verdict"] == "contended" or ratio["reason"].startswith("no verdict: 1 clean trial"), ratio
    hits = rows["multiturn.cache_hit_ratio"]
    assert hits["neutral"] and hits["figures"][0]["value"] == 0 and hits["figures"][1]["value"] > 50, hits
    html = (tmp_path / "r.html").read_text()
    assert "ttft-by-turn" in html and "TTFT p50 by turn" in html


def test_open_loop_conversations_start_on_schedule_and_go_on_turn_by_turn(tmp_path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{c} {k}"} for k in range(3)]})
                            + "\n" for c in range(5)))
    fake = PrefixCacheFake("vllm")
    records = []
    with serving(fake.app()) as url:
        opts = build_options(BenchArgs(mode="multiturn", rate="20", arrival="constant", conversations=5,
                                       think_time="0.01", dataset=path, max_tokens=2, warmup=0, tokenizer="none"))
        result = bench(url, opts, on_record=records.append)
    (level,) = result.levels
    assert (level.tag, level.mode, level.ok) == ("r20", "rate", 15)
    firsts = sorted((r for r in records if r.turn == 1), key=lambda r: r.scheduled_ns)
    assert len(firsts) == 5 and all(r.t_send_ns >= r.scheduled_ns for r in firsts)
    gaps = [b.scheduled_ns - a.scheduled_ns for a, b in zip(firsts, firsts[1:])]
    assert all(abs(g - 50_000_000) < 1_000 for g in gaps), gaps  # constant arrivals at 20/s
    assert all(r.scheduled_ns is None for r in records if r.turn != 1)
    assert level.figures["client_lag_ms"].dist.n == 5
    # Turns of one conversation go in order, each after the answer to the one before (and a think time).
    for c in {r.conversation for r in records}:
        turns = sorted((r for r in records if r.conversation == c), key=lambda r: r.turn)
        assert all(b.t_send_ns >= a.t_end_ns + 10_000_000 for a, b in zip(turns, turns[1:]))
