"""Server-side evidence from Prometheus /metrics: counter increases, TTFT cross-check, speculative decoding."""

from __future__ import annotations

import pytest

from servelab.bench.runner import BenchOptions, bench
from servelab.bench.server_metrics import LevelWatch, evidence, parse_metrics
from servelab.bench.workload import Workload
from servelab.engines import EngineSpec
from servelab.engines.sglang import SGLANG_METRICS
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
    assert ev.gauges["running"] == {"mean": pytest.approx(2.0), "max": 4.0, "last": 0.0}
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
def test_real_engine_with_a_draft_model_reports_acceptance(tmp_path) -> None:
    spec = EngineSpec(engine="llamacpp", model="smollm2", parallel=2,
                      extra_args=["--spec-type", "draft-simple", "--draft-model", "smollm2", "--draft-max", "4"])
    with start_engine(spec, tmp_path, ready_timeout_s=120) as engine:
        result = bench(engine.url, BenchOptions(mode="single", single_requests=2,
                                                workload=Workload(max_tokens=24)))
    level = result.levels[0]
    assert level.ok == 2
    server = level.server
    assert server is not None and server.samples >= 0
    # The server generated exactly what the client received (warm-up is outside the level's window).
    assert server.counters["generated_tokens"] == 48
    sd = server.spec_decode
    assert sd is not None and sd.drafted_tokens > 0
    # The draft is the target model itself: (nearly) every draft is accepted.
    assert 0.8 <= sd.acceptance_rate <= 1.0
    assert sd.mean_accepted_length > 1.5
