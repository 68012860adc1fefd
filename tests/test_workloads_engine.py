"""Workloads against the real embedded engine: synthetic prompts are exactly as long as llama.cpp counts them
(after its chat template), and shared-prefix groups hit its prefix cache within a group and only there."""

from __future__ import annotations

import pytest

from servelab.bench.options import BenchArgs, build_options
from servelab.bench.runner import bench

pytestmark = pytest.mark.engine


def test_synthetic_input_lengths_equal_the_engines_prompt_tokens(embedded_server) -> None:
    records = []
    opts = build_options(BenchArgs(mode="concurrency", concurrency=3, requests=6, max_tokens=1, warmup=0,
                                   input_tokens="uniform:40..90", seed=5))
    result = bench(embedded_server["url"], opts, on_record=records.append)
    (level,) = result.levels
    assert level.ok == 6
    lengths = [r.input_tokens for r in records]
    assert all(40 <= n <= 90 for n in lengths) and len(set(lengths)) > 3
    for r in records:
        assert r.usage.prompt_tokens == r.input_tokens, (r.index, r.input_tokens, r.usage)
    assert not any("prompt the workload built" in w for w in level.warnings)
    assert result.workload["kind"] == "synthetic" and result.workload["template_overhead_tokens"] > 0


def test_shared_prefix_groups_hit_the_prefix_cache_only_within_a_group(embedded_server) -> None:
    records = []
    opts = build_options(BenchArgs(mode="single", requests=4, warmup=0, max_tokens=1, input_tokens="80",
                                   prefix_groups=2, prefix_tokens=32, prefix_group_size=2))
    bench(embedded_server["url"], opts, on_record=records.append)
    assert [r.usage.prompt_tokens for r in records] == [80] * 4
    cached = [r.usage.cached_tokens or 0 for r in records]
    # Requests 0 and 2 open their group: only the template and opener can be cached. Requests 1 and 3 share
    # their group's 32 prefix tokens with the request before them.
    assert cached[0] < 32 and cached[2] < 32, cached
    assert cached[1] >= 32 and cached[3] >= 32, cached
