"""A mode added as one file (bench/modes/burst.py): `--requests N` sent at once, against the real embedded engine."""

from __future__ import annotations

import pytest

from servelab.bench.options import BenchArgs, build_options
from servelab.bench.runner import bench
from servelab.errors import UserError


@pytest.mark.engine
def test_a_burst_sends_every_request_at_once_as_one_level(embedded_server) -> None:
    records = []
    opts = build_options(BenchArgs(mode="burst", requests=6, max_tokens=16, warmup="0"))
    result = bench(embedded_server["url"], opts, on_record=records.append)
    assert result.mode == "burst"
    (level,) = result.levels
    assert (level.tag, level.mode, level.concurrency) == ("b6", "concurrency", 6)
    assert level.requests == level.ok == 6 and level.failed == 0
    assert level.load == {"requests": 6, "at_once": True, "window": "first send .. last end"}
    assert result.workload["load_plan"] == {"requests_at_once": 6}
    # at once: every request went out before the first one finished
    assert len(records) == 6 and max(r.t_send_ns for r in records) < min(r.t_end_ns for r in records)
    # the window is first send .. last end, so it holds every token of the level
    tokens = sum(r.output_tokens for r in records)
    assert level.figures["output_tok_s"].value * level.window_s == pytest.approx(tokens, rel=1e-6)
    assert result.headline["peak.concurrency"].value == 6
    assert result.headline["peak.output_tok_s"].value == level.figures["output_tok_s"].value


def test_a_burst_needs_its_size() -> None:
    with pytest.raises(UserError, match="needs --requests"):
        bench("http://127.0.0.1:9", build_options(BenchArgs(mode="burst")))
