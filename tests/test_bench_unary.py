"""Bench of non-streamed endpoints: embeddings and rerank (bench/unary_client.py, bench/workloads/unary.py).

Against the real engine: llama.cpp (xllamacpp) with SmolLM2 started with `--embeddings --pooling mean` (the
session's `pooled_engine`, shared with the verify checks), which serves embeddings of dimension 576 and no rerank.
Rerank's shapes and the wrong answers are served by the fake server (openai_fake.py, endpoints_fake.py), in the
formats llama.cpp, SGLang and vLLM send, with one thing broken at a time.
"""

from __future__ import annotations

import io
import json

import pytest
from aiohttp import web
from endpoints_fake import embeddings_body, rerank_body
from openai_fake import FakeOpenAI, serving
from rich.console import Console

from servelab.bench.args import BenchArgs
from servelab.bench.metrics import NS_PER_MS, NS_PER_S, percentile
from servelab.bench.options import build_options
from servelab.bench.runner import BenchOptions, bench
from servelab.bench.steady import SteadyRule
from servelab.bench.tally import LevelTally
from servelab.bench.trials import pool_level
from servelab.bench.workloads.lengths import parse_length
from servelab.bench.workloads.unary import EmbeddingsWorkload, RerankWorkload
from servelab.errors import UserError
from servelab.records import RequestRecord
from servelab.report.terminal import render_levels

STREAMED_ONLY = {"output_tok_s", "ttft_ms", "ttfo_ms", "itl_ms", "itl_chunk_ms", "tpot_ms", "decode_tok_s",
                 "output_tokens", "answer_tok_s", "reasoning_share"}


def run(url: str, workload, records: list, **options) -> object:
    opts = BenchOptions(mode=options.pop("mode", "single"), workload=workload, gpu=False, **options)
    return bench(url, opts, on_record=records.append)


def table(result) -> str:
    out = io.StringIO()
    render_levels(Console(file=out, width=200, color_system=None), result, gpu=False)
    return out.getvalue()


def check_level_against_records(level, measured: list[RequestRecord]) -> None:
    """items/s, requests/s and input tok/s are the records' counts over the window; the latency quantiles are the
    records' own; no streamed figure is there."""
    ok = [r for r in measured if r.ok]
    f = level.figures
    counted = f["items_s"].value * level.window_s
    if level.mode == "single":  # the window spans every request: each counts
        assert counted == pytest.approx(sum(r.items for r in ok), rel=1e-9)
        assert f["request_s"].value * level.window_s == pytest.approx(len(ok), rel=1e-9)
    else:  # the window ends once the level stops sending: what ended by the last send is inside, later ones may not be
        last_send = max(r.t_send_ns for r in measured)
        inside = sum(r.items for r in ok if r.t_end_ns <= last_send)
        assert inside - 1e-6 <= counted <= sum(r.items for r in ok) + 1e-6
    # every request carries the same number of items: items/s is that many times requests/s
    (items,) = {r.items for r in measured}
    assert f["items_s"].value == pytest.approx(items * f["request_s"].value, rel=1e-12)
    latencies = sorted((r.t_end_ns - r.t_send_ns) / NS_PER_MS for r in ok)
    dist = f["e2e_ms"].dist
    assert dist.n == len(ok)
    for q, got in ((50, dist.p50), (90, dist.p90), (99, dist.p99)):
        assert got == pytest.approx(percentile(latencies, q), rel=1e-12)
    assert not STREAMED_ONLY & set(f), set(f)


# ---- the real engine -------------------------------------------------------------------------------------------


