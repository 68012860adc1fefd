"""Exports of a run: per-request records and per-level summaries, as JSON or CSV (columns: docs/output.md).

- JSON is lossless: `records.json` is the list of RequestRecords exactly as in records.jsonl (events included),
  `levels.json` the list of level Summaries, so either can be validated back into the same models.
- CSV is for spreadsheets and pandas: `records.csv` has one row per request with its derived per-request
  quantities (TTFT, E2E, … computed by bench/metrics.py, the same functions the figures use), `levels.csv` one
  row per level with each figure's value and distribution statistics (the GPU figures among them). The column
  sets are fixed, so files from different runs line up; a quantity a row does not have is an empty cell.
- What the GPUs did (docs/metrics.md#gpu), where a level measured it: `gpus.csv` has one row per level and GPU
  (Summary.gpu.gpus), and `gpu_series.csv` the run directory's GPU time series (host/gpu_telemetry/sampler.py),
  one row per reading, streamed from the series files (never held whole). In JSON, `levels.json` carries each
  level's `gpu` whole and `gpu_series.json` the readings.
- Parquet (store/export_parquet.py) writes the CSV export's files as `.parquet`, the same rows and columns typed.

Works on any run directory, including an interrupted one (summary.json says so; a torn last line of
records.jsonl is skipped) and one without summary.json (a run killed before it was written: records only).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from servelab.errors import UserError
from servelab.records import RequestRecord, Summary
# The columns and rows (store/export_layout.py), imported here too by callers of the export
from servelab.store.export_layout import (GPU_COLUMNS, LEVEL_COLUMNS, LEVEL_ENVIRONMENT, LEVEL_GPU,  # noqa: F401
                                          RECORD_COLUMNS, STATS, gpu_rows, gpu_series_columns, iter_series,
                                          level_row, record_row, series_of, series_row)
from servelab.store.files import ensure_output_dir, output_file, write_output
from servelab.store.rundir import RecordsFile, records_file
from servelab.textsafe import visible

# vllm: one vllm-bench-serve-shaped JSON per level (store/export_vllm.py); parquet: the CSV export's files, typed,
# for pandas, DuckDB, Spark (store/export_parquet.py; needs pyarrow, the `parquet` extra)
FORMATS = ("csv", "json", "vllm", "parquet")

# ---------------------------------------------------------------------------------------------------------------
# One function per format
# ---------------------------------------------------------------------------------------------------------------

def export_csv(records: Iterable[RequestRecord], levels: Sequence[Summary], out_dir: Path,
               series: Sequence[Path] = ()) -> list[Path]:
    """records.csv and levels.csv in `out_dir`; gpus.csv when a level measured its GPUs, gpu_series.csv when the
    run has a GPU series file (`series`)."""
    ensure_output_dir(out_dir, "export directory")
    paths = [out_dir / "records.csv", out_dir / "levels.csv"]
    _write_csv(paths[0], RECORD_COLUMNS, (record_row(r) for r in records))
    _write_csv(paths[1], LEVEL_COLUMNS, (level_row(s) for s in levels))
    if any(s.gpu is not None and s.gpu.measured for s in levels):
        paths.append(out_dir / "gpus.csv")
        _write_csv(paths[-1], GPU_COLUMNS, (row for s in levels for row in gpu_rows(s)))
    if series:
        paths.append(out_dir / "gpu_series.csv")
        _write_csv(paths[-1], gpu_series_columns(), (series_row(r) for r in iter_series(series)))
    return paths


def export_json(records: Iterable[RequestRecord], levels: Sequence[Summary], out_dir: Path,
                series: Sequence[Path] = ()) -> list[Path]:
    """records.json and levels.json in `out_dir`: the models' own JSON, lists of them (each level's `gpu`
    whole); gpu_series.json, the GPU readings, when the run has a GPU series file (`series`)."""
    ensure_output_dir(out_dir, "export directory")
    paths = [out_dir / "records.json", out_dir / "levels.json"]
    _write_json_list(paths[0], (r.model_dump_json() for r in records))
    _write_text(paths[1], "[" + ",\n".join(s.model_dump_json(indent=2) for s in levels) + "]\n")
    if series:
        paths.append(out_dir / "gpu_series.json")
        _write_json_list(paths[-1], (r.model_dump_json() for r in iter_series(series)))
    return paths


def _write_json_list(path: Path, items: Iterable[str]) -> None:
    """A JSON list written as its items are read: a soak's records (or readings) never all in memory."""
    with output_file(path, "export file") as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write("[")
        for i, item in enumerate(items):
            fh.write((",\n" if i else "") + item)
        fh.write("]\n")


# ---------------------------------------------------------------------------------------------------------------
# From a run directory
# ---------------------------------------------------------------------------------------------------------------

