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
from servelab.bench.metrics import summarize
from servelab.records import RequestRecord, Summary, TokenEvent, Usage
from servelab.store.export import (LEVEL_COLUMNS, RECORD_COLUMNS, STATS, export_csv, export_json,
                                   export_run_dir, level_row, record_row)
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
            if found and sum(not r.warmup for r in read_records(found[0])) >= 6:  # past the warm-up
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


# ---------------------------------------------------------------------------------------------------------------
# Reasoning and multi-turn columns (appended after the columns scripts already index)
# ---------------------------------------------------------------------------------------------------------------

MS = 1_000_000
T0 = 10**12

# The columns as they were before the reasoning and multi-turn ones: their order must not change.
OLD_RECORD_COLUMNS = [
    "index", "trial", "tag", "warmup", "endpoint", "ok", "error_kind", "http_status", "error_detail",
    "input_tokens", "prompt_tokens", "max_tokens", "output_tokens", "completion_tokens", "reasoning_tokens",
    "cached_tokens", "count_method", "finish_reason", "saw_done", "chunks",
    "temperature", "ignore_eos", "min_tokens",
    "scheduled_ns", "t_send_ns", "t_headers_ns", "t_end_ns",
    "client_lag_ms", "ttft_ms", "ttfo_ms", "e2e_ms", "tpot_ms", "decode_tok_s", "itl_p50_ms", "itl_max_ms",
]
OLD_LEVEL_COLUMNS = (
    ["trial", "tag", "mode", "concurrency", "rate", "requests", "ok", "failed", "cancelled", "errors", "window_s",
     "counted_by", "slo_passed", "output_tok_s", "request_s", "goodput_req_s", "slo_attainment"]
    + [f"{name}_{stat}" for name in ["ttft_ms", "ttfo_ms", "itl_ms", "itl_chunk_ms", "tpot_ms", "e2e_ms",
                                     "decode_tok_s", "output_tokens", "client_lag_ms"]
       for stat in ["n", "mean", "min", "p50", "p90", "p95", "p99", "max"]]
    + ["contended", "other_cpu_cores_mean", "client_cpu_cores_mean", "engine_cpu_cores_mean", "load1_mean",
       "steal_pct", "warnings"])

# (conversation, turn, reasoning events' tokens, answer events' tokens, prompt tokens, cached prompt tokens,
#  the server's usage.reasoning_tokens). Conversation None: a single-turn request.
SPECS = [
    (0, 1, [2, 1, 3], [1, 1, 2], 100, 0, 6),
    (0, 2, [1, 1], [3, 1], 180, 96, 2),
    (0, 3, [], [2, 2, 1], 260, 176, None),  # no thinking this turn
    (1, 1, [4, 4], [1], 90, 10, 8),
    (1, 2, [1, 2, 1, 1], [], 150, 128, 5),  # cut off while thinking: no answer token, no TTFO
    (None, None, [], [1, 1, 1, 1], 50, None, None),  # single-turn, no cache report, no reasoning
]
FIRST_EVENT_MS, GAP_MS = 40, 10


def reasoning_records() -> list[RequestRecord]:
    """One record per SPECS row: reasoning events, then answer events, GAP_MS apart from FIRST_EVENT_MS after the
    send."""
    out = []
    for i, (conv, turn, reasoning, answer, prompt, cached, usage_reasoning) in enumerate(SPECS):
        send = T0 + i * 1_000 * MS
        kinds = [("reasoning", k) for k in reasoning] + [("answer", k) for k in answer]
        events = [TokenEvent(t_ns=send + (FIRST_EVENT_MS + j * GAP_MS) * MS, kind=kind, tokens=k, text="x")
                  for j, (kind, k) in enumerate(kinds)]
        out.append(RequestRecord(
            index=i, tag="multiturn", endpoint="/v1/chat/completions", t_send_ns=send, t_end_ns=events[-1].t_ns + MS,
            events=events, count_method="server_per_chunk", chunks=len(events), saw_done=True, ok=True,
            finish_reason="stop" if answer else "length", input_tokens=prompt, conversation=conv, turn=turn,
            usage=Usage(prompt_tokens=prompt, completion_tokens=sum(reasoning) + sum(answer),
                        cached_tokens=cached, reasoning_tokens=usage_reasoning)))
    return out