@pytest.mark.engine
def test_embeddings_on_the_real_engine_count_items_tokens_and_latency_from_the_records(pooled_engine):
    records: list[RequestRecord] = []
    workload = EmbeddingsWorkload(batch=2, input_tokens=parse_length(12))
    result = run(pooled_engine["url"], workload, records, single_requests=3, warmup=0)
    (level,) = result.levels
    measured = [r for r in records if not r.warmup]
    assert len(measured) == 3 and level.ok == 3 and level.failed == 0
    for r in measured:
        assert r.ok and not r.stream and r.endpoint == "/v1/embeddings" and r.events == []
        assert r.items == 2
        # exact lengths: two inputs of 12 tokens each, as the server counted them
        assert r.input_tokens == 24 == r.usage.prompt_tokens
    assert result.workload["dimension"] == 576  # SmolLM2-135M's hidden size
    assert result.workload["stream"] is False and result.workload["batch_size"] == 2
    check_level_against_records(level, measured)
    f = level.figures
    # single stream: the window spans every request, so every one counts
    assert f["items_s"].value == pytest.approx(6 / level.window_s)
    assert f["input_tok_s"].value * level.window_s == pytest.approx(3 * 24, rel=1e-9)
    assert not any("prompt" in w and "usage" in w for w in level.warnings), level.warnings
    assert result.headline["single.items_s"] is f["items_s"] or result.headline["single.items_s"] == f["items_s"]
    assert "single.ttft_ms" not in result.headline and "single.decode_tok_s" not in result.headline
    shown = table(result)
    assert "items/s" in shown and "latency" in shown and "TTFT" not in shown and "ITL" not in shown
    assert "tokens counted by" not in shown


@pytest.mark.engine
def test_rerank_against_llama_cpp_without_a_reranker_is_refused_in_one_line(pooled_engine):
    with pytest.raises(UserError) as caught:
        run(pooled_engine["url"], RerankWorkload(documents=2), [], single_requests=1, warmup=0)
    said = str(caught.value)
    assert said.startswith("the server serves no rerank endpoint: /v1/rerank HTTP 501 (This server does not "
                           "support reranking. Start it with `--reranking`"), said
    assert "/v1/score HTTP 404; /score HTTP 404" in said and "\n" not in said


@pytest.fixture(scope="module")
def rerank_engine(tmp_path_factory):
    """llama.cpp with SmolLM2 and rank pooling (llama-server's --reranking): it serves /v1/rerank. SmolLM2 is no
    reranker (llama.cpp scores with its output layer), so the scores mean nothing; the interface is llama.cpp's own."""
    from conftest import embedded_argv, running_engine

    from servelab.models import resolve_model

    log = tmp_path_factory.mktemp("rerank") / "engine.log"
    with running_engine(embedded_argv("--reranking", "--ctx-size", "2048", parallel=2,
                                      launcher="llamacpp_pooled_server.py"), log) as url:
        yield {"url": url, "model": resolve_model("smollm2").served_name}


@pytest.mark.engine
def test_rerank_on_the_real_engine_scores_every_document_and_counts_them(rerank_engine):
    records: list[RequestRecord] = []
    # few and short: rank pooling through SmolLM2's output layer costs ~0.05 s a token on two busy cores
    result = run(rerank_engine["url"], RerankWorkload(documents=2, input_tokens=parse_length(8)), records,
                 single_requests=2, warmup=0)
    assert result.workload["endpoint"] == "/v1/rerank" and result.workload["request_shape"] == "rerank"
    assert result.workload["endpoints_tried_before"] == []  # llama.cpp serves the first path tried
    (level,) = result.levels
    measured = [r for r in records if not r.warmup]
    assert len(measured) == 2 and all(r.ok and r.items == 2 and not r.stream for r in measured), \
        [r.error_detail for r in measured]
    check_level_against_records(level, measured)
    # llama.cpp counts the prompt tokens of every (query, document) pair it scored
    prompt = sum(r.usage.prompt_tokens for r in measured)
    assert prompt > 2 * 2 * 8
    assert level.figures["input_tok_s"].value * level.window_s == pytest.approx(prompt, rel=1e-9)
    assert level.figures["items_s"].value == pytest.approx(4 / level.window_s)


# ---- rerank in each engine's shape, and wrong answers (the fake server) ---------------------------------------


