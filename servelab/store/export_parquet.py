"""The Parquet export of a run (`servelab export RUN --format parquet`; docs/output.md#parquet-export).

The same files as the CSV export, with the same column names in the same order and the same cells (store/export.py
makes each row; this module only types and writes them), for pandas, DuckDB, Spark and Polars:

- `records.parquet`: one row per request, written in row groups of `BATCH_ROWS` as the records are read, so the
  records of a long run are never all in memory (only one batch's columns, as Python lists, then as Arrow arrays);
- `levels.parquet`: one row per level, every figure column of levels.csv;
- `gpus.parquet`: one row per level and GPU, where a level measured its GPUs;
- `gpu_series.parquet`: the run's GPU readings, streamed from the series files like the records.

Each column has its own type (int64 counts and `perf_counter_ns` times, float64 ms and rates, bool, string), and
every column is nullable: a quantity a row does not have is null, as it is an empty CSV cell, never 0. A column with
a unit says it in the schema's field metadata: `unit` ("ms", "tok/s", "ns", …) and `definition`, the anchor of its
definition (`docs/metrics.md#ttft`).

pyarrow is an optional dependency (the `parquet` extra, ~40 MB): without it this format is a one-line error.
"""

from __future__ import annotations

import contextlib
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from servelab.bench.figures import GPU_FIGURES, LEVEL_FIGURES
from servelab.errors import UserError
from servelab.records import EnvironmentSummary, GpuDeviceSummary, GpuReading, RequestRecord, Summary
from servelab.store import export_layout as csv_layout
from servelab.store.files import ensure_output_dir, output_file
from servelab.textsafe import visible

# Rows per row group of records.parquet and gpu_series.parquet: big enough for columnar compression and fast scans,
# small enough that a batch's Python lists stay a few MB.
BATCH_ROWS = 4096

INSTALL_HINT = "pip install 'servelab[parquet]'"

INT, FLOAT, BOOL, STR = "int64", "float64", "bool_", "string"  # pyarrow's type factories

# ---------------------------------------------------------------------------------------------------------------
# Column types and units
# ---------------------------------------------------------------------------------------------------------------

RECORD_TYPES: dict[str, str] = {
    "index": INT, "trial": INT, "tag": STR, "warmup": BOOL, "endpoint": STR, "ok": BOOL, "error_kind": STR,
    "http_status": INT, "error_detail": STR, "input_tokens": INT, "prompt_tokens": INT, "max_tokens": INT,
    "output_tokens": INT, "completion_tokens": INT, "reasoning_tokens": INT, "cached_tokens": INT,
    "count_method": STR, "finish_reason": STR, "saw_done": BOOL, "chunks": INT,
    "temperature": FLOAT, "ignore_eos": BOOL, "min_tokens": INT,
    "scheduled_ns": INT, "t_send_ns": INT, "t_headers_ns": INT, "t_end_ns": INT,
    "client_lag_ms": FLOAT, "ttft_ms": FLOAT, "ttfo_ms": FLOAT, "e2e_ms": FLOAT, "tpot_ms": FLOAT,
    "decode_tok_s": FLOAT, "itl_p50_ms": FLOAT, "itl_max_ms": FLOAT,
    "answer_tokens": INT, "usage_reasoning_tokens": INT, "conversation": INT, "turn": INT,
    "images": INT, "image_pixels": INT,
    "tool_calls": INT, "tool_first_ms": FLOAT, "tool_call_ms": FLOAT, "tool_calls_parse": BOOL,
    "tool_calls_valid": BOOL, "tool_problem": STR, "schema_valid": BOOL, "schema_problem": STR,
    "stream": BOOL, "items": INT, "image_sizes": STR,
}

