"""The benchmark against the real embedded engine: token-exact counts and self-consistent numbers."""

from __future__ import annotations

import pytest

from servelab.bench.metrics import NS_PER_S
from servelab.bench.runner import BenchOptions, bench
from servelab.bench.workload import Workload

pytestmark = pytest.mark.engine


def test_single_stream_counts_equal_server_usage(embedded_server) -> None:
    records = []
    result = bench(embedded_server["url"], BenchOptions(mode="single", single_requests=3,
                                                        workload=Workload(max_tokens=24)),
                   on_record=records.append)
    assert result.workload["engine_detected"] == "llamacpp"
    assert result.workload["ignore_eos"] is True
    (level,) = result.levels
    assert level.ok == 3 and level.failed == 0
    measured = [r for r in records if not r.warmup]
    assert len(measured) == 3 and len(records) == 5  # the auto warm-up (two, one at a time), excluded
    for r in measured:
        assert r.count_method == "server_per_chunk"
        assert r.output_tokens == r.usage.completion_tokens == 24  # ignore_eos: exactly max_tokens
        assert r.saw_done and r.finish_reason == "length"
    f = level.figures
    # Self-consistency: output tok/s x window = tokens received in the window (all of them, in single mode).
    tokens = sum(r.output_tokens for r in measured)
    assert f["output_tok_s"].value * level.window_s == pytest.approx(tokens, rel=1e-6)
    assert level.window_s * NS_PER_S >= sum(r.t_end_ns - r.t_send_ns for r in measured) * 0.999
    assert 0 < f["ttft_ms"].value < f["e2e_ms"].value
    assert f["decode_tok_s"].value > 0 and f["itl_ms"].value > 0
    # decode rate and TPOT are two views of the same span
    assert f["decode_tok_s"].dist.n == 3
    assert result.headline["single.decode_tok_s"].counted_by == "server_per_chunk"


# The slow tier (CI runs it): each level runs on until it is steady, ~11 s; the default suite sweeps the real engine
# in the API's documented example (tests/test_api.py) and the embeddings ladder (tests/test_bench_unary.py)
@pytest.mark.slow
def test_sweep_finds_a_peak_at_least_the_single_stream_rate(embedded_server) -> None:
    # two levels of 1.5 s (each runs on until it is steady): what is checked holds from the second level on
    result = bench(embedded_server["url"], BenchOptions(mode="sweep", level_duration_s=1.5, max_concurrency=2,
                                                        workload=Workload(max_tokens=32)))
    tags = [s.tag for s in result.levels]
    assert tags[0] == "c1" and len(tags) >= 2
    assert result.stop_reason
    peak = result.headline["peak.output_tok_s"].value
    c1 = result.levels[0].figures["output_tok_s"].value
    assert peak >= c1 > 0
    for level in result.levels:
        assert level.failed == 0
        assert level.figures["output_tok_s"].counted_by == "server_per_chunk"
    assert result.headline["peak.concurrency"].value in {s.concurrency for s in result.levels}


def test_completions_endpoint_counts_too(embedded_server) -> None:
    records = []
    result = bench(embedded_server["url"], BenchOptions(mode="single", single_requests=1, warmup=0,
                                                        workload=Workload(endpoint="/v1/completions",
                                                                          max_tokens=16)),
                   on_record=records.append)
    assert result.levels[0].ok == 1
    # llama.cpp's completions endpoint puts usage inside the finish chunk, not in a separate one
    assert records[0].output_tokens == records[0].usage.completion_tokens == 16


def test_client_tokenizer_counts_equal_server_usage_on_the_real_engine(embedded_server) -> None:
    """Without per-chunk counts, the server's own tokenizer (llama.cpp /tokenize with pieces) recounts the text
    after the run; the counts must equal the server's usage, event by event summing to completion_tokens."""
    import asyncio

    from servelab.bench.client import ClientOptions, RequestSpec, StreamClient
    from servelab.bench.tokenizer import LlamaCppServerTokenizer
    from servelab.bench.tokens import recount_with_tokenizer

    url = embedded_server["url"]

    async def go():
        async with StreamClient(url, ClientOptions()) as client:  # no timings_per_token: no running counts
            records = [await client.send(RequestSpec(
                endpoint="/v1/chat/completions",
                body={"model": "smollm2", "max_tokens": 40, "temperature": 0, "ignore_eos": True,
                      "messages": [{"role": "user", "content": f"Write a poem about the number {i}."}]}))
                for i in range(2)]
        assert all(r.count_method == "chunk_count" for r in records)
        await recount_with_tokenizer(records, LlamaCppServerTokenizer(url))
        return records

    for r in asyncio.run(go()):
        assert r.ok and r.count_method == "client_tokenizer"
        assert r.output_tokens == r.usage.completion_tokens == 40