def rerank_app(path: str, shape: str) -> web.Application:
    """A server that serves rerank only at `path`, answering in `shape`: llama.cpp's `results`, SGLang's bare list,
    or vLLM's score `data`."""
    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        query, documents = (body["text_1"], body["text_2"]) if shape == "score" else (body["query"],
                                                                                     body["documents"])
        answer = rerank_body(query, documents)
        if shape == "sglang":  # with each pair's tokens in meta_info (serving_rerank.py), no top-level usage
            pair = answer["usage"]["prompt_tokens"] // len(documents)
            return web.json_response([{"index": r["index"], "score": r["relevance_score"], "document": "",
                                       "meta_info": {"id": f"rerank-{r['index']}", "prompt_tokens": pair}}
                                      for r in answer["results"]])
        if shape == "score":
            return web.json_response({"data": [{"index": r["index"], "score": r["relevance_score"]}
                                               for r in sorted(answer["results"], key=lambda r: r["index"])],
                                      "usage": answer["usage"]})
        return web.json_response(answer)

    async def not_found(request: web.Request) -> web.StreamResponse:
        return web.json_response({"detail": "Not Found"}, status=404)

    app = FakeOpenAI(rerank=handler if path == "/v1/rerank" else not_found).app()
    if path != "/v1/rerank":
        app.router.add_post(path, handler)
    return app


@pytest.mark.parametrize("path,shape", [("/v1/rerank", "results"), ("/v1/rerank", "sglang"), ("/score", "score")])
def test_rerank_finds_the_engine_s_path_and_checks_one_score_per_document(path, shape):
    records: list[RequestRecord] = []
    with serving(rerank_app(path, shape)) as url:
        result = run(url, RerankWorkload(documents=5), records, mode="concurrency",
                     plan=_plan(concurrency=2, requests=12), warmup=0, steady=SteadyRule(min_completed=4))
    measured = [r for r in records if not r.warmup]
    assert result.workload["endpoint"] == path
    assert all(r.ok and r.items == 5 and r.endpoint == path for r in measured), [r.error_detail for r in measured]
    (level,) = result.levels
    check_level_against_records(level, measured)
    # SGLang's count too (its results' meta_info summed): every request the same tokens, so input tok/s is that
    # many times requests/s
    (tokens,) = {r.usage.prompt_tokens if r.usage else None for r in measured}
    assert tokens and level.figures["input_tok_s"].value == pytest.approx(tokens * level.figures["request_s"].value)


def _plan(**fields):
    from servelab.bench.plans import LoadPlan

    return LoadPlan(**fields)


def broken_embeddings() -> tuple[web.Application, dict]:
    """Embeddings of dimension 16, but every third request's last vector is of dimension 8 and every fourth
    answer is not JSON."""
    seen = {"n": 0}

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen["n"] += 1
        answer = embeddings_body(body["input"])
        if seen["n"] > 1 and seen["n"] % 4 == 0:
            return web.Response(text='{"data": [', content_type="application/json")
        if seen["n"] > 1 and seen["n"] % 3 == 0:
            answer["data"][-1]["embedding"] = answer["data"][-1]["embedding"][:8]
        return web.Response(text=json.dumps(answer), content_type="application/json")

    return FakeOpenAI(embeddings=handler).app(), seen


def test_a_wrong_dimension_or_bad_json_fails_that_request_with_the_detail_and_the_rest_count():
    app, _ = broken_embeddings()
    records: list[RequestRecord] = []
    with serving(app) as url:
        result = run(url, EmbeddingsWorkload(batch=2), records, single_requests=11, warmup=0)
    measured = [r for r in records if not r.warmup]
    # the first answer (the probe, untimed) fixed the run's dimension at 16: requests 2..12 on the server's count
    failed = {r.index: r for r in measured if not r.ok}
    by_server = {i: i + 2 for i in range(11)}  # request i is the server's (i + 2)th answer
    assert {i for i, n in by_server.items() if n % 4 == 0 or n % 3 == 0} == set(failed)
    for i, r in failed.items():
        assert r.error_kind == "parse"
        if by_server[i] % 4 == 0:
            assert r.error_detail.startswith("the answer is not JSON: "), r.error_detail
        else:
            assert r.error_detail == "embedding 1 has dimension 8, not the run's 16"
    (level,) = result.levels
    assert level.failed == len(failed) and level.ok == 11 - len(failed)
    assert level.errors == {"parse": len(failed)}
    check_level_against_records(level, measured)
    assert level.figures["items_s"].value * level.window_s == pytest.approx(2 * level.ok)


