"""The Python API (servelab/api.py, docs/api.md): the documented examples run as written against the embedded
engine, options are refused with the command's own message, and results are the typed records."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import servelab
from servelab.compare.compare import Comparison
from servelab.experiment.runner import ExperimentResult
from servelab.records import BenchResult

DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"
PY = sys.executable


def doc_examples() -> list[str]:
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)
    assert len(blocks) == 2, "docs/api.md: a bench example and a run example"
    return blocks


@pytest.mark.engine
def test_the_documented_examples_run(embedded_server, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SERVELAB_URL", embedded_server["url"])
    monkeypatch.chdir(tmp_path)  # the examples write under ./runs
    bench_example, run_example = doc_examples()

    ns: dict = {}
    exec(compile(bench_example, f"{DOC}:bench", "exec"), ns)
    out = capsys.readouterr().out
    assert re.search(r"single-stream decode: \d+\.\d tok/s", out), out
    assert "refused: --mode concurrency needs --concurrency N" in out
    assert isinstance(ns["run"], servelab.BenchRun) and isinstance(ns["run"].result, BenchResult)
    sweep = ns["sweep"]
    assert [lv.concurrency for lv in sweep.result.levels] == [1, 2]
    assert sweep.stored_in is not None and (sweep.run_dir / "summary.json").exists()
    assert BenchResult.model_validate_json((sweep.run_dir / "summary.json").read_text()).mode == "sweep"

    ns = {}
    exec(compile(run_example, f"{DOC}:run", "exec"), ns)
    out = capsys.readouterr().out
    result = ns["result"]
    assert isinstance(result, ExperimentResult) and isinstance(result.comparison, Comparison), out
    assert [(c.name, c.status) for c in result.cells] == [("short", "complete"), ("long", "complete")]
    assert "single-stream decode tok/s" in out


# Each: the API's keywords, the same options on `servelab bench`'s command line.
REFUSED = [
    ({"mode": "concurrency"}, ["--mode", "concurrency"]),
    ({"requests": 0}, ["--requests", "0"]),
    ({"rate": 4}, ["--rate", "4"]),
    ({"mode": "rate-sweep", "slo": {"ttft_p99_ms": -1}}, ["--mode", "rate-sweep", "--slo", "ttft_p99_ms=-1"]),
    ({"csv": True}, ["--csv"]),
]


@pytest.mark.parametrize(("keywords", "argv"), REFUSED, ids=[" ".join(a) for _, a in REFUSED])
def test_a_refused_option_raises_the_commands_message(keywords, argv):
    proc = subprocess.run([PY, "-m", "servelab.cli", "bench", "http://127.0.0.1:1", *argv], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    command_says = proc.stderr.strip().removeprefix("error: ")
    with pytest.raises(servelab.UserError) as refused:
        servelab.bench("http://127.0.0.1:1", **keywords)
    assert str(refused.value) == command_says


def test_options_are_checked_for_name_and_type():
    with pytest.raises(servelab.UserError, match="unknown bench option 'max_token'.*max_tokens"):
        servelab.bench("http://127.0.0.1:1", max_token=8)
    with pytest.raises(servelab.UserError, match="--requests 'many'"):
        servelab.bench("http://127.0.0.1:1", {"requests": "many"})
    with pytest.raises(servelab.UserError, match="--requests is not a yes/no option"):
        servelab.bench("http://127.0.0.1:1", requests=True)
    from servelab.api import bench_args

    args = bench_args({"max-tokens": 8, "rate": [1, 2.5]}, {"slo": {"ttft_p99_ms": 500}})
    assert (args.max_tokens, args.rate, args.slo) == (8, "1,2.5", "ttft_p99_ms=500")
    # the options the command takes as text, given as numbers, as an experiment step may give them too
    args = bench_args(None, {"workers": 4, "input_tokens": 64, "think_time": 2, "rate": 4})
    assert (args.workers, args.input_tokens, args.think_time, args.rate) == ("4", "64", "2", "4")


def test_an_unreachable_server_is_a_user_error():
    with pytest.raises(servelab.UserError, match="cannot reach"):
        servelab.bench("http://127.0.0.1:1", requests=1)


def test_a_bad_experiment_names_the_setting(tmp_path):
    with pytest.raises(servelab.UserError, match=r"cells\[0\]\.parallel"):
        servelab.run({"name": "x", "cells": [{"name": "a", "url": "http://127.0.0.1:1", "parallel": "many"}]},
                     out=tmp_path)
    (tmp_path / "bad.yaml").write_text("name: x\ncells:\n  - name: a\n    engine: nope\n    model: m\n")
    with pytest.raises(servelab.UserError, match=r"bad.yaml:4: cells\[0\]\.engine"):
        servelab.run(tmp_path / "bad.yaml", out=tmp_path)


@pytest.mark.engine
def test_bench_runs_inside_a_running_event_loop(embedded_server):
    # a notebook's cell runs while the kernel's loop is running
    async def cell():
        return servelab.bench(embedded_server["url"], requests=1, max_tokens=4, warmup=0)

    run = asyncio.run(cell())
    assert run.result.levels[0].ok == 1 and not run.failed


def test_import_servelab_stays_light():
    probe = ("import servelab, sys, json; loaded = sorted(m for m in ('servelab.api', 'pydantic', 'aiohttp', 'rich') "
             "if m in sys.modules); print(json.dumps([loaded, callable(servelab.bench), callable(servelab.run)]))")
    proc = subprocess.run([PY, "-c", probe], capture_output=True, text=True, timeout=60)
    assert json.loads(proc.stdout) == [[], True, True], proc.stderr
