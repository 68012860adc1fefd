"""The columns and rows of a run's exports, shared by every format that writes them as a table: the CSV export
(store/export.py) and the Parquet one (store/export_parquet.py) lay out the same columns, in the same order, from
the same rows. Scripts index columns, so a column added later is appended and no column ever moves."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from servelab.bench import metrics
from servelab.bench.figures import GPU_FIGURES, LEVEL_FIGURES
from servelab.bench.request_figures import tool_call_ns, tool_first_ns
from servelab.host.gpu_telemetry.sampler import SERIES_FILE as GPU_SERIES_FILE
from servelab.records import RequestRecord, Summary

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
    # chat with images: the images a request carried and their pixels, summed (empty for other workloads)
    "images", "image_pixels",
    # tool calls and structured output (docs/metrics.md#tool-calls, #structured-output; empty where not declared):
    # calls made, send to the first tool_calls piece and to the finish that completed them, the verdicts
    "tool_calls", "tool_first_ms", "tool_call_ms", "tool_calls_parse", "tool_calls_valid", "tool_problem",
    "schema_valid", "schema_problem",
    # non-streamed requests (embeddings, rerank; docs/metrics.md#non-streamed): stream false, and the inputs or
    # documents the request carried (empty for streams)
    "stream", "items",
    # chat with images: each image's WxH as sent, comma-separated (after the other image columns were out)
    "image_sizes",
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
        "conversation": r.conversation, "turn": r.turn, "images": r.images, "image_pixels": r.image_pixels,
        "tool_calls": len(r.tool_calls) if r.tool_calls is not None else None,
        "tool_first_ms": _ms(tool_first_ns(r)), "tool_call_ms": _ms(tool_call_ns(r)),
        "tool_calls_parse": r.tool_calls_parse, "tool_calls_valid": r.tool_calls_valid,
        "tool_problem": r.tool_problem, "schema_valid": r.schema_valid, "schema_problem": r.schema_problem,
        "stream": r.stream, "items": r.items, "image_sizes": r.image_sizes,
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


def _ms(ns: int | None) -> float | None:
    return ns / metrics.NS_PER_MS if ns is not None else None