@pytest.mark.parametrize("vectors, said", [
    ([[0.5, 0.5], [0.0, 0.0]], "embedding 1 is all zeros: no vector describes its input"),
    ([[0.5, 0.25], [0.1, 0.2], [0.5, 0.25]], "embeddings 0 and 2 are identical for different inputs"),
    ([[0.5, "0.25"]], "embedding 0 holds '0.25', not a finite number"),
    ([[0.5, None]], "embedding 0 holds None, not a finite number"),
    ([[float("nan"), 1.0]], "embedding 0 holds nan, not a finite number"),
])
def test_zero_identical_or_non_numeric_vectors_are_wrong_answers_that_say_which(vectors, said):
    from servelab.bench.unary_client import WrongAnswer, check_embeddings

    answer = {"data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)]}
    with pytest.raises(WrongAnswer) as caught:
        check_embeddings(answer, len(vectors), 2)
    assert caught.value.detail == said
    # the same values in vectors that differ pass: near neighbours are not identical
    assert check_embeddings({"data": [{"index": 0, "embedding": [0.5, 0.25]},
                                      {"index": 1, "embedding": [0.5, 0.2500001]}]}, 2, 2) == 2


def test_an_answer_without_usage_leaves_input_tokens_per_second_not_measured():
    async def handler(request: web.Request) -> web.StreamResponse:
        answer = embeddings_body((await request.json())["input"])
        del answer["usage"]
        return web.json_response(answer)

    with serving(FakeOpenAI(embeddings=handler).app()) as url:
        result = run(url, EmbeddingsWorkload(batch=1), [], single_requests=2, warmup=0)
    fig = result.levels[0].figures["input_tok_s"]
    assert fig.value is None and fig.note == "not measured: 2 of 2 requests in the window gave no usage.prompt_tokens"
    console = Console(file=io.StringIO(), width=200, color_system=None)
    render_levels(console, result, gpu=False)
    assert "  single input tok/s: not measured: 2 of 2 requests in the window gave no usage.prompt_tokens" in \
        console.file.getvalue().splitlines()  # the reason reaches the terminal, not only the "–"


def test_a_server_without_embeddings_is_refused_before_anything_is_timed():
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"code": 501, "message": "This server does not support embeddings. "
                                            "Start it with `--embeddings`", "type": "not_supported_error"}},
                                 status=501)

    with serving(FakeOpenAI(embeddings=handler).app()) as url, pytest.raises(UserError) as caught:
        run(url, EmbeddingsWorkload(), [], single_requests=1, warmup=0)
    assert str(caught.value).startswith("the server does not serve embeddings at /v1/embeddings: HTTP 501: This "
                                        "server does not support embeddings")


# ---- pooling over trials, and the options ---------------------------------------------------------------------


def unary_records(trial: int, n: int, items: int) -> list[RequestRecord]:
    t0 = 10 * NS_PER_S
    return [RequestRecord(index=i, trial=trial, tag="c1", endpoint="/v1/embeddings", stream=False, items=items,
                          t_send_ns=t0 + i * 100 * NS_PER_MS, t_end_ns=t0 + i * 100 * NS_PER_MS + 40 * NS_PER_MS,
                          ok=True) for i in range(n)]


def test_items_per_second_pools_across_trials_as_a_window_weighted_mean():
    from servelab.bench.metrics import summarize

    levels, tally = [], LevelTally(keep=False, count_window=False)
    for trial, (n, items) in enumerate(((10, 4), (20, 2))):
        rs = unary_records(trial, n, items)
        window = (rs[0].t_send_ns, rs[-1].t_end_ns)
        level = summarize(rs, tag="c1", mode="concurrency", concurrency=1, window=window)
        assert level.figures["items_s"].value * level.window_s == pytest.approx(n * items)
        assert level.figures["input_tok_s"].value is None  # no usage in these records: not measured, not 0
        levels.append(level)
        tally.extend(rs)
    pooled = pool_level(levels, tally, [0, 1])
    expected = sum(s.figures["items_s"].value * s.window_s for s in levels) / sum(s.window_s for s in levels)
    assert pooled.figures["items_s"].value == pytest.approx(expected)
    assert pooled.figures["e2e_ms"].dist.n == 30 and not STREAMED_ONLY & set(pooled.figures)


