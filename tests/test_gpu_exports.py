"""What the GPUs did, in the exports: the GPU figures and summary as columns of levels.csv, one row per level and
GPU in gpus.csv, the run directory's GPU time series as gpu_series.csv / .json, and levels.json with `gpu` whole."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gpu_runs import expected_j_per_token, readings, with_gpu, without_gpu, write_series
from servelab.host.gpu_telemetry.sampler import SERIES_FILE
from servelab.records import GpuReading, Summary
from servelab.store.export import GPU_COLUMNS, export_run_dir
from servelab.store.rundir import RunDir
from synthetic_runs import synthetic_run


def _read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _bench_dir(tmp_path: Path, *, measured: bool = True, series: bool = True) -> tuple[Path, list]:
    """A `bench --out` run directory: summary.json, records, and the GPU series when `series`."""
    summary, records = synthetic_run("gpu-export")
    bench = summary.trials[0].sweep
    for level in bench.levels:
        with_gpu(level, gpus=2, power_w=250.0) if measured else without_gpu(level)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(bench.model_dump_json(indent=2))
    rundir = RunDir(run_dir)
    for r in records:
        rundir.append_record(r)
    rundir.close()
    if series:
        write_series(run_dir / SERIES_FILE, readings(2.0, gpus=2, power_w=250.0))
    return run_dir, bench.levels


def test_levels_csv_and_gpus_csv_carry_the_gpu_figures(tmp_path: Path) -> None:
    run_dir, levels = _bench_dir(tmp_path)
    paths, _ = export_run_dir(run_dir, "csv", tmp_path / "out")
    assert [p.name for p in paths] == ["records.csv", "levels.csv", "gpus.csv", "gpu_series.csv"]
    rows = {r["tag"]: r for r in _read(tmp_path / "out" / "levels.csv")}
    for level in levels:
        row = rows[level.tag]
        j = expected_j_per_token(level, gpus=2, power_w=250.0)
        assert float(row["j_per_output_token"]) == pytest.approx(j)
        assert float(row["output_tokens_per_j"]) == pytest.approx(1 / j)
        assert float(row["gpu_power_w_mean"]) == pytest.approx(500.0)
        assert float(row["gpu_sm_active_pct_mean"]) == pytest.approx(80.0)
        assert float(row["gpu_energy_j"]) == pytest.approx(500.0 * level.window_s)
        assert row["gpu_measured"] == "True" and row["gpu_source"] == "nvml" and row["gpu_count"] == "2"
        assert row["j_per_answer_token"] == ""  # no reasoning counted apart: empty, never 0
    gpus = _read(tmp_path / "out" / "gpus.csv")
    assert list(gpus[0]) == GPU_COLUMNS
    assert [(r["tag"], r["gpu"]) for r in gpus] == [(lv.tag, str(g)) for lv in levels for g in (0, 1)]
    assert all(float(r["power_w_mean"]) == pytest.approx(250.0) and r["name"] == "NVIDIA H200" for r in gpus)


def test_the_gpu_series_exports_every_reading(tmp_path: Path) -> None:
    run_dir, _ = _bench_dir(tmp_path)
    expected = readings(2.0, gpus=2, power_w=250.0)
    export_run_dir(run_dir, "csv", tmp_path / "csv")
    rows = _read(tmp_path / "csv" / "gpu_series.csv")
    assert [(int(r["t_ns"]), int(r["gpu"])) for r in rows] == [(r.t_ns, r.gpu) for r in expected]
    assert [float(r["energy_mj"]) for r in rows] == pytest.approx([r.energy_mj for r in expected])
    assert rows[0]["xid_errors"] == ""  # a field the source did not give: empty, never 0
    export_run_dir(run_dir, "json", tmp_path / "json")
    back = [GpuReading.model_validate(d) for d in json.loads((tmp_path / "json" / "gpu_series.json").read_text())]
    assert back == expected
    levels = [Summary.model_validate(d) for d in json.loads((tmp_path / "json" / "levels.json").read_text())]
    assert all(lv.gpu is not None and lv.gpu.measured and len(lv.gpu.gpus) == 2 for lv in levels)


def test_a_run_without_gpu_telemetry_has_the_reason_and_no_gpu_files(tmp_path: Path) -> None:
    run_dir, levels = _bench_dir(tmp_path, measured=False, series=False)
    paths, _ = export_run_dir(run_dir, "csv", tmp_path / "out")
    assert [p.name for p in paths] == ["records.csv", "levels.csv"]
    for row in _read(tmp_path / "out" / "levels.csv"):
        assert row["gpu_measured"] == "False" and row["gpu_reason"] == "no GPU telemetry source"
        assert row["j_per_output_token"] == row["output_tokens_per_j"] == row["gpu_power_w_mean"] == ""
