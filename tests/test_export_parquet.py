"""The Parquet export: the CSV export's files, row for row and column for column, with real types; records
written in row groups as they stream in (memory bounded); without pyarrow, one line saying how to install it."""

from __future__ import annotations

import csv
import math
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")  # the `test` extra installs it; a bare install still runs the other tests
pq = pytest.importorskip("pyarrow.parquet")

from gpu_runs import readings, with_gpu, write_series  # noqa: E402
from servelab.errors import UserError  # noqa: E402
from servelab.host.gpu_telemetry.sampler import SERIES_FILE  # noqa: E402
from servelab.records import RequestRecord, TokenEvent, Usage  # noqa: E402
from servelab.store.export import GPU_COLUMNS, LEVEL_COLUMNS, RECORD_COLUMNS, export_run_dir  # noqa: E402
from servelab.store.export_parquet import BATCH_ROWS, export_parquet  # noqa: E402
from servelab.store.rundir import RunDir  # noqa: E402
from synthetic_runs import synthetic_run  # noqa: E402

MS = 1_000_000
METRICS_MD = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
# Columns holding a list joined by spaces ("1234 5678"): text, even when the list has one number.
JOINED = {"other_pids", "processes"}


def failed_and_odd_records(start: int) -> list[RequestRecord]:
    """Records the synthetic run has none of: an HTTP failure whose detail carries a control character, one with
    the server's usage (cached and reasoning counts) in a multi-turn conversation, an open-loop one with an int
    temperature."""
    t0 = 10**12
    return [
        RequestRecord(index=start, tag="c1", endpoint="/v1/chat/completions", t_send_ns=t0, t_headers_ns=t0 + MS,
                      t_end_ns=t0 + 2 * MS, ok=False, http_status=500, error_kind="http",
                      error_detail="boom \x1b[31mred\x1b[0m", sampling={"temperature": 1}),
        RequestRecord(index=start + 1, tag="c1", endpoint="/v1/chat/completions", t_send_ns=t0,
                      scheduled_ns=t0 - 3 * MS, t_headers_ns=t0 + MS, t_end_ns=t0 + 50 * MS, ok=True, saw_done=True,
                      chunks=3, count_method="server_per_chunk", conversation=4, turn=2, finish_reason="stop",
                      usage=Usage(prompt_tokens=120, completion_tokens=5, cached_tokens=96, reasoning_tokens=2),
                      events=[TokenEvent(t_ns=t0 + 10 * MS, kind="reasoning", tokens=2, text="hm"),
                              TokenEvent(t_ns=t0 + 20 * MS, kind="answer", tokens=3, text="yes")]),
    ]


def run_dir_with_gpus(tmp_path: Path) -> Path:
    """A `bench --out` run directory: summary.json with GPU-measured levels, records, and the GPU series."""
    summary, records = synthetic_run("parquet-export")
    bench = summary.trials[0].sweep
    for level in bench.levels:
        with_gpu(level, gpus=2, power_w=250.0)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(bench.model_dump_json(indent=2))
    rundir = RunDir(run_dir)
    for r in records + failed_and_odd_records(len(records)):
        rundir.append_record(r)
    rundir.close()
    write_series(run_dir / SERIES_FILE, readings(2.0, gpus=2, power_w=250.0, pids=(4242,)))
    return run_dir


def csv_cell(text: str):
    """A CSV cell as a reader that guesses types gets it: what the Parquet cell must equal, type included."""
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


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def assert_same_cells(csv_path: Path, parquet_path: Path) -> int:
    header, csv_rows = read_csv(csv_path)
    table = pq.read_table(parquet_path)
    assert table.column_names == header
    rows = table.to_pylist()
    assert len(rows) == len(csv_rows)
    for i, (text_row, row) in enumerate(zip(csv_rows, rows)):
        for name in header:
            want, got = text_row[name], row[name]
            where = f"{parquet_path.name} row {i} column {name}: csv {want!r}, parquet {got!r}"
            if name in JOINED:
                assert (got or "") == want, where
                continue
            expected = csv_cell(want)
            if isinstance(expected, int) and not isinstance(expected, bool) and isinstance(got, float):
                # a whole number in a float column (an int temperature): the CSV writes it as it came
                assert got == expected and pa.types.is_floating(table.schema.field(name).type), where
                continue
            assert type(got) is type(expected), where
            if isinstance(expected, float) and math.isnan(expected):
                assert math.isnan(got), where
            else:
                assert got == expected, where
    return len(rows)