def test_record_and_level_columns_keep_their_order_and_append_the_new_ones() -> None:
    assert RECORD_COLUMNS[:len(OLD_RECORD_COLUMNS)] == OLD_RECORD_COLUMNS
    assert RECORD_COLUMNS[len(OLD_RECORD_COLUMNS):] == ["answer_tokens", "usage_reasoning_tokens", "conversation",
                                                        "turn", "images", "image_pixels", "tool_calls",
                                                        "tool_first_ms", "tool_call_ms", "tool_calls_parse",
                                                        "tool_calls_valid", "tool_problem", "schema_valid",
                                                        "schema_problem", "stream", "items", "image_sizes"]
    assert LEVEL_COLUMNS[:len(OLD_LEVEL_COLUMNS)] == OLD_LEVEL_COLUMNS
    assert LEVEL_COLUMNS[len(OLD_LEVEL_COLUMNS):] == (
        ["answer_tok_s", "reasoning_share", "cache_hit_ratio"]
        + [f"{name}_{stat}" for name in ["answer_tokens", "reasoning_tokens", "cached_tokens", "ttft_cached_ms",
                                         "ttft_uncached_ms"] for stat in STATS]
        # what the GPUs did (docs/metrics.md#gpu): the GPU figures, then the level's GPU summary
        + ["j_per_output_token", "j_per_answer_token", "output_tokens_per_j", "gpu_power_w_mean",
           "gpu_sm_active_pct_mean", "gpu_idle_share", "gpu_measured", "gpu_reason", "gpu_source", "gpu_energy_j",
           "gpu_power_w_max", "gpu_contended", "gpu_count"]
        # non-streamed requests, images, tool calls and structured output: figures added after the GPU columns
        + ["items_s", "input_tok_s"]
        + [f"{name}_{stat}" for name in ["images_per_request", "image_megapixels", "ttft_image_ms", "ttft_text_ms",
                                         "tool_first_ms", "tool_call_ms"] for stat in STATS]
        + ["tool_call_share", "tool_parse_share", "tool_valid_share", "schema_valid_share"])
    assert len(set(RECORD_COLUMNS)) == len(RECORD_COLUMNS) and len(set(LEVEL_COLUMNS)) == len(LEVEL_COLUMNS)


def test_records_csv_has_answer_and_reasoning_tokens_ttfo_and_conversation_turn(tmp_path: Path) -> None:
    records = reasoning_records()
    header, rows = read_csv(export_csv(records, [], tmp_path)[0])
    assert header == RECORD_COLUMNS and len(rows) == len(SPECS)
    for spec, row in zip(SPECS, rows):
        conv, turn, reasoning, answer, prompt, cached, usage_reasoning = spec
        assert row["reasoning_tokens"] == sum(reasoning)
        assert row["answer_tokens"] == sum(answer)
        assert row["output_tokens"] == row["answer_tokens"] + row["reasoning_tokens"]
        assert row["usage_reasoning_tokens"] == usage_reasoning  # the server's count; empty when not reported
        # TTFO: to the first answer event, after every reasoning event; TTFT: to the first event of either kind
        assert row["ttfo_ms"] == (FIRST_EVENT_MS + len(reasoning) * GAP_MS if answer else None)
        assert row["ttft_ms"] == FIRST_EVENT_MS
        assert (row["conversation"], row["turn"]) == (conv, turn)  # empty cells for the single-turn request
        assert (row["prompt_tokens"], row["cached_tokens"]) == (prompt, cached)
    # per-turn analysis straight from the file: the turns of each conversation, in order
    turns = {}
    for row in rows:
        if row["conversation"] is not None:
            turns.setdefault(row["conversation"], []).append(row["turn"])
    assert turns == {0: [1, 2, 3], 1: [1, 2]}