# (unit, anchor in docs/metrics.md or None) of the record columns that have a unit.
RECORD_UNITS: dict[str, tuple[str, str | None]] = {
    "input_tokens": ("tokens", None), "prompt_tokens": ("tokens", "cache-hit-ratio"), "max_tokens": ("tokens", None),
    "output_tokens": ("tokens", "output-tokens"), "completion_tokens": ("tokens", None),
    "reasoning_tokens": ("tokens", "reasoning-tokens"), "cached_tokens": ("tokens", "cached-tokens"),
    "chunks": ("chunks", None), "min_tokens": ("tokens", None),
    "scheduled_ns": ("ns", "clocks"), "t_send_ns": ("ns", "clocks"), "t_headers_ns": ("ns", "clocks"),
    "t_end_ns": ("ns", "clocks"),
    "client_lag_ms": ("ms", "client-lag"), "ttft_ms": ("ms", "ttft"), "ttfo_ms": ("ms", "ttfo"),
    "e2e_ms": ("ms", "e2e"), "tpot_ms": ("ms", "tpot"), "decode_tok_s": ("tok/s", "decode-tok-s"),
    "itl_p50_ms": ("ms", "itl"), "itl_max_ms": ("ms", "itl"),
    "answer_tokens": ("tokens", "answer-tokens"), "usage_reasoning_tokens": ("tokens", "reasoning"),
    "images": ("images", "images"), "image_pixels": ("pixels", "images"),
    "tool_first_ms": ("ms", "tool-first"), "tool_call_ms": ("ms", "tool-call"),
    "items": ("items", "items-s"),
}

# The level columns that are not figures: their type and, where they have one, unit and anchor.
LEVEL_TYPES: dict[str, str] = {
    "trial": INT, "tag": STR, "mode": STR, "concurrency": INT, "rate": FLOAT, "requests": INT, "ok": INT,
    "failed": INT, "cancelled": INT, "errors": STR, "window_s": FLOAT, "counted_by": STR, "slo_passed": BOOL,
    "contended": BOOL, "warnings": STR,
    "gpu_measured": BOOL, "gpu_reason": STR, "gpu_source": STR, "gpu_energy_j": FLOAT, "gpu_power_w_max": FLOAT,
    "gpu_contended": BOOL, "gpu_count": INT,
}
LEVEL_UNITS: dict[str, tuple[str, str | None]] = {
    "concurrency": ("streams", None), "rate": ("req/s", "open-loop"), "requests": ("requests", None),
    "ok": ("requests", None), "failed": ("requests", "errors"), "cancelled": ("requests", "cancelled"),
    "window_s": ("s", "steady-state"), "contended": ("", "contended"),
    "other_cpu_cores_mean": ("cores", "environment"), "client_cpu_cores_mean": ("cores", "environment"),
    "engine_cpu_cores_mean": ("cores", "environment"), "load1_mean": ("load average", "environment"),
    "steal_pct": ("%", "environment"),
    "gpu_energy_j": ("J", "gpu-energy"), "gpu_power_w_max": ("W", "gpu-power"), "gpu_contended": ("", "gpu-contended"),
    "gpu_count": ("GPUs", "gpu-engine"),
}

GPU_UNITS: dict[str, tuple[str, str | None]] = {
    "samples": ("readings", "gpu"), "energy_j": ("J", "gpu-energy"), "power_w_mean": ("W", "gpu-power"),
    "power_w_max": ("W", "gpu-power"), "sm_active_pct_mean": ("%", "gpu-sm-activity"),
    "mem_used_bytes_mean": ("bytes", "gpu-memory"), "mem_used_bytes_max": ("bytes", "gpu-memory"),
    "idle_share": ("fraction", "gpu-idle-share"), "throttle_s": ("s", "gpu-throttle"), "temp_c_max": ("°C", "gpu"),
    "xid_errors": ("events", "gpu-xid"),
}
SERIES_UNITS: dict[str, tuple[str, str | None]] = {
    "t_ns": ("ns", "clocks"), "sm_active_pct": ("%", "gpu-sm-activity"), "mem_used_bytes": ("bytes", "gpu-memory"),
    "mem_total_bytes": ("bytes", "gpu-memory"), "power_w": ("W", "gpu-power"), "energy_mj": ("mJ", "gpu-energy"),
    "temp_c": ("°C", "gpu"), "sm_clock_mhz": ("MHz", "gpu"), "mem_clock_mhz": ("MHz", "gpu"),
    "throttle_ns": ("ns", "gpu-throttle"), "xid_errors": ("events", "gpu-xid"), "retired_pages": ("pages", "gpu"),
    "pcie_tx_bytes_s": ("bytes/s", "gpu"), "pcie_rx_bytes_s": ("bytes/s", "gpu"),
    "nvlink_tx_bytes_s": ("bytes/s", "gpu"), "nvlink_rx_bytes_s": ("bytes/s", "gpu"),
}