def load_run(run_dir: Path) -> tuple[RecordsFile, list[Summary], list[str]]:
    """(records, levels, notes) of a run directory written by `servelab run` or `servelab bench --out`; the
    records are read from the file one at a time, each time they are iterated. Unlike store/read.open_run_dir it
    reads a directory with no summary.json (a run killed before writing it) and takes the levels straight from
    the JSON, so a summary a model no longer validates still exports."""
    if not run_dir.is_dir():
        raise UserError(f"not a run directory: {run_dir}")
    records_path, summary_path = records_file(run_dir), run_dir / "summary.json"
    if records_path is None and not summary_path.exists():
        raise UserError(f"{run_dir} has neither records.jsonl.gz (or records.jsonl) nor summary.json: not a run "
                        f"directory")
    notes: list[str] = []
    records = RecordsFile(records_path)
    levels: list[Summary] = []
    if summary_path.exists():
        try:
            doc = json.loads(summary_path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise UserError(f"{summary_path}: not valid JSON ({exc})") from None
        levels = levels_of(doc, summary_path)
        if doc.get("interrupted") or doc.get("status") == "interrupted" or any(
                (doc.get(k) or {}).get("interrupted") for k in ("single", "sweep")) or any(
                b.get("interrupted") for t in doc.get("trials") or [] for b in _benches_of(t)):
            notes.append("the run was interrupted: its last level is partial")
    else:
        notes.append("no summary.json (the run ended before writing it): records only, no levels")
    return records, levels, notes


def levels_of(doc: dict[str, Any], where: Path) -> list[Summary]:
    """The level summaries of a BenchResult (`bench --out`) or a RunSummary (`run`: per trial, each step in order;
    a trial from before steps holds single and sweep, and a summary from before trials holds them directly)."""
    if "levels" in doc:
        raw = doc["levels"]
    else:
        holders = doc.get("trials") or [doc]
        raw = [lv for t in holders for bench in _benches_of(t) for lv in bench.get("levels", [])]
    try:
        return [Summary.model_validate(lv) for lv in raw]
    except ValueError as exc:
        raise UserError(f"{where}: a level does not have the expected shape: {str(exc).splitlines()[0]}") from None


def _benches_of(trial: dict[str, Any]) -> list[dict[str, Any]]:
    """A trial's benches in order, as summary.json holds them (steps, or before steps `single` and `sweep`)."""
    if trial.get("steps"):
        return [s["result"] for s in trial["steps"] if isinstance(s, dict) and s.get("result")]
    return [trial[key] for key in ("single", "sweep") if trial.get(key)]


def export_run_dir(run_dir: Path, fmt: str, to: Path | None = None) -> tuple[list[Path], list[str]]:
    """Write the exports of `run_dir` (into `to`, default the run directory). Returns (paths, notes)."""
    if fmt not in FORMATS:
        raise UserError(f"unknown export format '{fmt}'", hint=f"use one of {', '.join(FORMATS)}")
    records, levels, notes = load_run(run_dir)
    write = _writer(fmt, _model_of(run_dir), series_of(run_dir))
    return write(records, levels, to or run_dir), notes


def export_run(ref: str, fmt: str, to: Path | None, store_path: Path) -> tuple[list[Path], list[str]]:
    """Like export_run_dir, for a run directory or a run id in the store (written into `to`, else the run's
    directory when it still exists, else ./<run id>)."""
    if Path(ref).is_dir():
        return export_run_dir(Path(ref), fmt, to)
    from servelab.store.read import open_run

    if Path(store_path).exists() and fmt not in FORMATS:  # checked after "no store", before the look-up
        raise UserError(f"unknown export format '{fmt}'", hint=f"use one of {', '.join(FORMATS)}")
    opened = open_run(ref, store_path=Path(store_path), unknown_hint=None)
    summary, records, run_id = opened.summary, opened.records, opened.ref
    levels = [lv for trial in summary.trials for lv in trial.levels]
    notes = ["the run was interrupted: its last level is partial"] if summary.status == "interrupted" else []
    if opened.records_missing:
        notes.append(opened.records_missing)
    run_dir = opened.run_dir
    target = to or (run_dir if run_dir and run_dir.is_dir() else Path(run_id))
    series = series_of(run_dir)
    write = _writer(fmt, summary.provenance.model or "", series)
    return write(records, levels, target), notes


def _writer(fmt: str, model: str, series: Sequence[Path] = ()):
    if fmt == "vllm":
        from servelab.store.export_vllm import export_vllm

        # one pass over the records per level: held in memory for this format
        return lambda records, levels, out_dir: export_vllm(list(records), levels, out_dir, model=model)
    if fmt == "parquet":
        from servelab.store.export_parquet import export_parquet, require_pyarrow

        require_pyarrow()  # before anything is written: without pyarrow, one line saying how to install it
        return lambda records, levels, out_dir: export_parquet(records, levels, out_dir, series)
    write = export_csv if fmt == "csv" else export_json
    return lambda records, levels, out_dir: write(records, levels, out_dir, series)


def _model_of(run_dir: Path) -> str:
    """The model a run directory's summary names (BenchResult.model, or RunSummary.provenance.model)."""
    try:
        doc = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        return str(doc.get("model") or (doc.get("provenance") or {}).get("model") or "")
    except (OSError, ValueError, AttributeError):
        return ""


def _write_csv(path: Path, columns: list[str], rows) -> None:
    with output_file(path, "export file") as tmp, open(tmp, "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="raise")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(v) for k, v in row.items()})


def _write_text(path: Path, text: str) -> None:
    write_output(path, text, "export file")


def _cell(value: Any) -> Any:
    """None -> empty cell; floats with repr precision, so a CSV read back gives the same number."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return visible(value)  # a server's text with its control characters shown, never raw (textsafe.py)
    return value
