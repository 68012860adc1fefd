"""Experiments: file errors name the field and the line; a cell that cannot start is recorded and the experiment
goes on; an interrupted experiment resumes, skipping the cells that completed.

Cells here are URLs of the calibration server (a scripted OpenAI-compatible server, fast and deterministic), or
an engine whose model does not exist (fails before anything starts), so no real engine is needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

import servelab.pipeline as pipeline
from servelab.calibration import Script, start_calibration_server
from servelab.errors import UserError
from servelab.experiment.default import default_experiment
from servelab.experiment.load import parse_experiment
from servelab.experiment.runner import ExperimentOptions, run_experiment
from servelab.store.db import Store
from servelab.store.export import export_run
from servelab.store.runs import list_runs, load_run

GOOD = """\
name: demo
bench:
  single_requests: 3
  max_tokens: 8
cells:
  - name: a
    engine: llamacpp
    model: smollm2
    parallel: 1
  - name: b
    url: http://127.0.0.1:9
"""


@pytest.mark.parametrize("text, where, field", [
    (GOOD.replace("parallel: 1", "parallel: one"), ":9:", "cells[0].parallel"),
    (GOOD.replace("    parallel: 1", "    paralel: 1"), ":9:", "cells[0].paralel"),
    (GOOD.replace("  max_tokens: 8", "  max_tokens: 0"), ":4:", "bench.max_tokens"),
    (GOOD.replace("    url: http://127.0.0.1:9", "    model: x"), ":10:", "cells[1]"),  # neither engine nor url
    (GOOD.replace("engine: llamacpp", "engine: llamacp"), ":7:", "cells[0].engine"),
    (GOOD.replace("name: demo\n", ""), ":1:", "name"),
    (GOOD.replace("  max_tokens: 8", "  max_tokens: [8"), ":", "not valid YAML"),
])
def test_an_invalid_experiment_names_the_field_and_the_line(text: str, where: str, field: str) -> None:
    with pytest.raises(UserError) as info:
        parse_experiment(text, "exp.yaml")
    message = info.value.message
    assert message.startswith("exp.yaml" + where), message
    assert field in message, message
    assert "\n" not in message


def test_a_valid_experiment_keys_cells_by_their_definition() -> None:
    exp = parse_experiment(GOOD, "exp.yaml")
    assert [c.name for c in exp.cells] == ["a", "b"]
    assert exp.cells[0].spec().parallel == 1 and exp.cells[1].spec() is None
    again = parse_experiment(GOOD, "exp.yaml")
    assert exp.cell_key(exp.cells[0]) == again.cell_key(again.cells[0])
    changed = parse_experiment(GOOD.replace("parallel: 1", "parallel: 2"), "exp.yaml")
    assert changed.cell_key(changed.cells[0]) != exp.cell_key(exp.cells[0])
    assert changed.cell_key(changed.cells[1]) == exp.cell_key(exp.cells[1])


def test_the_default_experiment_is_the_misconfigured_engine_against_the_well_configured_one() -> None:
    exp = default_experiment()
    assert [(c.name, c.engine, c.parallel) for c in exp.cells] == [("misconfigured", "llamacpp", 1),
                                                                    ("well-configured", "llamacpp", 8)]


@pytest.fixture(scope="module")
def calibration():
    with start_calibration_server(Script(output_tokens=6, ttft_ms=5, itl_ms=3)) as cal:
        yield cal


def _experiment(url: str, *cells: str) -> str:
    return ("name: demo\nbench: {single_requests: 3, max_tokens: 6, level_duration_s: 0.3, max_concurrency: 2, "
            "warmup: 0}\nverify: {enabled: false}\ncontention: {reruns: 0}\ncells:\n" + "".join(cells).replace("URL", url))


BROKEN = "  - {name: broken, engine: llamacpp, model: /no/such/model.gguf}\n"
FIRST = "  - {name: first, url: URL}\n"
SECOND = "  - {name: second, url: URL}\n"


def test_a_cell_that_cannot_start_is_recorded_and_the_experiment_goes_on(tmp_path: Path, calibration) -> None:
    exp = parse_experiment(_experiment(calibration.url, BROKEN, FIRST), "exp.yaml")
    result = run_experiment(exp, ExperimentOptions(out_root=tmp_path), Console(file=open("/dev/null", "w")))
    assert result.status == "complete"
    broken, first = result.cells
    assert broken.status == "failed" and "/no/such/model.gguf" in broken.reason
    assert first.status == "complete"
    assert result.any_failed
    # the failure is on disk and in the store, with its reason
    on_disk = json.loads((Path(broken.run_dir) / "summary.json").read_text())
    assert on_disk["status"] == "failed" and "/no/such/model.gguf" in on_disk["error"]
    with Store.open(tmp_path / "servelab.db") as store:
        rows = {r.cell_name: r for r in list_runs(store)}
        assert rows["broken"].status == "failed" and rows["first"].status == "complete"
        summary, records, _ = load_run(store, first.run_id)
        assert summary.headline["single.decode_tok_s"].value > 0 and records
    # one complete cell: nothing to compare, and the experiment says so
    assert result.comparison is None and "fewer than two" in result.comparison_error
    # a stored run can be shown and exported by its id
    shown = subprocess.run([sys.executable, "-m", "servelab.cli", "show", first.run_id, "--out", str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and first.run_id in shown.stdout and "single" in shown.stdout, shown.stderr
    paths, _ = export_run(first.run_id, "json", tmp_path / "export", tmp_path / "servelab.db")
    exported = json.loads((tmp_path / "export" / "records.json").read_text())
    assert len(exported) == len(records) and tmp_path / "export" / "levels.json" in paths


def test_an_interrupted_experiment_resumes_skipping_finished_cells(tmp_path: Path, calibration,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    exp = parse_experiment(_experiment(calibration.url, FIRST, SECOND), "exp.yaml")
    real_bench = pipeline.bench
    benched: list[str] = []

    def interrupt_second(url, opts, **kw):
        benched.append(opts.mode)
        if len(benched) == 3:  # the second cell's first bench step: as if Ctrl-C arrived
            raise KeyboardInterrupt
        return real_bench(url, opts, **kw)

    monkeypatch.setattr(pipeline, "bench", interrupt_second)
    quiet = Console(file=open("/dev/null", "w"))
    first_try = run_experiment(exp, ExperimentOptions(out_root=tmp_path), quiet)
    assert first_try.status == "interrupted"
    assert [c.status for c in first_try.cells] == ["complete", "interrupted"]

    benched.clear()
    second_try = run_experiment(exp, ExperimentOptions(out_root=tmp_path), quiet)
    assert second_try.status == "complete"
    assert second_try.experiment_id == first_try.experiment_id
    first, second = second_try.cells
    assert first.skipped and first.run_id == first_try.cells[0].run_id
    assert not second.skipped and second.status == "complete"
    assert second.run_id != first_try.cells[1].run_id  # the interrupted attempt is kept, not overwritten
    assert benched == ["single", "sweep"]  # only the unfinished cell was measured again
    assert second_try.comparison is not None and second_try.comparison.baseline == "first"
    assert Path(second_try.report).is_file()

    # complete now: running it again starts a new experiment
    third = run_experiment(exp, ExperimentOptions(out_root=tmp_path), quiet)
    assert third.experiment_id != first_try.experiment_id
    assert not any(c.skipped for c in third.cells)


@pytest.mark.parametrize("path", sorted((Path(__file__).parent.parent / "examples").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_the_examples_are_valid_experiments(path: Path) -> None:
    from servelab.experiment.load import load_experiment

    exp = load_experiment(path)
    assert len(exp.cells) >= 2 and len({exp.cell_key(c) for c in exp.cells}) == len(exp.cells)


def test_servelab_run_with_an_invalid_file_is_a_one_line_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "exp.yaml"
    bad.write_text(GOOD.replace("parallel: 1", "parallel: many"))
    proc = subprocess.run([sys.executable, "-m", "servelab.cli", "run", str(bad), "--out", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"{bad}:9: cells[0].parallel" in lines[0]
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written


def test_run_into_a_pipe_prints_the_level_it_is_measuring_while_it_runs(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep's level lines come when its bench ends: into a CI log, `run` printed nothing for the ~20 s of a
    sweep. It prints the level now running every PIPE_PROGRESS_S (10 s; 1 s here), as `bench` does."""
    import io
    import re

    monkeypatch.setattr(pipeline, "PIPE_PROGRESS_S", 1.0)
    printed = io.StringIO()
    with start_calibration_server(Script(output_tokens=40, ttft_ms=5, itl_ms=25)) as slow:  # ~1 s a request
        text = ("name: demo\nbench: {single_requests: 3, max_tokens: 40, sweep: false, warmup: 0}\n"
                "verify: {enabled: false}\ncontention: {reruns: 0}\ncells:\n" + FIRST.replace("URL", slow.url))
        result = run_experiment(parse_experiment(text, "exp.yaml"), ExperimentOptions(out_root=tmp_path),
                                Console(file=printed, width=80))
    assert result.status == "complete"
    lines = printed.getvalue().splitlines()
    live = [line for line in lines if re.match(r"single · \d+ s · [0-3]/3 requests · [\d,]+ tokens", line)]
    assert len(live) >= 2, printed.getvalue()  # ~3 s of single stream, a line a second
    # each comes before the level's result line, while the level runs
    result_line = next(i for i, line in enumerate(lines) if line.startswith("single:") or " single:" in line
                       or re.match(r"\s*(bench|single)\b.*tok/s", line))
    assert lines.index(live[0]) < result_line, printed.getvalue()


