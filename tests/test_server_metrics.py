"""Server-side evidence from Prometheus /metrics: counter increases, TTFT cross-check, speculative decoding, and
gauges kept per series (a rank's KV usage is never added to another's)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from servelab.bench.runner import BenchOptions, bench
from servelab.bench.server_metrics import LevelWatch, Scrape, evidence, gauge_words, parse_metrics
from servelab.bench.workload import Workload
from servelab.engines import EngineSpec
from servelab.engines.llama_common import LLAMA_SERVER_METRICS
from servelab.engines.sglang import SGLANG_METRICS
from servelab.engines.tgi import TGI_METRICS
from servelab.engines.vllm import VLLM_METRICS
from servelab.lifecycle.launch import start_engine
from servelab.records import RequestRecord, TokenEvent

MS = 1_000_000


def vllm_text(gen: float, ttft_sum: float, ttft_count: int, drafted: float, accepted: float, drafts: float,
              running: float) -> str:
    # The shape vLLM 0.33 exposes (labels included; two engines' series must add up).
    return f"""# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen / 2}
vllm:generation_tokens_total{{engine="1",model_name="m"}} {gen / 2}
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="m"}} {ttft_count}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {ttft_count}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {ttft_sum}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {ttft_count}
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {drafted}
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
"""


def rec(i: int, ttft_ms: float, tokens: int) -> RequestRecord:
    events = [TokenEvent(t_ns=int((ttft_ms + k) * MS), kind="answer", tokens=1) for k in range(tokens)]
    return RequestRecord(index=i, endpoint="/v1/chat/completions", t_send_ns=0, t_end_ns=events[-1].t_ns,
                         events=events, ok=True, count_method="server_per_chunk")


def test_vllm_counters_histogram_and_spec_decode() -> None:
    before = parse_metrics(vllm_text(gen=100, ttft_sum=1.0, ttft_count=10, drafted=50, accepted=20, drafts=10,
                                     running=0))
    during = [parse_metrics(vllm_text(gen=150, ttft_sum=1.1, ttft_count=11, drafted=60, accepted=25, drafts=12,
                                      running=r)) for r in (2, 4)]
    after = parse_metrics(vllm_text(gen=160, ttft_sum=1.2, ttft_count=12, drafted=150, accepted=80, drafts=30,
                                    running=0))
    records = [rec(0, 40, 30), rec(1, 60, 30)]
    ev = evidence(LevelWatch(VLLM_METRICS, before, during, after), records)
    assert ev.counters["generated_tokens"] == pytest.approx(60)  # both engines' series added up
    assert ev.server_ttft_mean_ms == pytest.approx(100.0)  # (1.2 - 1.0) s over 2 requests
    assert ev.client_ttft_mean_ms == pytest.approx(50.0)
    assert ev.gauges["running"] == {"mean": pytest.approx(2.0), "max": 4.0, "last": 0.0, "series": 1.0}
    sd = ev.spec_decode
    assert (sd.drafted_tokens, sd.accepted_tokens, sd.drafts) == (100, 60, 20)
    assert sd.acceptance_rate == pytest.approx(0.6)
    assert sd.mean_accepted_length == pytest.approx(1 + 60 / 20)
    assert not ev.notes  # 60 generated = 60 received


def test_token_disagreement_is_noted() -> None:
    a = parse_metrics(vllm_text(0, 0, 0, 0, 0, 0, 0))
    b = parse_metrics(vllm_text(500, 0, 0, 0, 0, 0, 0))
    ev = evidence(LevelWatch(VLLM_METRICS, a, [], b), [rec(0, 10, 20)])
    assert ev.notes and "500" in ev.notes[0] and ev.spec_decode is None


def test_sglang_gauges_give_acceptance() -> None:
    text = ("# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length{tp_rank=\"0\"} 3.2\n"
            "# TYPE sglang:spec_accept_rate gauge\nsglang:spec_accept_rate{tp_rank=\"0\"} 0.7\n")
    s = parse_metrics(text)
    ev = evidence(LevelWatch(SGLANG_METRICS, s, [s], s), [])
    assert ev.spec_decode.mean_accepted_length == pytest.approx(3.2)
    assert ev.spec_decode.acceptance_rate == pytest.approx(0.7)


@pytest.mark.engine
@pytest.mark.slow  # an engine with a draft model, a bench and a second read of /metrics: long for the default suite
def test_real_engine_with_a_draft_model_reports_acceptance(tmp_path) -> None:
    spec = EngineSpec(engine="llamacpp", model="smollm2", parallel=2,
                      extra_args=["--spec-type", "draft-simple", "--draft-model", "smollm2", "--draft-max", "4"])
    with start_engine(spec, tmp_path, ready_timeout_s=120) as engine:
        result = bench(engine.url, BenchOptions(mode="single", single_requests=2,
                                                workload=Workload(max_tokens=24)))
    level = result.levels[0]
    assert level.ok == 2
    server = level.server
    assert server is not None
    # The level's scrapes were read: llama-server's two gauges (one series each) were seen after the level.
    assert server.gauges["running"]["series"] == 1 and server.gauges["waiting"]["max"] >= 0
    # The server generated exactly what the client received (warm-up is outside the level's window).
    assert server.counters["generated_tokens"] == 48
    sd = server.spec_decode
    assert sd is not None and sd.drafted_tokens > 0
    # The draft is the target model itself: (nearly) every draft is accepted.
    assert 0.8 <= sd.acceptance_rate <= 1.0
    assert sd.mean_accepted_length > 1.5


# ---------------------------------------------------------------------------------------------------------------
# Each engine's own exposition (tests/fixtures/metrics/, tests/fixtures/README.md says where each comes from): a
# scrape before the level and one after it, the after one also read during the level.
# ---------------------------------------------------------------------------------------------------------------

METRICS_FIXTURES = Path(__file__).parent / "fixtures" / "metrics"


def level_watch(names: dict[str, str], stem: str) -> LevelWatch:
    before, after = (parse_metrics((METRICS_FIXTURES / f"{stem}_{when}.prom").read_text()) for when in
                     ("before", "after"))
    return LevelWatch(names, before, [after], after)


def received(requests: int, tokens: int) -> list[RequestRecord]:
    return [rec(i, 50, tokens) for i in range(requests)]


def test_vllm_two_data_parallel_engines() -> None:
    watch = level_watch(VLLM_METRICS, "vllm_0.33.0_dp2")
    ev = evidence(watch, received(24, 128))
    assert ev.counters["generated_tokens"] == 3072  # 1536 on each engine, added
    assert ev.counters["prompt_tokens"] == 24 * 310
    # Engine 0 at 40 %, engine 1 at 52 %: 46 % on average, never "92 %".
    assert ev.gauges["kv_usage"] == {"mean": pytest.approx(0.46), "max": 0.52, "last": pytest.approx(0.46),
                                     "series": 2.0}
    assert ev.gauges["running"]["mean"] == 12 and ev.gauges["waiting"]["max"] == 1
    sd = ev.spec_decode
    assert (sd.drafts, sd.drafted_tokens, sd.accepted_tokens) == (1024, 3072, 1536)
    assert sd.acceptance_rate == pytest.approx(0.5) and sd.mean_accepted_length == pytest.approx(2.5)
    assert ev.server_ttft_mean_ms == pytest.approx((182 * 0.06 - 158 * 0.05) / 24 * 1000)
    assert not ev.notes  # the token cross-check ran and agreed
    assert "3072" in evidence(watch, received(24, 100)).notes[0]


def test_sglang_eight_schedulers_with_eagle() -> None:
    watch = level_watch(SGLANG_METRICS, "sglang_0.5.23_dp8_eagle")
    ev = evidence(watch, received(32, 256))
    # Streamed and non-streamed series of the tokenizer's counter add up; only the streamed one moved.
    assert ev.counters["generated_tokens"] == 8192 and ev.counters["prompt_tokens"] == 32 * 900
    kv = ev.gauges["kv_usage"]
    assert kv == {"mean": pytest.approx(0.44), "max": 0.52, "last": pytest.approx(0.44), "series": 8.0}
    assert gauge_words(kv) == "mean 0.44, max 0.52 over 8 series"
    assert ev.gauges["running"] == {"mean": 4.0, "max": 4.0, "last": 4.0, "series": 8.0}
    sd = ev.spec_decode  # gauges only: the mean over the eight schedulers, not their sum (25.0)
    assert sd.mean_accepted_length == pytest.approx(3.125) and sd.acceptance_rate == pytest.approx(0.70)
    assert "mean over 8 series" in sd.source
    assert ev.server_ttft_mean_ms == pytest.approx(300.0)
    assert not ev.notes
    assert "8192" in evidence(watch, received(32, 200)).notes[0]


def test_tgi_generated_tokens_come_from_the_histogram_sum() -> None:
    watch = level_watch(TGI_METRICS, "tgi_3.3.6")
    ev = evidence(watch, received(16, 128))
    assert ev.counters["generated_tokens"] == 2048  # 3328 - 1280: tgi_request_generated_tokens_sum
    assert "tgi_request_generated_tokens" not in watch.after.totals  # only _sum, _count and _bucket exist
    assert ev.gauges["running"]["last"] == 8 and ev.gauges["waiting"]["last"] == 3
    assert not ev.notes
    ev = evidence(watch, received(16, 100))
    assert ev.notes and "2048" in ev.notes[0] and "1600" in ev.notes[0]  # the cross-check runs for TGI


def test_llama_server_counters_and_one_series_gauges() -> None:
    watch = level_watch(LLAMA_SERVER_METRICS, "llama_server_0c1e570")
    ev = evidence(watch, received(8, 48))
    assert ev.counters["generated_tokens"] == 384 and ev.counters["prompt_tokens"] == 8 * 62
    assert ev.gauges["running"] == {"mean": 4.0, "max": 4.0, "last": 4.0, "series": 1.0}
    assert gauge_words(ev.gauges["waiting"]) == "mean 2.00, max 2.00"
    sd = ev.spec_decode
    assert sd.acceptance_rate == pytest.approx(0.75) and sd.mean_accepted_length == pytest.approx(4.0)
    assert not ev.notes
    assert "384" in evidence(watch, received(8, 40)).notes[0]


def test_samples_are_read_by_their_type() -> None:
    s = parse_metrics("""# TYPE kv gauge