def test_a_trial_without_usage_leaves_the_pooled_input_tokens_per_second_not_measured_with_its_reason():
    from servelab.bench.metrics import summarize
    from servelab.records import Usage

    levels, tally = [], LevelTally(keep=False, count_window=False)
    for trial in (0, 1):
        rs = [r.model_copy(update={"usage": Usage(prompt_tokens=100) if trial == 0 else None})
              for r in unary_records(trial, 12, 2)]
        level = summarize(rs, tag="c1", mode="concurrency", concurrency=1, window=(rs[0].t_send_ns, rs[-1].t_end_ns))
        levels.append(level)
        tally.extend(rs)
    assert levels[0].figures["input_tok_s"].value == pytest.approx(12 * 100 / levels[0].window_s)
    pooled = pool_level(levels, tally, [0, 1]).figures["input_tok_s"]
    assert pooled.value is None  # not trial 1's rate passed off as both trials'
    assert pooled.note == f"not measured in trial 2: {levels[1].figures['input_tok_s'].note}"


@pytest.mark.parametrize("options,said", [
    ({"endpoint": "embeddings", "mode": "multiturn"}, "--endpoint embeddings runs in --mode single, concurrency, "
                                                       "rate, burst, sweep, rate-sweep or slo-search, not multiturn: "
                                                       "conversations and traces are chat"),
    ({"endpoint": "rerank", "batch_size": 4}, "--batch-size applies to --endpoint embeddings"),
    ({"endpoint": "embeddings", "documents": 4}, "--documents applies to --endpoint rerank"),
    ({"batch_size": 4}, "--batch-size applies to --endpoint embeddings"),
    ({"endpoint": "embeddings", "batch_size": 0}, "--batch-size must be between 1 and 4,096"),
    ({"endpoint": "rerank", "mode": "rate", "rate": "2", "slo": "ttft_p99_ms=500"},
     "--slo ttft_p99_ms does not apply to --endpoint rerank"),
])
def test_options_that_do_not_apply_to_non_streamed_endpoints_are_refused_in_one_line(options, said):
    with pytest.raises(UserError) as caught:
        build_options(BenchArgs(**options))
    assert str(caught.value).startswith(said), str(caught.value)


def test_the_options_build_the_non_streamed_workloads():
    opts = build_options(BenchArgs(endpoint="embeddings", batch_size=8, input_tokens="64"))
    assert isinstance(opts.workload, EmbeddingsWorkload) and opts.workload.batch == 8
    opts = build_options(BenchArgs(endpoint="rerank", mode="rate", rate="2", slo="e2e_p99_ms=900"))
    assert isinstance(opts.workload, RerankWorkload) and opts.workload.documents == 8


@pytest.mark.parametrize("endpoint, extra", [("embeddings", {"batch_size": 2}), ("rerank", {"documents": 2}),
                                             ("embeddings", {"batch_size": 2, "input_tokens": "24"}),
                                             ("rerank", {"documents": 2, "input_tokens": "24"})])
def test_each_bench_sends_texts_of_its_own(endpoint, extra):
    import asyncio

    from servelab.pipeline import in_series
    from test_workloads import WordCounter

    workload = build_options(BenchArgs(endpoint=endpoint, **extra)).workload

    def body(trial: int, step: str) -> dict:
        bench_workload = in_series(workload, trial, step)
        asyncio.run(bench_workload.prepare(WordCounter()))
        return bench_workload.request(0, "m").body

    key = "input" if endpoint == "embeddings" else "documents"
    first, second, sweep = body(1, "single")[key], body(2, "single")[key], body(1, "concurrency")[key]
    assert len({*first, *second, *sweep}) == 6  # no text of one bench is another's: no cache carries over
    assert body(1, "single")[key] == first  # and each bench's texts are the same every time
    if "input_tokens" in extra:  # still of the exact length asked for
        assert [WordCounter().words(t) + 1 for t in first + second] == [24] * 4


# ---- compare, summary.json and the exports --------------------------------------------------------------------


def slow_embeddings(delay_s: float) -> web.Application:
    import asyncio

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        await asyncio.sleep(delay_s)
        return web.json_response(embeddings_body(body["input"]))

    return FakeOpenAI(embeddings=handler).app()


