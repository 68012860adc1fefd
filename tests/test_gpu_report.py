"""What the GPUs did, in the HTML report: each run's power and SM activity over time per GPU with its levels
marked (from its GPU series, downsampled), tokens per joule against concurrency, a table per level, and one line
when nothing was measured; rendered in headless Chromium as tests/test_report.py does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpu_runs import readings, with_gpu, without_gpu, write_series
from servelab.compare.compare import compare_runs
from servelab.compare.sources import from_summary
from servelab.host.gpu_telemetry.sampler import SERIES_FILE
from servelab.records import GpuReading
from servelab.report.gpu_charts import MAX_SERIES_POINTS, downsample, level_bounds
from servelab.report.html import render_report, write_report
from synthetic_runs import synthetic_run
from test_report import _browser, _chromium


def _gpu_run(tmp_path: Path, run_id: str, *, power_w: float, seed: int, series: bool = True):
    summary, records = synthetic_run(run_id, seed=seed, trials=2)
    for trial in summary.trials:
        for level in trial.levels:
            with_gpu(level, gpus=2, power_w=power_w)
    run_dir = tmp_path / run_id
    run_dir.mkdir(parents=True)
    if series:  # readings over the whole run, on the records' clock
        start = min(r.t_send_ns for r in records)
        span_s = (max(r.t_end_ns for r in records) - start) / 1e9
        write_series(run_dir / SERIES_FILE, readings(span_s, gpus=2, power_w=power_w, start_ns=start))
    return from_summary(summary, records, run_id, run_id, run_dir=run_dir)


def _no_gpu_run(run_id: str):
    summary, records = synthetic_run(run_id, seed=5, trials=2)
    for trial in summary.trials:
        for level in trial.levels:
            without_gpu(level)
    return from_summary(summary, records, run_id, run_id)


def test_downsample_keeps_each_buckets_mean_and_bounds_the_points() -> None:
    # power alternates 100 / 300 W tick by tick: every bucket of two or more ticks averages to 200 W
    series = [GpuReading(t_ns=k * 250_000_000, gpu=0, power_w=100.0 if k % 2 else 300.0, sm_active_pct=50.0)
              for k in range(4000)]
    out = downsample(series, 0, series[-1].t_ns, points=100)
    assert len(out[0]["t"]) == 100
    assert all(p == pytest.approx(200.0) for p in out[0]["power"]) and set(out[0]["sm"]) == {50.0}
    assert out[0]["t"][0] == pytest.approx(series[-1].t_ns / 1e9 / 100 / 2)


def test_level_bounds_come_from_the_records_on_the_series_clock(tmp_path: Path) -> None:
    run = _gpu_run(tmp_path, "bounds", power_w=300.0, seed=1, series=False)
    t0 = min(r.t_send_ns for r in run.records)
    bounds = level_bounds(run, t0)
    assert bounds[0][0] == "t1 single" and bounds[0][1] == 0.0
    assert [b[0] for b in bounds if b[0].startswith("t1")] == ["t1 single", "t1 c1", "t1 c2", "t1 c4"]
    assert all(a < b for _, a, b in bounds)


def test_the_report_draws_the_gpus_and_says_when_they_were_not_measured(tmp_path: Path) -> None:
    chromium = _chromium()
    runs = [_gpu_run(tmp_path, "h200-a", power_w=300.0, seed=1), _gpu_run(tmp_path, "h200-b", power_w=450.0, seed=2),
            _no_gpu_run("cpu-only")]
    page = render_report(runs, compare_runs(runs))
    for chart in ("tokens-per-joule", "gpu-power-0", "gpu-sm-0", "gpu-power-1", "gpu-sm-1"):
        assert f'id="chart-{chart}"' in page
    assert 'id="chart-gpu-power-2"' not in page  # no series for the run without GPUs
    assert page.count('id="gpu-not-measured"') == 1 and "GPU: not measured: no GPU telemetry source" in page
    assert "J/token (output)" in page
    report = write_report(runs, compare_runs(runs), tmp_path / "report.html")
    dom = _browser(chromium, tmp_path, "--dump-dom", report.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    ids = re.findall(r'id="chart-([a-z0-9-]+)"', html)
    for chart in ("tokens-per-joule", "gpu-power-0", "gpu-sm-0", "gpu-power-1"):
        start = html.index(f'id="chart-{chart}"')
        following = ids[ids.index(chart) + 1] if ids.index(chart) + 1 < len(ids) else None
        part = html[start:html.index(f'id="chart-{following}"') if following else len(html)]
        assert 'class="main-svg"' in part, f"chart {chart} has no SVG"
        assert re.search(r'class="trace[ "]', part) and re.search(r' d="M[0-9]', part), f"chart {chart} is empty"
        if chart.startswith("gpu-"):
            assert ">t1 c4<" in part and ">t2 single<" in part  # the levels' boundaries, labelled
            assert "GPU 0" in part and "GPU 1" in part
    assert f"at most {MAX_SERIES_POINTS} points per GPU" in html
