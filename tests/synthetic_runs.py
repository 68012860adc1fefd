"""Runs made by hand, with known timings, for compare/report/store tests (no server involved).

A run has a single-stream level (requests one after another) and a concurrency sweep where `slots` requests are
decoded at once: with more streams than slots, each stream slows down in proportion, so throughput stops growing
at `slots`, as a slot-limited server's does. Timings jitter by ±10 % from a seeded RNG.
"""

from __future__ import annotations

import random

from servelab.bench.metrics import summarize
from servelab.bench.runner import headline
from servelab.records import (BenchResult, CheckResult, LaunchResult, LintFinding, Phase, Provenance,
                              RequestRecord, RunSummary, TokenEvent, Verdict, VerifyResult)

NS = 1_000_000  # ns per ms
WORKLOAD = {"endpoint": "/v1/chat/completions", "max_tokens": 32, "temperature": 0.0, "ignore_eos": True,
            "prompts": "synthetic", "engine_detected": "llamacpp", "tokenizer": None}


def request(index: int, tag: str, t0: int, ttft_ms: float, itl_ms: float, tokens: int, rng: random.Random,
            text: str = "word ") -> RequestRecord:
    t = t0 + int(ttft_ms * rng.uniform(0.9, 1.1) * NS)
    events = []
    for _ in range(tokens):
        events.append(TokenEvent(t_ns=t, kind="answer", tokens=1, text=text))
        t += int(itl_ms * rng.uniform(0.9, 1.1) * NS)
    return RequestRecord(index=index, tag=tag, endpoint="/v1/chat/completions", t_send_ns=t0,
                         t_end_ns=events[-1].t_ns + NS, events=events, count_method="server_per_chunk", ok=True,
                         max_tokens=tokens, sampling={"temperature": 0.0, "ignore_eos": True}, saw_done=True)


def synthetic_run(run_id: str, *, trials: int = 1, seed: int = 0, **kw) -> tuple[RunSummary, list[RequestRecord]]:
    """A run of `trials` trials of the same server (each its own jitter, seeded from `seed`): a better/worse
    verdict needs two clean trials on each side (docs/metrics.md#verdicts)."""
    summary, records = _one_trial(run_id, seed=seed, **kw)
    for i in range(1, trials):
        more, recs = _one_trial(run_id, seed=seed + 7919 * i, **kw)
        trial = more.trials[0].model_copy(update={"index": i})
        for level in trial.levels:
            level.trial = i
        for r in recs:
            r.trial = i
        summary.trials.append(trial)
        records += recs
    return summary, records


def _one_trial(run_id: str, *, itl_ms: float = 20.0, ttft_ms: float = 50.0, slots: int = 8, seed: int = 0,
               single_requests: int = 12, tokens: int = 32, max_concurrency: int = 4, level_s: float = 4.0,
               text: str = "word ", serious: bool = False) -> tuple[RunSummary, list[RequestRecord]]:
    rng = random.Random(seed)
    records: list[RequestRecord] = []
    t = 1_000 * NS * 1000
    single = []
    for _ in range(single_requests):
        r = request(len(records), "single", t, ttft_ms, itl_ms, tokens, rng, text)
        records.append(r)
        single.append(r)
        t = r.t_end_ns + NS
    single_result = BenchResult(url="http://127.0.0.1:1", model="m", mode="single", workload=dict(WORKLOAD),
                                levels=[summarize(single, tag="single", mode="single", concurrency=1,
                                                  window=(single[0].t_send_ns, single[-1].t_end_ns))])
    single_result.headline = headline(single_result)
    levels = []
    c = 1
    while c <= max_concurrency:
        start = t
        stop = start + int(level_s * 1000 * NS)
        slow = max(1.0, c / slots)  # more streams than slots: each waits its turn
        level = []
        for _ in range(c):
            w = start
            while w < stop:
                r = request(len(records), f"c{c}", w, ttft_ms * slow, itl_ms * slow, tokens, rng, text)
                records.append(r)
                level.append(r)
                w = r.t_end_ns + NS
        levels.append(summarize(level, tag=f"c{c}", mode="concurrency", concurrency=c, window=(start, stop)))
        t = max(r.t_end_ns for r in level) + NS
        c *= 2
    sweep = BenchResult(url="http://127.0.0.1:1", model="m", mode="sweep", workload=dict(WORKLOAD), levels=levels,
                        stop_reason="reached the maximum concurrency")
    sweep.headline = headline(sweep)
    lint = [LintFinding(setting="parallel=1", severity="serious", why="one slot: requests queue")] if serious else []
    launch = LaunchResult(engine="llamacpp", url="http://127.0.0.1:1", ready_s=1.2, lint=lint,
                          phases=[Phase(name="starting", start_s=0.0, end_s=0.2),
                                  Phase(name="loading model", start_s=0.2, end_s=1.0),
                                  Phase(name="ready", start_s=1.2, end_s=None)],
                          verdict=Verdict(state="ready", reason="/health answered 200"))
    verify = VerifyResult(url="http://127.0.0.1:1", model="m", checks=[
        CheckResult(id="chat", title="chat", outcome="pass", reason="answered", response_excerpt=text)])
    summary = RunSummary(run_id=run_id, status="complete",
                         provenance=Provenance(started_at="2026-01-01T00:00:00Z", servelab_version="test",
                                               engine="llamacpp", model="smollm2", command=["llama", "--x"]),
                         launch=launch, verify=verify, single=single_result, sweep=sweep)
    summary.headline = {**single_result.headline,
                        **{k: v for k, v in sweep.headline.items() if k.startswith("peak.")}}
    return summary, records
