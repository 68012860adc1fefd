"""Exports: CSV and JSON of records and levels round-trip, work on an interrupted run directory (Ctrl-C) and on
one without summary.json, and the CLI writes them (`bench --csv`, `servelab export`)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servelab.bench.options import BenchArgs, build_options
from servelab.bench.steady import SteadyRule
from servelab.bench.runner import bench
from servelab.calibration import Script, start_calibration_server
from servelab.errors import UserError
from servelab.records import RequestRecord, Summary
from servelab.store.export import (LEVEL_COLUMNS, RECORD_COLUMNS, export_csv, export_json, export_run_dir,
                                   level_row, record_row)
from servelab.store.rundir import RunDir, read_records

SERVELAB = [sys.executable, "-m", "servelab.cli"]


@pytest.fixture(scope="module")
def cal():
    with start_calibration_server(Script(ttft_ms=5, itl_ms=2, output_tokens=6)) as handle:
        yield handle


@pytest.fixture(scope="module")
def measured(cal):
    """A small rate run with targets (so goodput columns are filled) and one failed request."""
    records: list[RequestRecord] = []
    opts = build_options(BenchArgs(mode="rate-sweep", rate="40,80", requests=6, warmup=1,
                                   slo="ttft_p99_ms=500"))
    # Six requests a level are too few for the steady-state rule; this test is about the columns, so every
    # level with a completed request counts as measured (the rule itself: test_steady_state.py).
    opts.steady = SteadyRule(min_completed=1, latency_multiple=0.0)
    result = bench(cal.url, opts, on_record=records.append)
    return records, result


def cell(text: str):
    """What a CSV reader gets back, typed the way the writer wrote it."""
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


def read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), [{k: cell(v) for k, v in row.items()} for row in reader]


def test_csv_round_trips_every_column(measured, tmp_path: Path) -> None:
    records, result = measured
    paths = export_csv(records, result.levels, tmp_path)
    header, rows = read_csv(paths[0])
    assert header == RECORD_COLUMNS and len(rows) == len(records) == 13  # warm-up rows included, marked
    for r, row in zip(records, rows):
        assert row == record_row(r)
    header, rows = read_csv(paths[1])
    assert header == LEVEL_COLUMNS and [row["tag"] for row in rows] == ["r40", "r80"]
    for s, row in zip(result.levels, rows):
        assert row == level_row(s)
    assert rows[0]["goodput_req_s"] > 0 and rows[0]["ttft_ms_p50"] == result.levels[0].figures["ttft_ms"].value
    assert rows[0]["rate"] == 40 and rows[0]["slo_passed"] is True and rows[0]["requests"] == 6


def test_json_round_trips_into_the_same_models(measured, tmp_path: Path) -> None:
    records, result = measured
    rec_path, lvl_path = export_json(records, result.levels, tmp_path)
    back = [RequestRecord.model_validate(x) for x in json.loads(rec_path.read_text())]
    assert [r.model_dump_json() for r in back] == [r.model_dump_json() for r in records]  # events as columns
    assert [Summary.model_validate(x) for x in json.loads(lvl_path.read_text())] == result.levels


def test_a_run_directory_without_summary_and_with_a_torn_line_still_exports(measured, tmp_path: Path) -> None:
    records, _ = measured
    run = RunDir(tmp_path / "killed")
    for r in records[:5]:
        run.append_record(r)
    # Killed mid-write: no gzip trailer, and the fifth record's compressed bytes cut short.
    size = run.records_path.stat().st_size
    os.truncate(run.records_path, size - 12)
    paths, notes = export_run_dir(run.path, "csv")
    assert len(read_csv(paths[0])[1]) == 4 and read_csv(paths[1])[1] == []
    assert any("no summary.json" in n for n in notes)


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*SERVELAB, *args], capture_output=True, text=True, timeout=timeout)


def test_bench_out_csv_then_ctrl_c_leaves_a_readable_exportable_run(cal, tmp_path: Path) -> None:
    proc = subprocess.Popen([*SERVELAB, "bench", cal.url, "--mode", "rate", "--rate", "20", "--duration", "60",
                             "--out", str(tmp_path), "--csv", "--slo", "ttft_p99_ms=500"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = list(tmp_path.glob("*/records.jsonl.gz"))
            if found and len(read_records(found[0])) >= 6:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the bench never started")
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, proc.stderr
    run = found[0].parent
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["mode"] == "rate"
    (level,) = summary["levels"]
    assert level["mode"] == "rate" and level["ok"] >= 5 and "goodput_req_s" in level["figures"]
    assert any("interrupted" in w for w in level["warnings"])
    kept = read_records(run / "records.jsonl.gz")
    _, rows = read_csv(run / "records.csv")  # written by --csv on the way out
    assert len(rows) == len(kept)
    # The standalone export reads the same directory back.
    out = run_cli("export", str(run), "--format", "json", "--to", str(tmp_path / "json"))
    assert out.returncode == 0, out.stderr
    assert "interrupted" in out.stderr
    assert len(json.loads((tmp_path / "json" / "records.json").read_text())) == len(kept)
    (lv,) = json.loads((tmp_path / "json" / "levels.json").read_text())
    assert lv["tag"] == "r20" and lv["requests"] == level["requests"]


def test_export_and_csv_errors_are_one_line(tmp_path: Path) -> None:
    no_store = str(tmp_path / "no-store.db")  # whatever store the working directory has, this test uses none
    for args, needle in ((("export", str(tmp_path), "--store", no_store), "not a run directory"),
                         (("bench", "http://127.0.0.1:1", "--csv"), "--csv writes next to")):
        proc = run_cli(*args)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
    with pytest.raises(UserError, match="not a run directory"):
        export_run_dir(tmp_path / "nope", "csv")
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(UserError, match="unknown export format"):
        export_run_dir(tmp_path, "xml")
    with pytest.raises(UserError, match="dataset file not found"):
        build_options(BenchArgs(mode="rate", rate="2", dataset=tmp_path / "none.jsonl"))