def test_levels_csv_has_reasoning_and_prefix_cache_figures(tmp_path: Path) -> None:
    records = reasoning_records()
    window = (T0, max(r.t_end_ns for r in records))
    level = summarize(records, tag="multiturn", mode="concurrency", concurrency=2, window=window)
    _, rows = read_csv(export_csv(records, [level], tmp_path)[1])
    (row,) = rows
    window_s = (window[1] - window[0]) / 1e9
    reasoning = [sum(s[2]) for s in SPECS]
    answer = [sum(s[3]) for s in SPECS]
    assert row["answer_tok_s"] == pytest.approx(sum(answer) / window_s)
    assert row["reasoning_share"] == pytest.approx(sum(reasoning) / (sum(reasoning) + sum(answer)))
    assert (row["answer_tokens_n"], row["reasoning_tokens_n"]) == (len(SPECS), len(SPECS))
    assert row["answer_tokens_mean"] == pytest.approx(sum(answer) / len(SPECS))
    assert row["reasoning_tokens_mean"] == pytest.approx(sum(reasoning) / len(SPECS))
    # totals over the level's successful requests: n x mean
    assert row["reasoning_tokens_n"] * row["reasoning_tokens_mean"] == pytest.approx(sum(reasoning))
    assert (row["answer_tokens_min"], row["answer_tokens_max"]) == (min(answer), max(answer))
    assert (row["reasoning_tokens_min"], row["reasoning_tokens_max"]) == (min(reasoning), max(reasoning))
    # prefix cache: only the requests that reported cached tokens
    reported = [s for s in SPECS if s[5] is not None]
    assert row["cache_hit_ratio"] == pytest.approx(sum(s[5] for s in reported) / sum(s[4] for s in reported))
    assert row["cached_tokens_n"] == len(reported)
    assert row["cached_tokens_mean"] == pytest.approx(sum(s[5] for s in reported) / len(reported))
    warm = [s for s in reported if s[5] / s[4] >= 0.5]
    assert (row["ttft_cached_ms_n"], row["ttft_uncached_ms_n"]) == (len(warm), len(reported) - len(warm))
    assert row["ttft_cached_ms_p50"] == row["ttft_uncached_ms_p50"] == FIRST_EVENT_MS
    assert row["ttfo_ms_n"] == sum(1 for s in SPECS if s[3])  # the request cut off while thinking has no TTFO


def test_levels_csv_leaves_reasoning_and_cache_cells_empty_without_those_figures(tmp_path: Path) -> None:
    # a level summary without these figures (written before they existed): a fixed header, empty cells
    old = Summary(tag="c1", mode="concurrency", concurrency=1, requests=0, ok=0, failed=0, window_s=1.0)
    # a level whose requests reported no cached tokens: reasoning figures, no cache figures
    plain = summarize([r for r in reasoning_records() if r.usage.cached_tokens is None], tag="c1",
                      mode="concurrency", concurrency=1, window=(T0, T0 + 10_000 * MS))
    header, (row_old, row_plain) = read_csv(export_csv([], [old, plain], tmp_path)[1])
    assert header == LEVEL_COLUMNS
    new = LEVEL_COLUMNS[len(OLD_LEVEL_COLUMNS):]
    assert all(row_old[c] is None for c in new)
    cache = [c for c in new if c == "cache_hit_ratio" or c.startswith(("cached_tokens_", "ttft_cached_",
                                                                           "ttft_uncached_"))]
    assert len(cache) == 1 + 3 * len(STATS) and all(row_plain[c] is None for c in cache)
    assert row_plain["reasoning_share"] == 0 and row_plain["answer_tokens_mean"] == 4
