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

from servelab.bench import metrics
from servelab.bench.figures import GPU_FIGURES, LEVEL_FIGURES
from servelab.errors import UserError
from servelab.host.gpu_telemetry.sampler import SERIES_FILE as GPU_SERIES_FILE
from servelab.records import RequestRecord, Summary
from servelab.store.files import ensure_output_dir, output_file, write_output
from servelab.store.rundir import RecordsFile, records_file
from servelab.textsafe import visible

# vllm: one vllm-bench-serve-shaped JSON per level (store/export_vllm.py); parquet: the CSV export's files, typed,
# for pandas, DuckDB, Spark (store/export_parquet.py; needs pyarrow, the `parquet` extra)
FORMATS = ("csv", "json", "vllm", "parquet")

RECORD_COLUMNS = [
    "index", "trial", "tag", "warmup", "endpoint", "ok", "error_kind", "http_status", "error_detail",
    "input_tokens", "prompt_tokens", "max_tokens", "output_tokens", "completion_tokens", "reasoning_tokens",
    "cached_tokens", "count_method", "finish_reason", "saw_done", "chunks",
    "temperature", "ignore_eos", "min_tokens",
    "scheduled_ns", "t_send_ns", "t_headers_ns", "t_end_ns",
    "client_lag_ms", "ttft_ms", "ttfo_ms", "e2e_ms", "tpot_ms", "decode_tok_s", "itl_p50_ms", "itl_max_ms",
    # Added later, so appended (scripts index columns): answer tokens beside reasoning_tokens, the server's own
    # reasoning count, and the request's conversation and turn (multi-turn workloads; empty elsewhere).
    "answer_tokens", "usage_reasoning_tokens", "conversation", "turn",
]

STATS = ["n", "mean", "min", "p50", "p90", "p95", "p99", "max"]
# The figures with columns, in the order bench/figures.py places them (their `csv`).
_CSV_FIGURES = sorted((f for f in LEVEL_FIGURES + GPU_FIGURES if f.csv is not None), key=lambda f: f.csv.position)
# The environment columns were appended after the figures levels.csv had then (positions up to this one); figures
# added since come after them, so no column ever moves.
_FIGURES_BEFORE_ENVIRONMENT = 13
# Likewise the GPU summary's columns after the GPU figures (positions up to this one).
_FIGURES_BEFORE_GPU = 27
# What the GPUs did during the level beside its GPU figures (Summary.gpu): empty for a level without `gpu`;
# gpu_measured false with gpu_reason when there was no telemetry.
LEVEL_GPU = ["gpu_measured", "gpu_reason", "gpu_source", "gpu_energy_j", "gpu_power_w_max", "gpu_contended",
             "gpu_count"]
# One row per level and GPU (gpus.csv): GpuDeviceSummary's fields after the level's trial and tag.
GPU_COLUMNS = ["trial", "tag", "gpu", "uuid", "name", "engine", "samples", "energy_j", "energy_from",
               "power_w_mean", "power_w_max", "sm_active_pct_mean", "sm_source", "mem_used_bytes_mean",
               "mem_used_bytes_max", "idle_share", "throttle_s", "temp_c_max", "xid_errors", "other_pids"]
# The GPU time series (gpu_series.csv): one row per reading, GpuReading's fields.
# The run directory's GPU series is host/gpu_telemetry/sampler.py's SERIES_FILE.
# What the machine did during the level (Summary.environment; docs/metrics.md#environment), empty when not sampled.
LEVEL_ENVIRONMENT = ["other_cpu_cores_mean", "client_cpu_cores_mean", "engine_cpu_cores_mean", "load1_mean",
                     "steal_pct"]


def _figure_columns(figures) -> list[str]:
    """A figure's value (`output_tok_s`), or one column per statistic of its distribution (`ttft_ms_p50`). A cell is
    empty when a level does not have the figure (no request reported cached tokens, a summary written before the
    figure existed)."""
    return [column for f in figures
            for column in ([f"{f.key}_{stat}" for stat in STATS] if f.csv.stats else [f.key])]


LEVEL_COLUMNS = (["trial", "tag", "mode", "concurrency", "rate", "requests", "ok", "failed", "cancelled",
                  "errors", "window_s", "counted_by", "slo_passed"]
                 + _figure_columns(f for f in _CSV_FIGURES if f.csv.position <= _FIGURES_BEFORE_ENVIRONMENT)
                 + ["contended"] + LEVEL_ENVIRONMENT + ["warnings"]
                 + _figure_columns(f for f in _CSV_FIGURES
                                   if _FIGURES_BEFORE_ENVIRONMENT < f.csv.position <= _FIGURES_BEFORE_GPU)
                 + LEVEL_GPU
                 + _figure_columns(f for f in _CSV_FIGURES if f.csv.position > _FIGURES_BEFORE_GPU))


# ---------------------------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------------------------