kv{rank="0"} 0.25
kv{rank="1"} 0.75
# TYPE tok_total counter
tok_total{rank="0"} 3
tok_total{rank="1"} 4
# HELP tok_created when the counter was made
# TYPE tok_created gauge
tok_created{rank="0"} 1.7e9
# TYPE lat histogram
lat_bucket{rank="0",le="1.0"} 1
lat_bucket{rank="0",le="+Inf"} 2
lat_bucket{rank="1",le="1.0"} 3
lat_bucket{rank="1",le="+Inf"} 3
lat_sum{rank="0"} 2.5
lat_sum{rank="1"} 1.5
lat_count{rank="0"} 2
lat_count{rank="1"} 3
# TYPE q summary
q{quantile="0.5"} 9
q_sum 10
q_count 4
untyped_requests_total{rank="0"} 5
untyped_requests_total{rank="1"} 6
untyped_ratio{rank="0"} 0.5
untyped_ratio{rank="1"} 0.7
""")
    assert s.gauges == {"kv": [0.25, 0.75], "untyped_ratio": [0.5, 0.7]}
    assert s.totals == {"tok_total": 7, "lat_sum": 4.0, "lat_count": 5, "q_sum": 10, "q_count": 4,
                        "untyped_requests_total": 11}
    assert s.buckets == {"lat": {1.0: 4, float("inf"): 5}}
    assert s.types["lat"] == "histogram" and s.types["kv"] == "gauge"


def test_kv_usage_is_printed_per_series_and_an_older_runs_figure_says_what_it_was() -> None:
    from servelab.records import ServerEvidence
    from servelab.report.terminal import render_levels
    from synthetic_runs import synthetic_run

    summary, _ = synthetic_run("spec")
    bench_result = summary.trials[0].single
    level = bench_result.levels[0]
    level.server = ServerEvidence(gauges={"kv_usage": {"mean": 0.4, "max": 0.52, "last": 0.41, "series": 8.0}})
    console = Console(file=io.StringIO(), width=200)
    render_levels(console, bench_result)
    assert "single server KV-cache usage mean 0.40, max 0.52 over 8 series" in console.file.getvalue()
    old = ServerEvidence.model_validate({"gauges": {"kv_usage": {"mean": 3.2, "max": 4.1, "last": 3.0}}})
    assert gauge_words(old.gauges["kv_usage"]).startswith("mean 3.20, max 4.10 (an older run's figure")


def test_an_empty_scrape_is_not_evidence() -> None:
    assert evidence(LevelWatch(VLLM_METRICS, Scrape(), [], Scrape()), []).gauges == {}
