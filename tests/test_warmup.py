"""Issue 21: a warm-up that warms. By default the bench sends, before its first level, as many requests at once as
the highest concurrency its plan uses (capped by the server's slots where the server says, llama.cpp's /props
`total_slots`), then one alone; `--warmup N` is still N requests one at a time. Every warm-up request is outside
every figure (bench/warmup.py; docs/metrics.md#warm-up)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from openai_fake import serving
from servelab.bench.options import BenchArgs, build_options
from servelab.bench.plans import LoadPlan
from servelab.bench.runner import BenchOptions, bench
from servelab.bench.warmup import OPEN_LOOP_STREAMS, WarmUp, plan_warmup
from servelab.bench.workload import Workload
from servelab.errors import UserError
from servelab.experiment.model import BenchSettings, Experiment, with_bench_overrides
from servelab.report.progress import LevelProgress
from servelab.store.export_vllm import level_document

SLOW_TTFT_S = 0.4  # the warm-up requests' first token: slower than the SLO below, so counting one would break it


# ---- the rule ----

def test_auto_warms_at_the_plans_highest_concurrency_capped_by_the_servers_slots() -> None:
    def auto(mode: str = "sweep", slots: int | None = None, **kw) -> WarmUp:
        plan = kw.pop("plan", LoadPlan())
        return plan_warmup(BenchOptions(mode=mode, plan=plan, **kw), slots)  # type: ignore[arg-type]

    assert auto(max_concurrency=64) == WarmUp(concurrent=64, sequential=1)
    assert auto(max_concurrency=64, slots=8) == WarmUp(concurrent=8, sequential=1)
    assert auto(sweep_levels=[1, 2, 4], slots=8) == WarmUp(concurrent=4, sequential=1)  # a later trial's levels
    assert auto(max_concurrency=32, slots=1) == WarmUp(sequential=2)  # one slot: one at a time either way
    assert auto("single") == WarmUp(sequential=2)
    assert auto("concurrency", plan=LoadPlan(concurrency=16)) == WarmUp(concurrent=16, sequential=1)
    assert auto("concurrency", plan=LoadPlan(concurrency=16, requests=5)) == WarmUp(concurrent=5, sequential=1)
    assert auto("rate", plan=LoadPlan(rates=[50.0])) == WarmUp(concurrent=OPEN_LOOP_STREAMS, sequential=1)
    assert auto("rate-sweep", plan=LoadPlan(max_concurrency=12)) == WarmUp(concurrent=12, sequential=1)
    assert auto("slo-search", plan=LoadPlan(search="concurrency", search_max=12)).concurrent == 12
    assert auto("multiturn", plan=LoadPlan(concurrency=3)) == WarmUp(concurrent=3, sequential=1)  # 3 users
    assert auto("multiturn", plan=LoadPlan(rates=[2.0])).concurrent == OPEN_LOOP_STREAMS  # open loop
    assert auto("replay").concurrent == OPEN_LOOP_STREAMS
    # An explicit number keeps its meaning: that many, one at a time, whatever the plan or the slots.
    assert auto(warmup=3, max_concurrency=64, slots=8) == WarmUp(sequential=3)
    assert auto(warmup=0).total == 0
    assert WarmUp(concurrent=8, sequential=1).describe() == "8 concurrent + 1"
    assert WarmUp(sequential=2).describe() == "2 requests, one at a time"
    assert WarmUp(sequential=1).describe() == "1 request"


def test_warmup_options_auto_a_number_or_a_usage_error() -> None:
    assert build_options(BenchArgs()).warmup is None  # not given: auto
    assert build_options(BenchArgs(warmup="auto")).warmup is None
    assert build_options(BenchArgs(warmup="3")).warmup == 3
    assert build_options(BenchArgs(warmup=0)).warmup == 0
    for bad in ("-1", "many", -2):
        with pytest.raises(UserError, match="warmup"):
            build_options(BenchArgs(warmup=bad))
    # Experiments: "auto" (the default) or a number, for every cell or per cell, and from `run --warmup`.
    assert BenchSettings().warmup == "auto"
    single, sweep = BenchSettings().options(None)
    assert single.warmup is None and sweep is not None and sweep.warmup is None
    single, sweep = BenchSettings(warmup=2).options(None)
    assert single.warmup == 2 and sweep is not None and sweep.warmup == 2
    spec = Experiment(name="x", bench=BenchSettings(warmup=5),
                      cells=[{"name": "a", "url": "http://127.0.0.1:1", "bench": {"warmup": "auto"}}])
    assert spec.bench_for(spec.cells[0]).warmup == "auto"
    given = with_bench_overrides(spec, {"warmup": 0})  # the command line wins over the file and the cell
    assert given.bench_for(given.cells[0]).warmup == 0


# ---- against a server that records what it saw ----

class Watching:
    """A streaming server that notes how many requests were in flight when each arrived. The first `hold`
    requests wait (up to 3 s) until `hold` of them are in flight, so requests sent at once are seen overlapping
    however slow the machine, and requests sent one at a time are seen alone (each waits out its 3 s); the first
    `slow` requests answer their first token after SLOW_TTFT_S."""

    def __init__(self, slots: int | None = None, hold: int = 0, slow: int = 0) -> None:
        self.slots, self.hold, self.slow = slots, hold, slow
        self.inflight, self.seen, self.arrived = 0, [], 0
        self.group = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        if self.slots is not None:
            app.router.add_get("/props", self.props)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def props(self, request: web.Request) -> web.Response:  # llama.cpp's shape: the engine is recognised
        return web.json_response({"default_generation_settings": {"n_ctx": 512}, "total_slots": self.slots})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        n = self.arrived
        self.arrived += 1
        self.inflight += 1
        self.seen.append(self.inflight)
        try:
            if n < self.hold:
                if self.inflight >= self.hold:
                    self.group.set()
                try:
                    await asyncio.wait_for(self.group.wait(), 3.0)
                except TimeoutError:
                    pass
            if n < self.slow:
                await asyncio.sleep(SLOW_TTFT_S)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(3):
                body = {"id": "x", "object": "chat.completion.chunk", "model": "fake",
                        "choices": [{"index": 0, "delta": {"content": f" t{i}"},
                                     "finish_reason": "length" if i == 2 else None}]}
                await resp.write(f"data: {json.dumps(body)}\n\n".encode())
            usage = {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            self.inflight -= 1


def run(url: str, mode: str = "concurrency", **args) -> tuple[object, list, list]:
    records, announced = [], []
    options = build_options(BenchArgs(**{"mode": mode, "tokenizer": "none", "max_tokens": 3, "min_requests": 1,
                                         **args}))
    result = bench(url, options, on_record=records.append,
                   on_level=lambda tag, *a, **kw: announced.append((tag, kw.get("warmup"))))
    return result, records, announced


def test_the_auto_warmup_sends_the_plans_concurrency_at_once_capped_by_slots_then_one_and_counts_none() -> None:
    """--concurrency 6 against a server with 3 slots: 3 warm-up requests in flight together, then 1 alone, then
    the level; the slow warm-up requests count in no figure (TTFT, the SLO's verdict, the vLLM export)."""
    server = Watching(slots=3, hold=3, slow=4)
    with serving(server.app()) as url:
        result, records, announced = run(url, concurrency=6, requests=6, slo="ttft_p99_ms=250")
    warm = [r for r in records if r.warmup]
    assert len(warm) == 4 and all(r.ok for r in warm)
    assert server.seen[:3] == [1, 2, 3]  # the three concurrent ones overlapped
    assert server.seen[3] == 1  # the single one came alone, after them
    assert ("warmup", "3 concurrent + 1") in announced
    level = result.levels[0]
    assert level.requests == 6 and level.ok == 6
    assert level.figures["ttft_ms"].value < SLOW_TTFT_S * 1000 / 2
    target = level.slo["targets"]["ttft_p99_ms"]  # a warm-up TTFT (400 ms) would break the 250 ms target
    assert target["passed"] and target["observed_ms"] < 250, level.slo
    assert len(level_document(level, records)["ttfts"]) == 6


def test_without_slots_the_warmup_is_the_plans_concurrency_and_an_explicit_number_is_one_at_a_time() -> None:
    server = Watching(hold=5)
    with serving(server.app()) as url:
        _, records, announced = run(url, concurrency=5, requests=5)
    assert sum(r.warmup for r in records) == 6 and server.seen[:5] == [1, 2, 3, 4, 5]
    assert ("warmup", "5 concurrent + 1") in announced

    server = Watching(slots=8)
    with serving(server.app()) as url:
        _, records, announced = run(url, concurrency=4, requests=4, warmup="2")
    assert sum(r.warmup for r in records) == 2
    assert server.seen[:2] == [1, 1]  # one at a time
    assert ("warmup", "2 requests, one at a time") in announced

    server = Watching(slots=8)
    with serving(server.app()) as url:
        _, records, announced = run(url, "single", requests=2, warmup="0")
    assert not any(r.warmup for r in records) and not any(w for _, w in announced)


def test_the_live_line_says_what_the_warmup_sends_and_counts_its_records() -> None:
    from servelab.records import RequestRecord, TokenEvent

    progress = LevelProgress()
    progress.begin("warmup", None, None, 9, warmup="8 concurrent + 1")
    rec = RequestRecord(index=0, tag="warmup", warmup=True, endpoint="/v1/chat/completions", t_send_ns=0, ok=True,
                        events=[TokenEvent(t_ns=1, kind="answer", tokens=5)])
    assert progress.add(rec).startswith("warming up: 8 concurrent + 1 · 0 s · 1/9 requests · 5 tokens")
    # single mode: its warm-up records carry the level's tag, and still count to the warm-up
    progress.begin("single", None, None, 2, warmup="2 requests, one at a time")
    assert progress.add(rec.model_copy(update={"tag": "single"})).startswith(
        "warming up: 2 requests, one at a time · 0 s · 1/2 requests")
    progress.begin("single", None, None, 8)
    assert progress.line().startswith("single · 0 s · 0/8 requests")
