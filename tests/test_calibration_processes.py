"""The calibration server from several processes sharing one port (issue 15), and selftest naming which side was
the limit."""

from __future__ import annotations

import asyncio

from servelab.bench.client import RequestSpec, StreamClient
from servelab.bench.selftest import SelftestLevel, which_limit
from servelab.calibration import Script, start_calibration_server


def test_several_server_processes_share_a_port_and_every_truth_is_found() -> None:
    async def send(url: str, n: int):
        async with StreamClient(url) as client:
            return await asyncio.gather(*(client.send(RequestSpec(
                endpoint="/v1/chat/completions", headers={"X-Calibration-Id": f"r{i}"},
                body={"model": "calibration", "messages": [{"role": "user", "content": "x"}]})) for i in range(n)))

    with start_calibration_server(Script(ttft_ms=1, itl_ms=2, output_tokens=6), processes=3) as cal:
        assert len(set(cal.pids)) == 3 and len(cal.own_urls) == 3 and all(p.poll() is None for p in cal.procs)
        records = asyncio.run(send(cal.url, 30))
        assert all(r.ok and r.output_tokens == 6 for r in records)
        truths = [cal.truth(f"r{i}") for i in range(30)]  # held by whichever process served each
        assert all(len(t["events"]) == 6 for t in truths)
        served_by = set()
        for base in cal.own_urls:  # the kernel spread the connections: more than one process served some
            import json
            import urllib.request
            with urllib.request.urlopen(f"{base}/calibration/summary", timeout=5) as r:
                if json.loads(r.read())["requests"]:
                    served_by.add(base)
        assert len(served_by) >= 2
        summary = cal.summary()
        assert summary["requests"] == 30 and summary["tokens"] == 180 and summary["itl_samples"] == 150
        assert summary["processes"] == 3 and summary["late_ms_p99"] is not None
    assert all(p.poll() is not None for p in cal.procs)  # every process stopped


def _level(**kw) -> SelftestLevel:
    base = dict(streams=64, target_events_s=12800, events_s=12000, tokens_s=12000, requests_s=120,
                error_ms_p50=0.1, error_ms_p99=2.5, error_ms_max=9, failed=0, within_tolerance=False)
    return SelftestLevel(**(base | kw))


def test_selftest_says_which_side_was_the_limit() -> None:
    assert which_limit(_level(server_late_ms_p99=0.2, server_cpu_cores=0.3), 1.0, 1)[0] == "client"
    side, why = which_limit(_level(server_late_ms_p99=4.0, server_cpu_cores=0.3), 1.0, 1)
    assert side == "server" and "4.00 ms late" in why
    side, why = which_limit(_level(server_late_ms_p99=0.5, server_cpu_cores=1.9), 1.0, 2)
    assert side == "server" and "2 process(es) used 1.90 cores" in why
    assert which_limit(_level(server_late_ms_p99=0.5, server_cpu_cores=0.95), 1.0, 2)[0] == "client"