def test_compare_sets_items_per_second_and_latency_side_by_side_with_intervals(tmp_path):
    from servelab.api import bench as api_bench
    from servelab.compare.compare import compare_runs
    from servelab.compare.sources import load_run_dir
    from servelab.report.compare_terminal import render_comparison

    runs = []
    for name, delay in (("fast", 0.005), ("slow", 0.03)):
        with serving(slow_embeddings(delay)) as url:
            done = api_bench(url, out=tmp_path / name, endpoint="embeddings", batch_size=4, requests=15, warmup=0)
        summary = json.loads((done.run_dir / "summary.json").read_text())
        figures = summary["steps"][0]["result"]["levels"][0]["figures"] if "steps" in summary else \
            summary["levels"][0]["figures"]
        assert "items_s" in figures and not STREAMED_ONLY & set(figures)
        runs.append(load_run_dir(done.run_dir))
    comparison = compare_runs(runs)
    rows = {row.key: row for row in comparison.rows}
    assert {"unary.items_s", "unary.latency_ms", "unary.latency_p99_ms"} <= set(rows)
    assert not {"single.ttft_ms", "single.decode_tok_s", "peak.output_tok_s"} & set(rows)
    items = rows["unary.items_s"]
    for cell in items.figures:
        assert cell.ci is not None and cell.ci[0] <= cell.value <= cell.ci[1]
    assert items.figures[1].value < items.figures[0].value  # the slower server embeds fewer items per second
    latency = rows["unary.latency_ms"]
    assert items.ratios[1].ratio < 1 < latency.ratios[1].ratio
    # never "better"; with one trial per run (or a busy machine) compare gives no verdict at all
    assert "better" not in {items.ratios[1].verdict, latency.ratios[1].verdict}
    out = io.StringIO()
    render_comparison(Console(file=out, width=220, color_system=None), comparison)
    shown = out.getvalue()
    assert "items/s" in shown and "request latency ms (p50)" in shown
    from servelab.report.html import render_report

    page = render_report(runs, comparison)
    assert "items/s</th>" in page and "latency ms p99</th>" in page and "TTFT ms p50</th>" not in page


def test_the_progress_line_counts_items_not_tokens_for_non_streamed_requests():
    from servelab.report.progress import LevelProgress

    progress = LevelProgress()
    progress.begin("c2")
    for r in unary_records(0, 3, 4):
        line = progress.add(r)
    assert "12 items (" in line and "tokens" not in line
    failed = unary_records(0, 1, 4)[0].model_copy(update={"ok": False, "error_kind": "parse"})
    assert "12 items (" in progress.add(failed) and "(1 failed)" in progress.line()


def test_a_non_streamed_level_has_the_gpu_s_power_and_activity_but_no_per_token_energy():
    from servelab.bench.gpu_figures import gpu_level_figures
    from servelab.bench.gpu_run import attach_gpu
    from servelab.bench.metrics import summarize
    from servelab.records import GpuSummary

    rs = unary_records(0, 4, 2)
    level = summarize(rs, tag="single", mode="single", concurrency=1, window=(rs[0].t_send_ns, rs[-1].t_end_ns))
    attach_gpu(level, GpuSummary(measured=False, reason="no GPU telemetry source"))
    gpu = {k for k in level.figures if k.startswith(("gpu_", "j_per", "output_tokens_per"))}
    assert gpu == {"gpu_power_w_mean", "gpu_sm_active_pct_mean", "gpu_idle_share"}
    assert level.figures["gpu_power_w_mean"].note == "not measured: no GPU telemetry source"
    streamed = gpu_level_figures(GpuSummary(measured=False, reason="x"))
    assert {"j_per_output_token", "output_tokens_per_j"} <= set(streamed)


def test_worker_processes_send_non_streamed_requests_and_hold_them_to_the_probe_s_dimension():
    app, _ = broken_embeddings()
    records: list[RequestRecord] = []
    with serving(app) as url:
        result = run(url, EmbeddingsWorkload(batch=2), records, mode="concurrency", workers=2,
                     plan=_plan(concurrency=2, requests=12), warmup=0, steady=SteadyRule(min_completed=4))
    measured = [r for r in records if not r.warmup]
    assert {p.requests for p in result.workers} and sum(p.requests for p in result.workers) >= len(measured)
    assert all(not r.stream and r.items == 2 for r in measured)
    wrong = [r for r in measured if not r.ok and "dimension" in (r.error_detail or "")]
    assert wrong and all(r.error_detail == "embedding 1 has dimension 8, not the run's 16" for r in wrong)
    check_level_against_records(result.levels[0], measured)