def test_every_parquet_file_reads_back_as_the_csv_export_row_by_row_and_column_by_column(tmp_path: Path) -> None:
    run_dir = run_dir_with_gpus(tmp_path)
    csv_paths, _ = export_run_dir(run_dir, "csv", tmp_path / "csv")
    paths, _ = export_run_dir(run_dir, "parquet", tmp_path / "parquet")
    assert [p.name for p in paths] == ["records.parquet", "levels.parquet", "gpus.parquet", "gpu_series.parquet"]
    counts = {p.name: assert_same_cells(c, p) for c, p in zip(csv_paths, paths)}
    assert counts["records.parquet"] > 20 and counts["levels.parquet"] >= 2 and counts["gpus.parquet"] >= 4
    assert counts["gpu_series.parquet"] == len(readings(2.0, gpus=2, power_w=250.0))
    records = pq.read_table(paths[0]).to_pylist()
    failed = next(r for r in records if r["ok"] is False)
    assert failed["http_status"] == 500 and failed["error_detail"] == "boom \\x1b[31mred\\x1b[0m"  # shown, not raw
    assert failed["temperature"] == 1.0 and failed["ttft_ms"] is None  # no token: null, never 0
    multi = next(r for r in records if r["conversation"] == 4)
    assert (multi["turn"], multi["cached_tokens"], multi["usage_reasoning_tokens"]) == (2, 96, 2)
    assert multi["answer_tokens"] == 3 and multi["reasoning_tokens"] == 2 and multi["client_lag_ms"] == 3.0


def test_columns_are_typed_and_say_their_unit_and_definition(tmp_path: Path) -> None:
    paths, _ = export_run_dir(run_dir_with_gpus(tmp_path), "parquet", tmp_path / "out")
    records, levels, gpus, series = (pq.read_schema(p) for p in paths)
    assert records.names == RECORD_COLUMNS and levels.names == LEVEL_COLUMNS and gpus.names == GPU_COLUMNS
    expected = {
        records: {"index": pa.int64(), "t_send_ns": pa.int64(), "ttft_ms": pa.float64(), "tag": pa.string(),
                  "ok": pa.bool_(), "http_status": pa.int64(), "decode_tok_s": pa.float64(), "turn": pa.int64()},
        levels: {"concurrency": pa.int64(), "rate": pa.float64(), "ttft_ms_n": pa.int64(),
                 "ttft_ms_p99": pa.float64(), "output_tok_s": pa.float64(), "slo_passed": pa.bool_(),
                 "gpu_count": pa.int64(), "j_per_output_token": pa.float64(), "warnings": pa.string()},
        gpus: {"gpu": pa.int64(), "energy_j": pa.float64(), "mem_used_bytes_max": pa.int64(),
               "energy_from": pa.string(), "other_pids": pa.string()},
        series: {"t_ns": pa.int64(), "power_w": pa.float64(), "sm_source": pa.string()},
    }
    for schema, types in expected.items():
        assert {name: schema.field(name).type for name in types} == types
        assert all(f.nullable for f in schema)
    meta = {name: {k.decode(): v.decode() for k, v in (records.field(name).metadata or {}).items()}
            for name in ("ttft_ms", "t_send_ns", "decode_tok_s", "tag")}
    assert meta == {"ttft_ms": {"unit": "ms", "definition": "docs/metrics.md#ttft"},
                    "t_send_ns": {"unit": "ns", "definition": "docs/metrics.md#clocks"},
                    "decode_tok_s": {"unit": "tok/s", "definition": "docs/metrics.md#decode-tok-s"}, "tag": {}}
    assert levels.field("ttft_ms_p50").metadata[b"unit"] == b"ms"
    assert levels.field("ttft_ms_n").metadata[b"unit"] == b"count"
    assert levels.field("j_per_output_token").metadata[b"definition"] == b"docs/metrics.md#gpu-j-per-token"
    # Every definition a column names is an anchor docs/metrics.md has.
    anchors = set(re.findall(r'<a id="([^"]+)"', METRICS_MD.read_text(encoding="utf-8")))
    named = {f.metadata[b"definition"].decode().split("#")[1] for s in (records, levels, gpus, series) for f in s
             if f.metadata and b"definition" in f.metadata}
    assert named and named <= anchors, named - anchors


