"""A trial as ordered bench steps of any mode: files from before steps still read, an experiment file declares the
steps with `servelab bench`'s option names, and compare gives the SLO search's and the replay's figures intervals
and verdicts, trials paired by round (no server involved: runs made by hand)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from servelab.bench.metrics import goodput_figures, summarize
from servelab.bench.runner import headline
from servelab.bench.slo import describe, level_verdict, parse_slos
from servelab.bench.trials import pooled_steps, run_headline
from servelab.compare.compare import compare_runs
from servelab.compare.sources import from_summary
from servelab.errors import UserError
from servelab.experiment.load import parse_experiment
from servelab.experiment.model import BenchSettings, Experiment
from servelab.records import BenchResult, Provenance, RunSummary, Step, Trial
from servelab.store.db import Store
from servelab.store.export import levels_of
from servelab.store.runs import level_rows
from synthetic_runs import NS, WORKLOAD, request, synthetic_run

TRACE = Path(__file__).resolve().parent.parent / "examples" / "data" / "mooncake-sample.jsonl"
SLOS = parse_slos("ttft_p99_ms=200")


# ---- the shape ----

def test_a_trial_from_before_steps_reads_as_its_steps_and_writes_only_steps() -> None:
    summary, _ = synthetic_run("old/a")
    trial = summary.trials[0]
    assert [s.name for s in trial.steps] == ["single", "sweep"]
    assert trial.single is trial.steps[0].result and trial.sweep is trial.steps[1].result
    doc = trial.model_dump(mode="json")
    assert "single" not in doc and "sweep" not in doc and [s["name"] for s in doc["steps"]] == ["single", "sweep"]
    legacy = {k: v for k, v in doc.items() if k != "steps"} | {"single": doc["steps"][0]["result"], "sweep": None}
    again = Trial.model_validate(legacy)
    assert [s.name for s in again.steps] == ["single"] and again.sweep is None
    # a run's levels in the store are filed under their step's name
    assert {row[1] for row in level_rows(summary)} == {"single", "sweep"}
    assert [lv.tag for lv in levels_of(summary.model_dump(mode="json"), Path("x"))] == \
        [lv.tag for lv in summary.trials[0].levels]


def test_the_default_steps_are_single_then_the_sweep_as_before() -> None:
    bench = BenchSettings()
    single, sweep = bench.options(None)
    steps = bench.step_options(None)
    assert [(name, o.mode) for name, o in steps] == [("single", "single"), ("sweep", "sweep")]
    assert steps[0][1] == single and steps[1][1] == sweep
    assert [n for n, _ in BenchSettings(sweep=False).step_options(None)] == ["single"]
    turns = BenchSettings(multiturn={"users": 2, "turns": 2}).step_options(None)
    assert [(n, o.mode) for n, o in turns] == [("single", "single"), ("multiturn", "multiturn")]
    # `steps: [single, sweep]` is the same bench as no steps
    plain = BenchSettings(steps=["single", "sweep"]).step_options(None)
    assert [(n, o) for n, o in plain] == [(n, o) for n, o in steps]


def test_a_cells_key_is_unchanged_without_steps() -> None:
    """Resuming an experiment file written before steps existed finds its complete cells."""
    import hashlib
    import json

    exp = Experiment(name="x", cells=[{"name": "a", "url": "http://127.0.0.1:1"}])
    cell = exp.cells[0]
    # the key as it was computed before steps (and before cells had `on`, `remote_python` and `remote_dir`, which
    # did not exist then and are no part of a key now)
    before = {"cell": cell.model_dump(exclude={"bench", "verify", "on", "remote_python", "remote_dir"}),
              "bench": exp.bench_for(cell).model_dump(exclude={"steps"}), "verify": exp.verify_for(cell).model_dump(),
              "ready_timeout_s": exp.ready_timeout_s}
    assert exp.cell_key(cell) == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
    with_steps = Experiment(name="x", bench={"steps": ["single", "sweep"]},
                            cells=[{"name": "a", "url": "http://127.0.0.1:1"}])
    assert with_steps.cell_key(with_steps.cells[0]) != exp.cell_key(exp.cells[0])


EXPERIMENT = """name: steps
bench:
  max_tokens: 8
  min_requests: 4
  steps:
{steps}
cells:
  - {{name: a, url: "http://127.0.0.1:1", model: m}}
