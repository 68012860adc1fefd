"""bench --workers N --ray (issue 15) on a real local Ray cluster, started by the test with several worker
processes. Slow tier: Ray takes ~15 s to start on two cores; skipped cleanly where Ray is not installed
(`pip install 'servelab[ray]'`)."""

from __future__ import annotations

import os

import pytest

# Before Ray is imported (it reads them then), and inherited by every process of its cluster: name the node by
# the loopback address rather than the NIC's, so that the actors dial the coordinator on 127.0.0.1 (tests send
# packets to 127.0.0.1 and ::1 only, and the netguard refuses the rest: the variable's name says Windows and OSX,
# where Ray does this by default, but it holds on Linux too); and no usage statistics sent anywhere. Assigned, not
# defaulted: a value from the environment must not send traffic off 127.0.0.1.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

ray = pytest.importorskip("ray")

from servelab.bench.options import BenchArgs, build_options  # noqa: E402
from servelab.bench.runner import bench  # noqa: E402
from servelab.calibration import Script, start_calibration_server  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=3, include_dashboard=False, logging_level="ERROR")
    try:
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}, ray.nodes()
        yield ray.nodes()
    finally:
        ray.shutdown()


def test_a_bench_runs_end_to_end_on_ray_actors(cluster) -> None:
    nodes = {n["NodeID"] for n in cluster if n.get("Alive")}
    with start_calibration_server(Script(ttft_ms=5, itl_ms=2, output_tokens=8)) as cal:
        for mode, extra in (("concurrency", {"concurrency": 4, "requests": 24}),
                            ("rate", {"rate": "40", "requests": 24, "arrival": "constant"})):
            result = bench(cal.url, build_options(BenchArgs(mode=mode, max_tokens=8, workers="2", ray="auto",
                                                            tokenizer="none", warmup=1, **extra)))
            (level,) = result.levels
            assert level.ok == 24 and level.failed == 0, level.top_errors
            assert not result.warnings
            # Provenance names every worker: its Ray node, host, pid and where its clock stood.
            assert [w.id for w in result.workers] == [0, 1]
            for w in result.workers:
                assert w.backend == "ray" and w.node in nodes and w.host and w.pid and w.status == "ok"
                assert w.clock_offset_ns is not None and w.clock_error_ns is not None
                assert w.clock_offset_end_ns is not None
                # A local cluster: the actors share this host's clock, within the measured bound.
                assert w.shared_clock and abs(w.clock_offset_ns) <= w.clock_error_ns
            assert sum(w.requests for w in result.workers) == 25  # the warm-up (--warmup 1) and the level's 24
            if mode == "rate":
                assert level.figures["client_lag_ms"].value is not None
                assert level.figures["client_lag_ms"].value < 50