def test_with_trials_each_level_is_printed_once_as_it_ends(tmp_path: Path, calibration) -> None:
    """Trials print a line per level; a sweep's lines came all at once when the sweep ended. Each now comes as its
    level ends (before the next level's progress), and once."""
    import io
    import re
    import time

    from servelab.store.rundir import read_records, records_file

    class Stamped(io.StringIO):  # when each line was printed, on the clock the records' times are on
        stamps: list[tuple[int, str]] = []

        def write(self, text: str) -> int:
            self.stamps.append((time.perf_counter_ns(), text))
            return super().write(text)

    printed = Stamped()
    text = ("name: demo\ntrials: 2\nbench: {single_requests: 2, max_tokens: 6, level_duration_s: 0.3, "
            "max_concurrency: 2, warmup: 0, min_requests: 3}\nverify: {enabled: false}\ncontention: {reruns: 0}\ncells:\n"
            + FIRST.replace("URL", calibration.url))
    result = run_experiment(parse_experiment(text, "exp.yaml"), ExperimentOptions(out_root=tmp_path),
                            Console(file=printed, width=200))
    assert result.status == "complete"
    lines = printed.getvalue().splitlines()
    level_lines = [line.split()[:2] for line in lines if re.match(r"\s+(single|sweep)\s+(single|c\d+):", line)]
    assert level_lines == [["single", "single:"], ["sweep", "c1:"], ["sweep", "c2:"]] * 2, printed.getvalue()
    # the first c1 line was out before the first trial's c2 level sent anything
    c1_printed = next(t for t, chunk in printed.stamps if re.search(r"\bc1:", chunk))
    records = read_records(records_file(Path(result.cells[0].run_dir)))
    assert c1_printed < min(r.t_send_ns for r in records if r.tag == "c2" and r.trial == 0)
