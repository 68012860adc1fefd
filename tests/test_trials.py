"""Trials: the interleaved order, the hierarchical interval, verdicts that need every trial to agree, contended
trials left out or called out, older one-trial summaries, and an experiment of several trials end to end."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from rich.console import Console

from servelab.bench.trials import counted_trials, pooled_benches
from servelab.calibration import Script, start_calibration_server
from servelab.compare.bootstrap import MedianOf, Trials, figure_interval, interval, draws
from servelab.compare.compare import compare_runs, judge
from servelab.compare.metrics import KEY_METRICS
from servelab.compare.sources import from_summary
from servelab.experiment.load import parse_experiment
from servelab.experiment.runner import ExperimentOptions, run_experiment
from servelab.experiment.schedule import trial_schedule
from servelab.records import EnvironmentSummary, RunSummary
from servelab.store.db import Store
from servelab.store.runs import load_run
from tests.synthetic_runs import synthetic_run


# ---------------------------------------------------------------------------------------------------------------
# The order
# ---------------------------------------------------------------------------------------------------------------

def test_interleaved_rounds_alternate_direction_so_each_cell_runs_first_as_often() -> None:
    assert trial_schedule(["A", "B"], 4) == [("A", 0), ("B", 0), ("B", 1), ("A", 1), ("A", 2), ("B", 2),
                                             ("B", 3), ("A", 3)]
    three = trial_schedule(["A", "B", "C"], 2)
    assert three == [("A", 0), ("B", 0), ("C", 0), ("C", 1), ("B", 1), ("A", 1)]


def test_shuffled_rounds_are_seeded_and_hold_every_cell_once() -> None:
    cells = ["A", "B", "C", "D"]
    one = trial_schedule(cells, 6, "shuffled", seed=7)
    assert one == trial_schedule(cells, 6, "shuffled", seed=7)
    assert one != trial_schedule(cells, 6, "shuffled", seed=8)
    for t in range(6):
        assert sorted(c for c, i in one if i == t) == cells
        # round t occupies slots 4t .. 4t+3: trial t of every cell runs before trial t+1 of any
        assert {i for _, i in one[4 * t:4 * t + 4]} == {t}
    assert len({tuple(c for c, i in one if i == t) for t in range(6)}) > 1  # not the same order every round


def test_blocked_runs_each_cell_to_the_end() -> None:
    assert trial_schedule(["A", "B"], 2, "blocked") == [("A", 0), ("A", 1), ("B", 0), ("B", 1)]
    with pytest.raises(ValueError):
        trial_schedule(["A"], 0)


# ---------------------------------------------------------------------------------------------------------------
# The hierarchical interval
# ---------------------------------------------------------------------------------------------------------------

def _trial_values(offsets: list[float], n: int = 40, seed: int = 1) -> list[list[float]]:
    rng = random.Random(seed)
    return [[100 + off + rng.gauss(0, 2) for _ in range(n)] for off in offsets]


def test_a_trial_offset_widens_the_interval_where_pooling_requests_cannot_see_it() -> None:
    same = Trials([MedianOf(v) for v in _trial_values([0, 0, 0])])
    apart = Trials([MedianOf(v) for v in _trial_values([-15, 0, 15])])
    pooled_requests = MedianOf([x for v in _trial_values([-15, 0, 15]) for x in v])
    ci_same, ci_apart = figure_interval(same, "a"), figure_interval(apart, "b")
    ci_requests = figure_interval(pooled_requests, "c")
    width = lambda ci: ci.high - ci.low  # noqa: E731
    assert width(ci_same) < 3  # requests alone: tight
    # trials 15 apart: the interval spans most of the spread between trials ...
    assert width(ci_apart) > 15 and ci_apart.low < 95 and ci_apart.high > 105
    # ... while resampling the same requests without their trials would have claimed a tight figure
    assert width(ci_requests) < width(ci_apart) / 2
    assert apart.trials == 3 and apart.n == 120
    assert apart.trial_points() == pytest.approx([85, 100, 115], abs=2)


def test_one_trial_is_the_plain_request_bootstrap() -> None:
    values = _trial_values([0])[0]
    one, plain = Trials([MedianOf(values)]), MedianOf(values)
    assert one.point() == plain.point()
    a = interval(draws(one, random.Random(3)))
    b = interval(draws(plain, random.Random(3)))
    # the same units drawn the same number of times: the same kind of interval (not the same draws: Trials
    # spends one draw of the rng choosing the trial)
    assert abs((a.high - a.low) - (b.high - b.low)) < 1.0


def test_the_verdict_needs_every_trial_to_agree() -> None:
    metric = KEY_METRICS["single.decode_tok_s"]  # higher is better
    from servelab.compare.bootstrap import Interval

    assert judge(Interval(1.2, 1.5), metric, [1.3, 1.25, 1.4]) == "better"
    assert judge(Interval(1.2, 1.5), metric, [1.3, 0.9, 1.4]) == "inconsistent"
    assert judge(Interval(0.5, 0.8), metric, []) == "worse"  # one trial each: the interval alone
    assert judge(Interval(0.9, 1.4), metric, [1.3, 0.95]) == "within noise"


# ---------------------------------------------------------------------------------------------------------------
# Runs of several trials, compared
# ---------------------------------------------------------------------------------------------------------------

def multi_trial(name: str, itl_per_trial: list[float], contended: set[int] = frozenset(), slots: int = 8,
                experiment: str = "exp") -> tuple[RunSummary, list]:
    """A run whose trial i is a synthetic run at itl_per_trial[i]; trials in `contended` had a busy machine."""
    summary = None
    records = []
    for i, itl in enumerate(itl_per_trial):
        s, recs = synthetic_run(f"{experiment}/{name}", itl_ms=itl, slots=slots, seed=10 * i + len(name))
        trial = s.trials[0].model_copy(update={"index": i})
        for level in trial.levels:
            level.trial = i
            if i in contended:
                level.environment = EnvironmentSummary(samples=4, contended=True,
                                                       reasons=["other processes used 0.98 cores on average"])
        for r in recs:
            r.trial = i
        records += recs
        if summary is None:
            summary = s
            summary.trials = [trial]
        else:
            summary.trials.append(trial)
    return summary, records


def _data(name: str, itls: list[float], **kw):
    summary, records = multi_trial(name, itls, **kw)
    return from_summary(summary, records, name, f"exp/{name}", experiment_id="exp")


def test_trials_that_agree_give_a_verdict_and_their_ratios() -> None:
    base = _data("slow", [30.0, 31.0, 29.0])
    fast = _data("fast", [20.0, 21.0, 19.5])
    comparison = compare_runs([base, fast])
    row = next(r for r in comparison.rows if r.key == "single.decode_tok_s")
    cell = row.ratios[1]
    assert cell.verdict == "better"
    assert len(cell.trial_ratios) == 3 and all(r > 1.3 for r in cell.trial_ratios)
    assert row.figures[1].trials == 3 and len(row.figures[1].trial_values) == 3
    assert not any("one trial per run" in w for w in comparison.warnings)


def test_trials_that_disagree_never_give_a_direction() -> None:
    # trial 1: the candidate far faster; trial 2: far slower; trial 3: the same. Each trial alone is sharp.
    base = _data("a", [30.0, 20.0, 25.0])
    other = _data("b", [20.0, 30.0, 25.0])
    comparison = compare_runs([base, other])
    for row in comparison.rows:
        if row.key in ("single.decode_tok_s", "single.itl_ms"):  # TTFT is the same in every trial here
            cell = row.ratios[1]
            assert cell.verdict in ("within noise", "inconsistent"), (row.key, cell)
            assert any(r > 1.2 for r in cell.trial_ratios) and any(r < 0.85 for r in cell.trial_ratios)
    sentence = " ".join(comparison.verdicts)
    assert "trials ×" in sentence


def test_a_contended_trial_is_left_out_and_named() -> None:
    clean = _data("steady", [20.0, 20.5, 19.5])
    # trial 2 of the candidate ran beside a CPU hog and was three times slower
    hit = _data("hit", [20.0, 60.0, 20.3], contended={1})
    assert hit.counted == [0, 2] and hit.excluded == [1]
    comparison = compare_runs([clean, hit])
    row = next(r for r in comparison.rows if r.key == "single.decode_tok_s")
    assert row.ratios[1].verdict == "within noise"
    assert row.figures[1].trials == 2
    assert any("hit: trial(s) 2 ran on a contended machine" in w and "0.98 cores" in w
               for w in comparison.warnings)


def test_when_every_trial_was_contended_no_verdict_rests_on_them() -> None:
    clean = _data("steady", [30.0, 30.5, 29.5])
    busy = _data("busy", [20.0, 20.2, 19.8], contended={0, 1, 2})
    assert busy.all_contended
    comparison = compare_runs([clean, busy])
    verdicts = {r.key: r.ratios[1].verdict for r in comparison.rows}
    assert verdicts["single.decode_tok_s"] == "contended"
    assert "better" not in verdicts.values() and "worse" not in verdicts.values()
    assert any("every trial ran on a contended machine" in w for w in comparison.warnings)


def test_pooled_figures_are_the_same_definitions_over_every_counted_trial() -> None:
    summary, records = multi_trial("p", [20.0, 30.0])
    counted, excluded = counted_trials(summary.trials)
    single, sweep = pooled_benches(counted, records)
    assert not excluded
    per_request = [r for r in records if r.tag == "single" and r.ok]
    from servelab.bench import metrics as m

    decode = sorted(m.decode_tok_s(r) for r in per_request)
    assert single.levels[0].figures["decode_tok_s"].value == pytest.approx(m.percentile(decode, 50))
    c4 = [s for t in summary.trials for s in t.sweep.levels if s.tag == "c4"]
    expected = sum(s.figures["output_tok_s"].value * s.window_s for s in c4) / sum(s.window_s for s in c4)
    pooled_c4 = next(s for s in sweep.levels if s.tag == "c4")
    assert pooled_c4.figures["output_tok_s"].value == pytest.approx(expected)
    assert "2 trials" in pooled_c4.figures["output_tok_s"].note


def test_a_summary_from_before_trials_reads_as_one_trial_and_compare_says_what_it_cannot_see() -> None:
    old, records = synthetic_run("old/a")
    doc = old.model_dump(mode="json")
    legacy = {k: v for k, v in doc.items() if k not in ("trials", "excluded_trials")}
    steps = {s["name"]: s["result"] for s in doc["trials"][0]["steps"]}
    legacy["single"], legacy["sweep"] = steps["single"], steps["sweep"]
    again = RunSummary.model_validate(legacy)
    assert len(again.trials) == 1 and again.trials[0].sweep.levels[-1].tag == "c4"
    other, other_records = synthetic_run("old/b", itl_ms=10.0, seed=3)
    comparison = compare_runs([from_summary(again, records, "a", "old/a"),
                               from_summary(other, other_records, "b", "old/b")])
    assert any("one trial per run" in w for w in comparison.warnings)
    assert comparison.rows[0].ratios[1].trial_ratios == []


# ---------------------------------------------------------------------------------------------------------------
# An experiment of several trials, end to end (calibration server cells: no engine needed)
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def calibration():
    with start_calibration_server(Script(output_tokens=6, ttft_ms=5, itl_ms=3)) as cal:
        yield cal


def test_an_experiment_runs_its_trials_interleaved_and_every_trial_measures_the_same_levels(
        tmp_path: Path, calibration) -> None:
    # contention: {reruns: 0}: a contended trial is only left out here (what reruns do: test_contention.py)
    text = ("name: trials\ntrials: 2\nbench: {single_requests: 3, max_tokens: 6, level_duration_s: 0.3, "
            "max_concurrency: 2, warmup: 0}\nverify: {enabled: false}\ncontention: {reruns: 0}\ncells:\n"
            f"  - {{name: a, url: {calibration.url}}}\n  - {{name: b, url: {calibration.url}}}\n")
    exp = parse_experiment(text, "exp.yaml")
    result = run_experiment(exp, ExperimentOptions(out_root=tmp_path), Console(file=open("/dev/null", "w")))
    assert result.status == "complete" and [c.status for c in result.cells] == ["complete", "complete"]
    runs = {s.run_id.split("/")[-1]: s for s in result.runs}
    slots = sorted((t.slot, name, t.index) for name, s in runs.items() for t in s.trials)
    assert [(name, index) for _, name, index in slots] == [("a", 0), ("b", 0), ("b", 1), ("a", 1)]
    for summary in runs.values():
        first, second = summary.trials
        assert [s.tag for s in second.sweep.levels] == [s.tag for s in first.sweep.levels]
        assert all(s.trial == 1 for s in second.levels)
    with Store.open(tmp_path / "servelab.db") as store:
        summary, records, _ = load_run(store, result.cells[0].run_id)
        assert {r.trial for r in records} == {0, 1}
        rows = store.db.execute("SELECT DISTINCT trial FROM levels WHERE run_id = ?",
                                (result.cells[0].run_id,)).fetchall()
        assert sorted(r[0] for r in rows) == [0, 1]
    assert result.comparison is not None
    # both trials count, unless the machine was busy during one (then it is left out, and named)
    counted = {r.name: r.trials for r in result.comparison.runs}
    assert all(n == 2 - len(r.excluded_trials) for r in result.comparison.runs for n in [counted[r.name]])
    for row in result.comparison.rows:
        for run, f in zip(result.comparison.runs, row.figures):
            if f.value is not None:
                assert f.trials == run.trials