def record_row(r: RequestRecord) -> dict[str, Any]:
    usage = r.usage
    gaps = sorted(metrics.token_gaps_ms(r))
    return {
        "index": r.index, "trial": r.trial, "tag": r.tag, "warmup": r.warmup, "endpoint": r.endpoint, "ok": r.ok,
        "error_kind": r.error_kind, "http_status": r.http_status, "error_detail": r.error_detail,
        "input_tokens": r.input_tokens, "prompt_tokens": usage.prompt_tokens if usage else None,
        "max_tokens": r.max_tokens, "output_tokens": r.output_tokens,
        "completion_tokens": usage.completion_tokens if usage else None, "reasoning_tokens": r.reasoning_tokens,
        "cached_tokens": usage.cached_tokens if usage else None, "count_method": r.count_method,
        "finish_reason": r.finish_reason, "saw_done": r.saw_done, "chunks": r.chunks,
        "temperature": r.sampling.get("temperature"), "ignore_eos": r.sampling.get("ignore_eos"),
        "min_tokens": r.sampling.get("min_tokens"),
        "scheduled_ns": r.scheduled_ns, "t_send_ns": r.t_send_ns, "t_headers_ns": r.t_headers_ns,
        "t_end_ns": r.t_end_ns,
        "client_lag_ms": (r.t_send_ns - r.scheduled_ns) / metrics.NS_PER_MS if r.scheduled_ns is not None
        else None,
        "ttft_ms": _ms(metrics.ttft_ns(r)), "ttfo_ms": _ms(metrics.ttfo_ns(r)), "e2e_ms": _ms(metrics.e2e_ns(r)),
        "tpot_ms": metrics.tpot_ms(r), "decode_tok_s": metrics.decode_tok_s(r),
        "itl_p50_ms": metrics.percentile(gaps, 50) if gaps else None, "itl_max_ms": gaps[-1] if gaps else None,
        "answer_tokens": r.answer_tokens, "usage_reasoning_tokens": usage.reasoning_tokens if usage else None,
        "conversation": r.conversation, "turn": r.turn,
    }


def level_row(s: Summary) -> dict[str, Any]:
    row: dict[str, Any] = {
        "trial": s.trial, "tag": s.tag, "mode": s.mode, "concurrency": s.concurrency, "rate": s.rate,
        "requests": s.requests, "ok": s.ok, "failed": s.failed, "cancelled": s.cancelled,
        "errors": ";".join(f"{k}:{v}" for k, v in sorted(s.errors.items())) or None,
        "window_s": s.window_s, "counted_by": s.figures["output_tok_s"].counted_by if "output_tok_s" in s.figures
        else None, "slo_passed": s.slo["passed"] if s.slo else None, "warnings": " | ".join(s.warnings) or None}
    for spec in _CSV_FIGURES:
        fig = s.figures.get(spec.key)
        if not spec.csv.stats:
            row[spec.key] = fig.value if fig else None
            continue
        dist = fig.dist if fig else None
        for stat in STATS:
            row[f"{spec.key}_{stat}"] = getattr(dist, stat) if dist else None
    env = s.environment
    row["contended"] = env.contended if env else None
    for name in LEVEL_ENVIRONMENT:
        row[name] = getattr(env, name) if env else None
    gpu = s.gpu
    row.update({"gpu_measured": gpu.measured if gpu else None, "gpu_reason": gpu.reason if gpu else None,
                "gpu_source": gpu.source if gpu else None, "gpu_energy_j": gpu.energy_j if gpu else None,
                "gpu_power_w_max": gpu.power_w_max if gpu else None,
                "gpu_contended": gpu.contended if gpu and gpu.measured else None,
                "gpu_count": sum(1 for d in gpu.gpus if d.engine) if gpu and gpu.measured else None})
    return row


def gpu_rows(s: Summary) -> list[dict[str, Any]]:
    """The level's GPUs, one row each (gpus.csv); none when the level's GPUs were not measured."""
    if s.gpu is None or not s.gpu.measured:
        return []
    rows = []
    for d in s.gpu.gpus:
        row: dict[str, Any] = {"trial": s.trial, "tag": s.tag}
        row.update({k: getattr(d, k) for k in GPU_COLUMNS[2:] if k != "other_pids"})
        row["other_pids"] = " ".join(str(p) for p in d.other_pids) or None
        rows.append(row)
    return rows


def gpu_series_columns() -> list[str]:
    from servelab.records import GpuReading

    return [name for name in GpuReading.model_fields]


def series_row(reading) -> dict[str, Any]:
    row = reading.model_dump()
    row["processes"] = " ".join(str(p) for p in reading.processes) or None
    return row


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


def series_of(run_dir: Path | None) -> list[Path]:
    """The run directory's GPU series files, in the order they were written: `bench --out` writes one
    (gpu_series.jsonl.gz), `run` one per bench (gpu_series-<trial>-<step>.jsonl.gz, trial and step numbered)."""
    if run_dir is None or not run_dir.is_dir():
        return []
    stem = GPU_SERIES_FILE.removesuffix(".jsonl.gz")
    found = [p for p in run_dir.glob(f"{stem}*.jsonl.gz") if p.is_file()]
    return sorted(found, key=lambda p: (p.name != GPU_SERIES_FILE, p.stat().st_mtime_ns, p.name))


def iter_series(paths: Sequence[Path]):
    """Every reading of the series files, file after file, one at a time."""
    from servelab.host.gpu_telemetry.sampler import iter_readings

    for path in paths:
        yield from iter_readings(path)


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


def _ms(ns: int | None) -> float | None:
    return ns / metrics.NS_PER_MS if ns is not None else None