def _pyarrow():
    """The pyarrow modules, or the one-line error saying how to install them."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise UserError("the parquet export needs pyarrow, which is not installed", hint=INSTALL_HINT) from None
    return pyarrow, pyarrow.parquet


def require_pyarrow() -> None:
    """Fail now, before anything is read or written, when pyarrow is missing."""
    _pyarrow()


def _model_type(annotation: Any) -> str:
    """The column type of a pydantic field: its type without None; a list or tuple is a string (joined, as in the
    CSV), a Literal a string."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return _model_type(args[0])
    if typing.get_origin(annotation) is typing.Literal:
        return STR
    return {int: INT, float: FLOAT, bool: BOOL, str: STR}.get(annotation, STR)


def _model_types(model, columns: Sequence[str]) -> dict[str, str]:
    return {c: _model_type(model.model_fields[c].annotation) for c in columns if c in model.model_fields}


def level_types() -> dict[str, str]:
    """Every column of levels.csv: a figure's value is float64, its distribution's `_n` int64 and the other
    statistics float64; the environment's columns typed as EnvironmentSummary types them."""
    typed = dict(LEVEL_TYPES) | _model_types(EnvironmentSummary, csv_layout.LEVEL_ENVIRONMENT)
    for spec in LEVEL_FIGURES + GPU_FIGURES:
        if spec.csv is None:
            continue
        if not spec.csv.stats:
            typed[spec.key] = FLOAT
        for stat in csv_layout.STATS:
            typed[f"{spec.key}_{stat}"] = INT if stat == "n" else FLOAT
    return {c: typed[c] for c in csv_layout.LEVEL_COLUMNS}


def level_units() -> dict[str, tuple[str, str | None]]:
    units = dict(LEVEL_UNITS)
    for spec in LEVEL_FIGURES + GPU_FIGURES:
        if spec.csv is None:
            continue
        units[spec.key] = (spec.unit, spec.definition)
        for stat in csv_layout.STATS:
            units[f"{spec.key}_{stat}"] = ("count" if stat == "n" else spec.unit, spec.definition)
    return units


def _schema(columns: Sequence[str], typed: dict[str, str], units: dict[str, tuple[str, str | None]]):
    pa, _ = _pyarrow()
    fields = []
    for name in columns:
        unit, anchor = units.get(name, (None, None))
        meta = {}
        if unit:
            meta["unit"] = unit
        if anchor:
            meta["definition"] = f"docs/metrics.md#{anchor}"
        fields.append(pa.field(name, getattr(pa, typed[name])(), nullable=True, metadata=meta or None))
    return pa.schema(fields, metadata={"columns": "docs/output.md#parquet-export"})


# ---------------------------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------------------------

