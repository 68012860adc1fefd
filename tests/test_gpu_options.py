"""`servelab bench --gpu-metrics URL` and `--no-gpu` against the calibration server on loopback: the DCGM exporter
named (a real HTTP server serving dcgm-exporter's format, tests/fixtures/dcgm) is the source where NVML is not
there; --no-gpu says so in one line; a URL that is not one is a one-line error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_doubles import ScrapeServer, fresh_dcgm_bodies
from servelab.calibration import Script, start_calibration_server
from servelab.records import BenchResult

SERVELAB = [sys.executable, "-c", "import sys\nfrom servelab.cli import main\nsys.argv = ['servelab', "
                                  "*sys.argv[1:]]\nmain()\n"]


@pytest.fixture(scope="module")
def server():
    with start_calibration_server(Script(ttft_ms=5, itl_ms=5, output_tokens=16)) as handle:
        yield handle


def _bench(url: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SERVELAB, "bench", url, "--mode", "concurrency", "--concurrency", "2", "--duration", "1",
                           "--warmup", "0", "--out", str(out), *extra], capture_output=True, text=True, timeout=120)


def _result(out: Path) -> BenchResult:
    (path,) = out.glob("*/summary.json")
    return BenchResult.model_validate_json(path.read_text())


def test_a_dcgm_exporter_named_with_gpu_metrics_is_the_source(server, tmp_path: Path) -> None:
    exporter = ScrapeServer(fresh_dcgm_bodies())
    try:
        proc = _bench(server.url, tmp_path, "--gpu-metrics", exporter.url)
    finally:
        exporter.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = _result(tmp_path)
    (level,) = result.levels
    if result.workload["gpu_telemetry"]["source"] == "nvml":  # a machine with an NVIDIA GPU answers first
        pytest.skip("NVML answered before the DCGM exporter")
    assert level.gpu.measured and level.gpu.source == f"dcgm {exporter.url}"
    # an exporter refreshing at every scrape: its counters advance, its gauges are read
    assert len(level.gpu.gpus) == 8 and level.gpu.power_w_mean is not None
    assert all(g.mem_used_bytes_max > 0 and g.sm_source for g in level.gpu.gpus)
    assert exporter.hits >= 4  # scraped through the level, not once
    assert "GPUs (the engine's, summed; dcgm " in proc.stdout


def test_no_gpu_turns_it_off_in_one_line(server, tmp_path: Path) -> None:
    proc = _bench(server.url, tmp_path, "--no-gpu")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line for line in proc.stdout.splitlines() if "GPU" in line] == \
        ["  GPU: not measured: turned off (--no-gpu)"]
    assert _result(tmp_path).workload["gpu_telemetry"] == {"source": None, "why_none": "turned off (--no-gpu)"}
    assert not list(tmp_path.glob("*/gpu_series*"))


def test_a_gpu_metrics_value_that_is_no_url_is_one_line(server, tmp_path: Path) -> None:
    proc = _bench(server.url, tmp_path, "--gpu-metrics", "localhost:9400")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "bad --gpu-metrics 'localhost:9400'" in proc.stderr
    assert json.dumps(proc.stderr).count("\\n") <= 3


def test_more_than_one_gpu_metrics_url_is_refused_in_one_line() -> None:
    from servelab.bench.options import check_gpu_metrics
    from servelab.errors import UserError

    one = "http://127.0.0.1:9400/metrics"
    assert check_gpu_metrics([one, one]) == [one]
    with pytest.raises(UserError) as refused:
        check_gpu_metrics([one, "http://127.0.0.1:9401/metrics"])
    assert str(refused.value).startswith("--gpu-metrics given 2 URLs: a bench reads one DCGM exporter")