"""


def _experiment(steps: str) -> Experiment:
    return parse_experiment(EXPERIMENT.format(steps=steps), "exp.yaml")


def test_steps_take_servelab_bench_options_and_the_experiments_shared_settings() -> None:
    exp = _experiment(f"""    - single
    - {{mode: slo-search, slo: {{ttft_p99_ms: 500}}, rate: 2, max-rate: 8, max_probes: 3, duration: 2}}
    - {{mode: replay, trace: {TRACE}, block_tokens: 16, time_scale: 0.2, requests: 16}}""")
    (single, a), (search, b), (replay, c) = exp.bench_for(exp.cells[0]).step_options("m")
    assert (single, search, replay) == ("single", "slo-search", "replay")
    assert a.mode == "single" and a.workload.max_tokens == 8
    assert b.mode == "slo-search" and [s.key for s in b.plan.slos] == ["ttft_p99_ms"]
    assert b.plan.search_start == 2 and b.plan.max_rate == 8 and b.plan.max_probes == 3 and b.plan.duration_s == 2
    assert b.steady.min_completed == 4 and b.workload.max_tokens == 8  # the experiment's, where the step is silent
    assert c.mode == "replay" and c.plan.requests == 16 and c.workload.time_scale == 0.2
    assert c.workload.endpoint.endswith("/v1/completions")  # a trace's default, as `bench --mode replay`


@pytest.mark.parametrize("steps, words", [
    ("    - {mode: slo-search, slo: 'ttft_p99_ms=500', max_rat: 8}", ["exp.yaml:", "unknown option 'max_rat'"]),
    ("    - {mode: slo-search}", ["bench.steps", "needs latency targets"]),
    ("    - {mode: warp}", ["unknown mode 'warp'"]),
    ("    - {mode: replay, trace: no-such-trace.jsonl}", ["step 1 (replay)", "no-such-trace.jsonl"]),
    ("    - {mode: sweep, dataset: x.json, trace: y.jsonl}", ["`trace` is the replay's trace file"]),
    ("    - {mode: slo-search, slo: 'ttft_p99_ms=500', requests: many}", ["requests"]),
    ("    - {mode: rate, rate: 2}\n    - {mode: slo-search, slo: 'ttft_p99_ms=500'}",
     ["steps 1 and 2", "r<rate>"]),
    ("    - sweep\n    - {mode: slo-search, slo: 'ttft_p99_ms=500', search: concurrency}", ["c<concurrency>"]),
    ("    - {mode: rate, rate: 2}\n    - {mode: rate, rate: 4, name: rate}", ["both named 'rate'"]),
    # the mode's own refusals, checked with the file too, not when a cell's bench starts
    ("    - {mode: rate}", ["step 1 (rate)", "--mode rate needs one --rate"]),
    ("    - {mode: burst}", ["step 1 (burst)", "--mode burst needs --requests"]),
])
def test_a_bad_step_is_an_error_of_the_file_before_anything_runs(steps: str, words: list[str]) -> None:
    with pytest.raises(UserError) as err:
        _experiment(steps)
    for word in words:
        assert word in err.value.message, err.value.message


# ---- comparing SLO searches and replays, trial by trial ----

def _rate_level(tag: str, rate: float, ttft_ms: float, t0: int, rng: random.Random, n: int = 20):
    records = []
    for i in range(n):
        sched = t0 + int(i / rate * 1000 * NS)
        r = request(i, tag, sched + int(rng.uniform(0.1, 2.0) * NS), ttft_ms, 10.0, 4, rng)
        r.scheduled_ns = sched
        records.append(r)
    window = (t0, t0 + int((n - 1) / rate * 1000 * NS))
    level = summarize(records, tag=tag, mode="rate", concurrency=0, window=window)
    level.rate = rate
    return level, records


def _trial(index: int, ttft_ms: float, best: float, seed: int) -> tuple[Trial, list]:
    """One trial: an SLO search whose answer is `best` req/s (every lower rate met the targets, the next one up
    did not), then a replayed trace."""
    rng = random.Random(seed)
    t, levels, records, probes = 10_000 * NS * 1000, [], [], []
    for rate in (1.0, 2.0, 4.0, 8.0):
        level, recs = _rate_level(f"r{rate:g}", rate, ttft_ms if rate <= best else 500.0, t, rng)
        level.figures.update(goodput_figures(recs, SLOS, (t, t + int(level.window_s * 1e9))))
        level.slo = level_verdict(recs, SLOS)
        probes.append({"load": rate, "tag": level.tag, "passed": level.slo["passed"]})
        levels.append(level)
        records += recs
        t = max(r.t_end_ns for r in recs) + NS
    search = BenchResult(url="http://127.0.0.1:1", model="m", mode="slo-search", workload=dict(WORKLOAD),
                         levels=levels, search={"dimension": "rate", "targets": describe(SLOS), "probes": probes,
                                                "best": best, "lowest_failing": best * 2, "stop_reason": "bracketed"})
    search.headline = headline(search)
    trace, recs = _rate_level("trace", 4.0, ttft_ms, t, rng, n=16)
    replay = BenchResult(url="http://127.0.0.1:1", model="m", mode="replay", workload=dict(WORKLOAD), levels=[trace])
    replay.headline = headline(replay)
    for level in (*levels, trace):
        level.trial = index
    for r in records + recs:
        r.trial = index
    return Trial(index=index, steps=[Step(name="slo-search", result=search), Step(name="replay", result=replay)]), \
        records + recs


def _run(name: str, ttft_ms: float, bests: list[float], seed: int):
    trials, records = [], []
    for i, best in enumerate(bests):
        trial, recs = _trial(i, ttft_ms, best, seed + i)
        trials.append(trial)
        records += recs
    summary = RunSummary(run_id=f"exp/{name}", status="complete", trials=trials,
                         provenance=Provenance(started_at="2026-01-01T00:00:00Z", servelab_version="test"))
    summary.headline = run_headline(pooled_steps(trials, records))
    return from_summary(summary, records, name, f"exp/{name}", experiment_id="exp")


def test_slo_search_and_replay_figures_get_intervals_and_verdicts_paired_by_round() -> None:
    slow = _run("slow", ttft_ms=150.0, bests=[2.0, 2.0], seed=1)
    fast = _run("fast", ttft_ms=60.0, bests=[4.0, 8.0], seed=11)
    # pooled: the mean of the trials' answers, and the goodput at them window-weighted
    head = slow.headline
    assert head["slo.max_rate"].value == 2.0 and "mean of 2 trials" in head["slo.max_rate"].note
    assert fast.headline["slo.max_rate"].value == 6.0
    assert fast.steps[0].result.search["trials"][1]["best"] == 8.0
    comparison = compare_runs([slow, fast])
    rows = {row.key: row for row in comparison.rows}
    for key in ("slo.max_rate", "slo.goodput_req_s", "replay.ttft_ms", "replay.output_tok_s", "replay.lag_ms"):
        assert key in rows, sorted(rows)
        assert rows[key].figures[1].trials == 2 and len(rows[key].figures[1].trial_values) == 2
    assert rows["slo.max_rate"].figures[0].value == 2.0 and rows["slo.max_rate"].figures[1].value == 6.0
    assert rows["slo.max_rate"].ratios[1].trial_ratios == [2.0, 4.0]  # round by round
    assert rows["slo.max_rate"].ratios[1].verdict == "better"
    assert rows["slo.goodput_req_s"].ratios[1].verdict == "better"
    assert rows["replay.ttft_ms"].ratios[1].verdict == "better"  # lower is better
    sentence = next(v for v in comparison.verdicts if v.startswith("fast vs slow"))
    assert "highest rate meeting the SLO" in sentence and "replay TTFT" in sentence


def test_one_trial_a_side_shows_the_figures_and_says_why_there_is_no_verdict() -> None:
    slow = _run("slow", ttft_ms=150.0, bests=[2.0], seed=1)
    fast = _run("fast", ttft_ms=60.0, bests=[4.0], seed=11)
    rows = {row.key: row for row in compare_runs([slow, fast]).rows}
    assert rows["slo.max_rate"].ratios[1].verdict == "no interval"  # one answer a side: nothing to resample
    goodput = rows["slo.goodput_req_s"].ratios[1]
    assert goodput.verdict in ("too few trials", "within noise")
    if goodput.verdict == "too few trials":
        assert goodput.reason.startswith("no verdict: 1 clean trial")


def test_a_run_with_steps_round_trips_through_the_store(tmp_path: Path) -> None:
    from servelab.store.runs import load_run, save_run

    summary, records = _run("slow", ttft_ms=150.0, bests=[2.0, 2.0], seed=1), None
    data = summary
    doc = RunSummary(run_id="exp/slow", status="complete", trials=data.trials,
                     provenance=Provenance(started_at="2026-01-01T00:00:00Z", servelab_version="test"))
    with Store.open(tmp_path / "s.db") as store:
        save_run(store, doc, data.records, tmp_path)
        back, back_records, _ = load_run(store, "exp/slow")
        benches = store.db.execute("SELECT DISTINCT bench FROM levels ORDER BY bench").fetchall()
    assert back == doc and len(back_records) == len(data.records)
    assert [r[0] for r in benches] == ["replay", "slo-search"]


def test_the_report_charts_an_slo_search_and_shows_its_figures() -> None:
    from servelab.report.charts import all_charts
    from servelab.report.html import render_report

    runs = [_run("slow", ttft_ms=150.0, bests=[2.0, 2.0], seed=1), _run("fast", ttft_ms=60.0, bests=[4.0, 8.0],
                                                                            seed=11)]
    chart = next(c for c in all_charts(runs) if c["id"] == "goodput")
    assert [t["x"] for t in chart["data"]] == [[1.0, 2.0, 4.0, 8.0]] * 2
    page = render_report(runs, compare_runs(runs))
    for words in ("highest rate meeting the SLO", "goodput req/s at the SLO search", "replay lag ms", "slo-search"):
        assert words in page


def test_a_relative_trace_is_found_from_the_experiment_files_directory(tmp_path: Path, monkeypatch) -> None:
    from servelab.experiment.load import load_experiment

    (tmp_path / "exp" / "data").mkdir(parents=True)
    (tmp_path / "exp" / "data" / "trace.jsonl").write_bytes(TRACE.read_bytes())
    spec = tmp_path / "exp" / "exp.yaml"
    spec.write_text("name: e\nbench:\n  steps:\n    - {mode: replay, trace: data/trace.jsonl, requests: 4}\n"
                    "cells:\n  - {name: a, url: 'http://127.0.0.1:9'}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # where servelab runs has no data/trace.jsonl
    exp = load_experiment(Path("..") / "exp" / "exp.yaml")
    ((_, replay),) = exp.bench_for(exp.cells[0]).step_options("m")
    assert Path(replay.workload.path).resolve() == (tmp_path / "exp" / "data" / "trace.jsonl").resolve()