def export_parquet(records: Iterable[RequestRecord], levels: Sequence[Summary], out_dir: Path,
                   series: Sequence[Path] = ()) -> list[Path]:
    """records.parquet and levels.parquet in `out_dir`; gpus.parquet when a level measured its GPUs,
    gpu_series.parquet when the run has a GPU series file (`series`): the CSV export's files, typed."""
    require_pyarrow()
    ensure_output_dir(out_dir, "export directory")
    paths = [out_dir / "records.parquet", out_dir / "levels.parquet"]
    _write(paths[0], _schema(csv_layout.RECORD_COLUMNS, RECORD_TYPES, RECORD_UNITS),
           (csv_layout.record_row(r) for r in records))
    _write(paths[1], _schema(csv_layout.LEVEL_COLUMNS, level_types(), level_units()),
           (csv_layout.level_row(s) for s in levels))
    if any(s.gpu is not None and s.gpu.measured for s in levels):
        paths.append(out_dir / "gpus.parquet")
        gpu_types = {"trial": INT, "tag": STR} | _model_types(GpuDeviceSummary, csv_layout.GPU_COLUMNS)
        _write(paths[-1], _schema(csv_layout.GPU_COLUMNS, gpu_types, GPU_UNITS),
               (row for s in levels for row in csv_layout.gpu_rows(s)))
    if series:
        paths.append(out_dir / "gpu_series.parquet")
        columns = csv_layout.gpu_series_columns()
        _write(paths[-1], _schema(columns, _model_types(GpuReading, columns), SERIES_UNITS),
               (csv_layout.series_row(r) for r in csv_layout.iter_series(series)))
    return paths


def _write(path: Path, schema, rows: Iterable[dict[str, Any]]) -> None:
    """Rows into a Parquet file, one row group per `BATCH_ROWS` rows, each batch gathered as columns and written
    before the next is read. A file with no rows still has its schema."""
    pa, pq = _pyarrow()
    names = schema.names
    cells = [_cell_of(schema.field(n).type, pa, n, path) for n in names]
    with output_file(path, "export file") as tmp, _removed_on_error(tmp):
        with pq.ParquetWriter(tmp, schema) as writer:
            columns: list[list[Any]] = [[] for _ in names]
            count = 0
            for row in rows:
                for column, name, cell in zip(columns, names, cells):
                    column.append(cell(row[name]))
                count += 1
                if count == BATCH_ROWS:
                    writer.write_batch(_batch(pa, columns, schema, path))
                    columns, count = [[] for _ in names], 0
            if count:
                writer.write_batch(_batch(pa, columns, schema, path))


@contextlib.contextmanager
def _removed_on_error(tmp: Path) -> Iterator[None]:
    """A value refused halfway (or Ctrl-C) leaves no half-written file behind; output_file removes it only on an
    OSError."""
    try:
        yield
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _batch(pa, columns: list[list[Any]], schema, path: Path):
    """The gathered columns as one Arrow batch; a value its column's type cannot hold (a sampling parameter sent
    as text, say) is a one-line error naming the file, never a traceback."""
    try:
        return pa.record_batch(columns, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"cannot write the export file {path}: a value does not fit its column's type ({detail})",
                        hint="export as csv or json, which keep any value") from None


def _cell_of(arrow_type, pa, name: str, path: Path) -> Callable[[Any], Any]:
    """How a row's value becomes a cell of its column: a string as the CSV writes it (a server's control
    characters shown, never raw: textsafe.py), a float column's int as a float, an int column's whole float as an
    int; None stays null. pyarrow would truncate 5.5 into an int64 column without a word: refused here."""
    if pa.types.is_string(arrow_type):
        return lambda v: None if v is None else visible(v)
    if pa.types.is_floating(arrow_type):
        return lambda v: float(v) if type(v) is int else v  # anything else is pyarrow's to take or refuse

    def whole(v: Any) -> Any:
        if type(v) is not float:
            return v
        if not v.is_integer():
            raise UserError(f"cannot write the export file {path}: column {name} holds {v!r}, not a whole number",
                            hint="export as csv or json, which keep any value")
        return int(v)

    return whole if pa.types.is_integer(arrow_type) else (lambda v: v)