# ---- vLLM's pooling runner (slow tier) -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_vllms_pooling_runner_serves_both_workloads_checked_and_counted(vllm_pooling):
    records: list[RequestRecord] = []
    embeddings = run(vllm_pooling["url"], EmbeddingsWorkload(batch=4), records, single_requests=3, warmup=0)
    rerank = run(vllm_pooling["url"], RerankWorkload(documents=3), records, single_requests=3, warmup=0)
    assert embeddings.workload["dimension"] == 576
    assert rerank.workload["endpoint"] == "/v1/rerank" and rerank.workload["endpoints_tried_before"] == []
    for result, items in ((embeddings, 4), (rerank, 3)):
        (level,) = result.levels
        measured = [r for r in records if not r.warmup and r.endpoint == result.workload["endpoint"]]
        assert len(measured) == 3 and all(r.ok and r.items == items for r in measured), \
            [r.error_detail for r in measured]
        check_level_against_records(level, measured)
        # vLLM reports usage on both: input tok/s is its prompt tokens over the window
        prompt = sum(r.usage.prompt_tokens for r in measured)
        assert level.figures["input_tok_s"].value * level.window_s == pytest.approx(prompt, rel=1e-9)


# ---- the ladders and the search: items/s where streams have output tok/s ---------------------------------------


@pytest.mark.engine
def test_an_embeddings_sweep_on_the_real_engine_climbs_on_items_per_second(pooled_engine):
    records: list[RequestRecord] = []
    result = run(pooled_engine["url"], EmbeddingsWorkload(batch=2, input_tokens=parse_length(12)), records,
                 mode="sweep", max_concurrency=2, level_duration_s=1.0, warmup=0)
    assert [lv.tag for lv in result.levels][0] == "c1" and result.stop_reason, result.stop_reason
    for level in result.levels:
        assert level.failed == 0 and "output_tok_s" not in level.figures
        check_level_against_records(level, [r for r in records if r.tag == level.tag and not r.warmup])
    best = max(result.levels, key=lambda lv: lv.figures["items_s"].value)
    head = result.headline
    assert head["peak.items_s"].value == best.figures["items_s"].value
    assert head["peak.concurrency"].value == best.concurrency
    assert "peak.output_tok_s" not in head and "single.items_s" in head  # c1 is the single stream of a sweep


def queueing_embeddings(per_request_ms: float) -> web.Application:
    """Embeddings whose latency grows with the requests in flight: each waits `per_request_ms` for every request
    in flight with it, as a server that runs them one after another would."""
    import asyncio

    in_flight = {"n": 0}

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        in_flight["n"] += 1
        try:
            await asyncio.sleep(per_request_ms * in_flight["n"] / 1000)
        finally:
            in_flight["n"] -= 1
        return web.json_response(embeddings_body(body["input"]))

    return FakeOpenAI(embeddings=handler).app()


def test_an_slo_search_over_concurrency_finds_where_embeddings_latency_breaks_its_target():
    # c streams wait ~c x 25 ms: a p99 target of 90 ms holds at 1, 2 and 3 streams, never at 4
    opts = build_options(BenchArgs(endpoint="embeddings", mode="slo-search", search="concurrency",
                                   slo="e2e_p99_ms=90", max_concurrency=8, duration=0.5, warmup=0, min_requests=5,
                                   tokenizer="none", gpu=False))
    with serving(queueing_embeddings(25)) as url:
        result = bench(url, opts)
    search = result.search
    assert search["dimension"] == "concurrency" and 1 <= search["best"] <= 3, search
    assert search["lowest_failing"] is not None and search["best"] < search["lowest_failing"] <= 8, search
    head = result.headline
    assert head["slo.max_concurrency"].value == search["best"]
    level = next(lv for lv in result.levels if lv.concurrency == search["best"] and lv.slo["passed"])
    assert head["slo.items_s"].value == level.figures["items_s"].value
    assert "slo.output_tok_s" not in head
