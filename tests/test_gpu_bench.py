"""`servelab bench` against the real embedded engine, end to end, for what the GPUs did: on this machine (no GPU)
one "not measured: no GPU telemetry source" line; with the NVML double first on the bench process's sys.path (as
the GPU telemetry tests select it, replaying a recorded H200 x8 series on the process's own clock), J/token,
tokens/J, power and SM activity per level in the terminal, summary.json, the series file and the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_doubles import DOUBLES, NVML_SERIES
from servelab.host.gpu_telemetry.sampler import SERIES_FILE, iter_readings
from servelab.records import BenchResult
from servelab.store.db import Store

pytestmark = pytest.mark.engine

# The bench process with the double as `pynvml`, loaded on time.perf_counter_ns, the clock every time of a run is
# read on; then servelab's own command line.
WITH_DOUBLE = textwrap.dedent(f"""
    import sys, time
    sys.path.insert(0, {str(DOUBLES)!r})
    import pynvml
    pynvml._double_load({str(NVML_SERIES)!r}, time.perf_counter_ns)
    from servelab.cli import main
    sys.argv = ["servelab", *sys.argv[1:]]
    main()
""")

WITHOUT = "import sys\nfrom servelab.cli import main\nsys.argv = ['servelab', *sys.argv[1:]]\nmain()\n"


def _bench(url: str, out: Path, *extra: str, double: bool) -> subprocess.CompletedProcess:
    args = ["bench", url, "--mode", "single", "--requests", "4", "--max-tokens", "16", "--warmup", "0",
            "--out", str(out), "--store", str(out / "store.db"), *extra]
    command = [sys.executable, "-c", WITH_DOUBLE if double else WITHOUT, *args]
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)


def _result(out: Path) -> tuple[Path, BenchResult]:
    (run_dir,) = [p for p in out.rglob("summary.json")]
    return run_dir.parent, BenchResult.model_validate_json(run_dir.read_text())


def test_without_a_gpu_every_level_says_so_in_one_line(embedded_server, tmp_path: Path) -> None:
    proc = _bench(embedded_server["url"], tmp_path, double=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if "GPU" in line]
    assert len(lines) == 1 and lines[0].startswith("  GPU: not measured: no GPU telemetry source"), proc.stdout
    assert "J/token" not in proc.stdout
    _, result = _result(tmp_path)
    for level in result.levels:
        assert level.gpu is not None and not level.gpu.measured
        assert level.gpu.reason.startswith("no GPU telemetry source")
        assert level.figures["j_per_output_token"].value is None
        assert level.figures["j_per_output_token"].note.startswith("not measured: no GPU telemetry source")
    assert result.workload["gpu_telemetry"]["source"] is None


def test_with_nvml_a_bench_shows_and_keeps_energy_per_token(embedded_server, tmp_path: Path) -> None:
    proc = _bench(embedded_server["url"], tmp_path, double=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir, result = _result(tmp_path)
    (level,) = result.levels
    gpu = level.gpu
    assert gpu.measured and gpu.source == "nvml" and len(gpu.gpus) == 8, gpu
    assert gpu.energy_j > 0 and gpu.output_tokens > 0
    tokens = level.figures["output_tok_s"].value * level.window_s
    assert gpu.output_tokens == pytest.approx(tokens, abs=0.5)  # the tokens output tok/s counts
    assert gpu.j_per_output_token == pytest.approx(gpu.energy_j / gpu.output_tokens)
    # J/token x output tok/s is the mean summed power, as docs/metrics.md#gpu-j-per-token says
    assert gpu.j_per_output_token * level.figures["output_tok_s"].value == pytest.approx(gpu.power_w_mean)
    for key in ("j_per_output_token", "output_tokens_per_j", "gpu_power_w_mean"):
        assert level.figures[key].value is not None and level.figures[key].value > 0
    assert level.figures["gpu_sm_active_pct_mean"].value is not None  # the recording's first seconds: idle GPUs
    assert result.workload["gpu_telemetry"]["source"] == "nvml"
    readings = list(iter_readings(run_dir / SERIES_FILE))
    assert {r.gpu for r in readings} == set(range(8)) and len(readings) >= 8 * 2  # 4 Hz, beyond both edges
    table = proc.stdout[proc.stdout.index("GPUs (the engine's"):]
    row = next(line for line in table.splitlines() if line.startswith("│ single"))
    assert f"{gpu.power_w_mean:,.0f}" in row
    assert "per GPU (NVIDIA H200" in proc.stdout
    assert "not measured" not in table.split("per GPU")[0]
    stored = json.loads((run_dir / "summary.json").read_text())["levels"][0]["gpu"]
    assert stored["j_per_output_token"] == gpu.j_per_output_token
    with Store.open(tmp_path / "store.db", readonly=True) as store:  # and the store's columns (migration 6)
        row = store.db.execute("SELECT gpu_measured, gpu_j_per_output_token FROM levels").fetchone()
    assert tuple(row) == (1, pytest.approx(gpu.j_per_output_token))
