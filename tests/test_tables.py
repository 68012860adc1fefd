"""Every table at 80 columns and through a pipe: every number and id whole, on one line, never cut with `…`.

The runs here carry the numbers that were cut before (TTFT of 1,690 ms and more, E2E of five digits, peak
throughput in the thousands) and run ids as long as `servelab run` makes them.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest
from rich.console import Console

from servelab.compare.compare import compare_runs
from servelab.compare.sources import from_summary, literal_run
from servelab.experiment.runner import CellOutcome, ExperimentResult
from servelab.records import CheckResult, VerifyResult
from servelab.report.compare_terminal import render_comparison, render_experiment, render_runs
from servelab.report.tables import PIPE_WIDTH, make_console
from servelab.report.terminal import _HEADLINE_LABELS as HEADLINE_LABELS
from servelab.report.terminal import fmt, render_checks, render_headline, render_levels
from servelab.store.runs import RunRow
from synthetic_runs import synthetic_run

EXP = "20261130-132435-llamacpp-vs-transformers"
IDS = [f"{EXP}/misconfigured-one-slot", f"{EXP}/well-configured-eight-slots", f"{EXP}/transformers-serve-cb"]


def runs():
    slow = synthetic_run(IDS[0], slots=1, seed=1, serious=True, ttft_ms=1690.4, itl_ms=120.3)
    fast = synthetic_run(IDS[1], slots=8, seed=2, ttft_ms=12.5, itl_ms=0.41, tokens=64)
    third = synthetic_run(IDS[2], slots=4, seed=3, ttft_ms=310.0, itl_ms=7.7)
    return [from_summary(*s, s[0].run_id.split("/")[1], s[0].run_id) for s in (slow, fast, third)], \
        [s[0] for s in (slow, fast, third)]


def render(width: int, draw) -> str:
    console = Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None)
    draw(console)
    return console.file.getvalue()


def assert_whole(text: str, tokens: list[str], width: int | None) -> None:
    assert "…" not in text, text
    lines = text.splitlines()
    for token in tokens:
        assert any(token in line for line in lines), f"{token!r} is not whole on one line:\n{text}"
    if width is not None:
        too_long = [line for line in lines if len(line) > width]
        assert not too_long, too_long


def level_numbers(bench) -> list[str]:
    out = []
    for s in bench.levels:
        f = s.figures
        out += [s.tag, fmt(f["output_tok_s"].value), fmt(f["request_s"].value, 2), fmt(f["decode_tok_s"].value),
                fmt(f["ttft_ms"].dist.p50), fmt(f["ttft_ms"].dist.p99), fmt(f["itl_ms"].dist.p50),
                fmt(f["itl_ms"].dist.p99), fmt(f["e2e_ms"].value, 0)]
    return out


@pytest.mark.parametrize("width", [80, PIPE_WIDTH], ids=["80-columns", "pipe"])
def test_levels_and_headline_keep_every_number_whole(width):
    data, _ = runs()
    bench = data[0].sweep
    numbers = level_numbers(bench)
    assert any(len(n) >= 6 for n in numbers)  # five-digit E2E ms, 1,690.4-style TTFTs
    text = render(width, lambda c: render_levels(c, bench))
    assert_whole(text, numbers, 80 if width == 80 else None)
    headline = data[0].headline
    text = render(width, lambda c: render_headline(c, headline))
    shown = [f for k, f in headline.items() if k in HEADLINE_LABELS]
    assert len(shown) >= 5
    assert_whole(text, [fmt(f.value, 2 if f.unit == "req/s" else 1) for f in shown], 80 if width == 80 else None)
    assert "single-stream decode tok/s" in text


def test_a_level_table_s_headers_are_whole_at_80_columns():
    """A header is as whole as its numbers: the table is split rather than its headers cropped to the numbers'
    width ("leve" for "level", "ok/sen" for "ok/sent")."""
    from servelab.bench.figures import LEVEL_FIGURES

    summary, _ = synthetic_run("narrow", max_concurrency=8)  # short numbers: narrow columns
    text = render(80, lambda c: render_levels(c, summary.trials[0].sweep))
    words = {word for line in text.splitlines() for word in re.findall(r"[A-Za-z0-9/]+", line)}
    headers = ["level", "ok/sent"] + [w for f in LEVEL_FIGURES for col in f.terminal
                                      for line in col.header.splitlines() for w in line.split()]
    assert headers[2:], "the figure table names terminal columns"
    missing = [h for h in headers if h not in words]
    assert not missing, (missing, text)


@pytest.mark.parametrize("width", [80, PIPE_WIDTH], ids=["80-columns", "pipe"])
def test_the_comparison_keeps_figures_intervals_ratios_and_names_whole(width):
    data, _ = runs()
    literal = literal_run("given figures", {"single.decode_tok_s": 82.5, "peak.output_tok_s": 1536.0})
    comparison = compare_runs([literal, *data])
    tokens = [r.name for r in comparison.runs]
    for row in comparison.rows:
        digits = 2 if row.unit == "req/s" else 1
        for fig, ratio in zip(row.figures, row.ratios):
            if fig.value is not None:
                tokens.append(fmt(fig.value, digits))
            if fig.ci:
                tokens += [fmt(fig.ci[0], digits), fmt(fig.ci[1], digits)]
            if ratio.verdict != "baseline" and ratio.ratio is not None:
                tokens.append(f"×{ratio.ratio:.2f}")
    text = render(width, lambda c: render_comparison(c, comparison))
    assert_whole(text.split("↑ higher is better")[0], tokens, 80 if width == 80 else None)
    assert "comparison (baseline: given figures)" in text  # never "baseline: baseline"


@pytest.mark.parametrize("width", [80, PIPE_WIDTH], ids=["80-columns", "pipe"])
def test_runs_and_experiment_keep_ids_on_one_line(width):
    data, summaries = runs()
    rows = [RunRow(run_id=s.run_id, started_at=None, status="complete", engine="llamacpp",
                   model="SmolLM2-135M-Instruct.Q4_1.gguf", cell_name=s.run_id.split("/")[1], experiment_id=EXP,
                   representative=i != 0, decode_tok_s=s.headline["single.decode_tok_s"].value,
                   peak_output_tok_s=s.headline["peak.output_tok_s"].value, run_dir=None)
           for i, s in enumerate(summaries)]
    text = render(width, lambda c: render_runs(c, rows))
    assert_whole(text, IDS + [fmt(r.decode_tok_s) for r in rows] + [fmt(r.peak_output_tok_s) for r in rows]
                 + ["SmolLM2-135M-Instruct.Q4_1.gguf"], 80 if width == 80 else None)
    result = ExperimentResult(experiment_id=EXP, name="llamacpp-vs-transformers", source="x", status="complete",
                              out_dir="runs/x", runs=summaries,
                              cells=[CellOutcome(name=s.run_id.split("/")[1], key="k", status="complete",
                                                 run_id=s.run_id) for s in summaries])
    text = render(width, lambda c: render_experiment(c, result))
    assert_whole(text, IDS + [fmt(s.headline["peak.output_tok_s"].value) for s in summaries],
                 80 if width == 80 else None)


def test_verify_counts_the_checks_it_did_not_select_instead_of_a_row_each():
    checks = [CheckResult(id="models", title="", outcome="pass", reason="lists 1 model: smollm2"),
              CheckResult(id="chat", title="", outcome="warn", reason="the answer is not 4"),
              CheckResult(id="chat_stream", title="", outcome="pass", reason="11 chunks")]
    checks += [CheckResult(id=f"check_{i}", title="", outcome="skip", reason="not selected") for i in range(15)]
    text = render(80, lambda c: render_checks(c, VerifyResult(url="http://127.0.0.1:8080", model="m",
                                                              checks=checks)))
    assert "not selected" not in text and "SKIP" not in text
    assert "2 pass, 1 warn (3 of 18 checks selected)" in text
    assert_whole(text, ["chat_stream", "models", "http://127.0.0.1:8080"], 80)


def test_a_pipe_has_no_width_limit_and_keeps_rules_80_wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    console = make_console()  # pytest's stdout is not a terminal
    assert console.width == PIPE_WIDTH
    out = io.StringIO()
    console.file = out
    console.rule("cell 1/2: misconfigured")
    console.print("x" * 200)
    lines = out.getvalue().splitlines()
    assert len(lines[0]) == 80 and lines[1] == "x" * 200


def cli(*args: str) -> str:
    env = dict(os.environ, COLUMNS="80")
    done = subprocess.run([sys.executable, "-m", "servelab.cli", *args], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_help_at_80_columns_cuts_no_option_and_shows_no_bool_placeholder():
    for command in ("bench", "up", "run", "doctor", "compare", "verify"):
        text = cli(command, "--help")
        assert not re.search(r"\S…", text) and "<bool>" not in text  # "1, 2, 4, …" is the text's own
        assert all(len(line) <= 80 for line in text.splitlines())
        assert not re.search(r"[a-z]-\n", text), "a hyphenated word was split across lines"
    bench = cli("bench", "--help")
    for option in ("--output-from-dataset", "--no-output-from-dataset", "--ignore-eos", "--max-level-duration",
                   "--max-error-rate", "--min-requests", "--prefix-group-size", "rate-sweep", "slo-search"):
        assert option in bench, option


def test_up_help_lists_every_engine():
    from servelab.engines import REGISTRY

    text = " ".join(cli("up", "--help").split())
    for name in REGISTRY:
        assert re.search(rf"(^|[ (,]){re.escape(name)}([ ,)]|$)", text), name