def test_a_run_without_summary_has_an_empty_levels_file_with_every_column(tmp_path: Path) -> None:
    _, records = synthetic_run("killed")
    run = RunDir(tmp_path / "killed")
    for r in records[:5]:
        run.append_record(r)
    run.close()
    paths, notes = export_run_dir(run.path, "parquet", tmp_path / "out")
    assert [p.name for p in paths] == ["records.parquet", "levels.parquet"]
    assert pq.read_table(paths[0]).num_rows == 5 and any("no summary.json" in n for n in notes)
    levels = pq.read_table(paths[1])
    assert levels.num_rows == 0 and levels.column_names == LEVEL_COLUMNS


def stream_of_records(count: int):
    """`count` small records made one at a time, as records.jsonl.gz yields them."""
    for i in range(count):
        t0 = 10**12 + i * 100 * MS
        yield RequestRecord(index=i, tag="c8", endpoint="/v1/chat/completions", t_send_ns=t0, t_headers_ns=t0 + MS,
                            t_end_ns=t0 + 40 * MS, ok=True, saw_done=True, chunks=3, max_tokens=3,
                            count_method="server_per_chunk", sampling={"temperature": 0.0},
                            events=[TokenEvent(t_ns=t0 + (10 + 10 * k) * MS, kind="answer", tokens=1, text="w ")
                                    for k in range(3)])


def _peak_bytes(run) -> int:
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_records_stream_into_row_groups_in_bounded_memory(tmp_path: Path) -> None:
    count = 25_000
    path = tmp_path / "out" / "records.parquet"
    peak = _peak_bytes(lambda: export_parquet(stream_of_records(count), [], tmp_path / "out"))
    meta = pq.read_metadata(path)
    assert meta.num_rows == count and meta.num_row_groups == math.ceil(count / BATCH_ROWS)
    assert pq.read_table(path, columns=["index"]).column("index").to_pylist() == list(range(count))
    # What holding them would take: the same records kept in a list, measured the same way on a tenth of them.
    held = _peak_bytes(lambda: list(stream_of_records(count // 10))) * 10
    bound = 12 * 2**20  # one batch of rows as Python lists: about 2.5 MiB
    assert held > 2 * bound, held  # the bound would fail if the export held every record
    assert peak < bound, f"peak {peak / 2**20:.1f} MiB while exporting {count} records"


def test_without_pyarrow_the_cli_says_in_one_line_how_to_install_it(tmp_path: Path) -> None:
    run_dir = run_dir_with_gpus(tmp_path)
    # pyarrow made unimportable, as on an install without the `parquet` extra
    code = ("import sys; sys.modules['pyarrow'] = None; sys.modules['pyarrow.parquet'] = None; "
            "from servelab.cli import main; sys.argv = ['servelab'] + sys.argv[1:]; main()")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", code, "export", str(run_dir), "--format", "parquet", "--to",
                           str(out), "--store", str(tmp_path / "no-store.db")],
                          capture_output=True, text=True, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "pyarrow" in lines[0] and "pip install 'servelab[parquet]'" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout and not out.exists()


@pytest.mark.parametrize("sampling, needle", [
    ({"temperature": "hot"}, "does not fit its column's type"),
    ({"min_tokens": 5.5}, "column min_tokens holds 5.5, not a whole number"),  # pyarrow alone would write 5
])
def test_a_value_its_column_cannot_hold_is_a_one_line_error_and_no_file(tmp_path: Path, sampling, needle) -> None:
    record = RequestRecord(index=0, endpoint="/v1/completions", t_send_ns=1, sampling=sampling)
    with pytest.raises(UserError, match=re.escape(needle)) as caught:
        export_parquet([record], [], tmp_path)
    assert "\n" not in str(caught.value) and list(tmp_path.iterdir()) == []
