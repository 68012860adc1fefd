"""Compare: bootstrap intervals and verdicts on runs with known differences, literal baselines, comparability
warnings, the regression gate, and the command line's exit codes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.compare.bootstrap import BinnedRate, MedianOf, figure_interval, ratio_interval, time_bins
from servelab.compare.compare import NoCommonMetrics, compare_runs, regressions
from servelab.compare.sources import from_summary, literal_run, load_run_dir
from servelab.records import Figure
from servelab.store.rundir import RunDir
from synthetic_runs import synthetic_run


def run(name: str, trials: int = 2, **kw):
    """A synthetic run of two trials by default: a better/worse verdict needs two clean trials on each side."""
    summary, records = synthetic_run(name, trials=trials, **kw)
    return from_summary(summary, records, name, name)


def row(comparison, key):
    return next(r for r in comparison.rows if r.key == key)


def test_one_trial_a_side_gives_no_direction_however_clear_the_interval() -> None:
    # Twice the decode speed, a sharp interval, but each side is one run: nothing between runs backs a direction.
    base, faster = run("base", trials=1, itl_ms=20.0, seed=1), run("faster", trials=1, itl_ms=10.0, seed=2)
    c = compare_runs([base, faster])
    decode = row(c, "single.decode_tok_s")
    assert decode.ratios[1].ci[0] > 1.5  # the interval alone would have said "better"
    assert decode.ratios[1].verdict == "too few trials"
    assert decode.ratios[1].reason.startswith("no verdict: 1 clean trial (base: 1 of 1; faster: 1 of 1;")
    assert "better" not in " ".join(c.verdicts) and "no verdict: 1 clean trial" in " ".join(c.verdicts)
    assert any("one trial per run" in w and "no better/worse verdict" in w for w in c.warnings)
    # two trials on one side are not enough while the other side has one
    c = compare_runs([run("base", trials=1, itl_ms=20.0, seed=1), run("faster", itl_ms=10.0, seed=2)])
    assert row(c, "single.decode_tok_s").ratios[1].reason.startswith("no verdict: 1 clean trial (base: 1 of 1;")
    # a literal baseline is one fixed figure, not a measurement: the measured side alone needs its two trials
    assert row(compare_runs([literal_run("vllm", {"single.decode_tok_s": 82.5}), faster]),
               "single.decode_tok_s").ratios[1].verdict == "too few trials"
    assert row(compare_runs([literal_run("vllm", {"single.decode_tok_s": 82.5}), run("faster", itl_ms=10.0)]),
               "single.decode_tok_s").ratios[1].verdict == "better"


def test_a_clearly_faster_run_is_better_and_identical_distributions_are_within_noise() -> None:
    base = run("base", itl_ms=20.0, seed=1)
    faster = run("faster", itl_ms=10.0, seed=2)  # twice the decode speed
    same = from_summary(*synthetic_run("base", itl_ms=20.0, seed=1), "same", "same")  # the very same records
    c = compare_runs([base, faster, same])
    decode = row(c, "single.decode_tok_s")
    assert decode.ratios[1].verdict == "better"
    assert decode.ratios[1].ratio == pytest.approx(2.0, rel=0.05)
    lo, hi = decode.ratios[1].ci
    assert lo < decode.ratios[1].ratio < hi and lo > 1
    assert decode.ratios[2].verdict == "within noise"
    assert decode.ratios[2].ci[0] < 1 < decode.ratios[2].ci[1]
    # lower is better for latency: halving ITL is "better", not "worse"
    assert row(c, "single.itl_ms").ratios[1].verdict == "better"
    assert row(c, "single.itl_ms").ratios[1].ratio == pytest.approx(0.5, rel=0.05)
    # the figures themselves are the runs' own headline values, untouched
    assert decode.figures[1].value == faster.headline["single.decode_tok_s"].value
    assert decode.figures[1].n == 24  # two trials of 12 requests


def test_the_slot_limited_run_is_worse_at_peak_and_not_representative() -> None:
    good = run("good", slots=8, seed=1)
    bad = run("bad", slots=1, seed=2, serious=True)
    c = compare_runs([good, bad])
    peak = row(c, "peak.output_tok_s")
    assert peak.ratios[1].verdict == "worse" and peak.ratios[1].ratio < 0.5
    # one stream uses one slot either way: single-stream decode does not tell them apart
    assert row(c, "single.decode_tok_s").ratios[1].verdict == "within noise"
    assert any("bad is NOT REPRESENTATIVE" in w for w in c.warnings)
    assert "bad is slower than good at peak" in " ".join(c.verdicts)
    assert not c.runs[1].representative
    # under the sweep's top load the one-slot server makes requests queue: TTFT much higher (lower is better)
    load = row(c, "load.ttft_ms")
    assert load.ratios[1].verdict == "worse" and load.ratios[1].ratio > 2
    assert [f.where for f in load.figures] == ["c4", "c4"]
    assert load.figures[1].value == bad.sweep.levels[-1].figures["ttft_ms"].value
    assert "bad answers slower than good under load: TTFT p50 at c4" in " ".join(c.verdicts)


def test_latency_under_load_at_different_levels_is_flagged() -> None:
    c = compare_runs([run("four", max_concurrency=4, slots=1), run("two", max_concurrency=2, slots=1)])
    assert [f.where for f in row(c, "load.ttft_ms").figures] == ["c4", "c2"]
    assert any("measured at different levels (c2, c4)" in w and "no verdict" in w for w in c.warnings)
    # TTFT at c2 against TTFT at c4 is a different load, not a better server: the ratio is shown, no verdict given,
    # no sentence claims one answers faster, and the regression gate does not count it.
    cell = row(c, "load.ttft_ms").ratios[1]
    assert cell.verdict == "different levels" and cell.ratio is not None and cell.ratio < 1
    assert not any("under load" in v for v in c.verdicts)
    assert any("no verdict (measured at c2 vs c4)" in v for v in c.verdicts)
    assert not any("TTFT ms (p50) at the top concurrency" in r for r in regressions(c, 0))
    assert not any("TTFT ms (p50) at the top concurrency" in r
                   for r in regressions(compare_runs([run("two", max_concurrency=2, slots=1),
                                                      run("four", max_concurrency=4, slots=1)]), 0))


def test_intervals_narrow_with_more_data_and_reproduce() -> None:
    few = MedianOf([10.0, 12.0, 11.0, 9.0, 13.0])
    many = MedianOf([10.0, 12.0, 11.0, 9.0, 13.0] * 20)
    a, b = figure_interval(few, "k"), figure_interval(many, "k")
    assert (b.high - b.low) < (a.high - a.low)
    assert figure_interval(few, "k") == a  # seeded: the same data gives the same interval
    assert figure_interval(MedianOf([5.0]), "k") is None  # one request: no interval


def test_throughput_bins_count_only_the_window() -> None:
    events = [(1_000_000_000 + i * 100_000_000, 2) for i in range(30)]  # 2 tokens every 0.1 s for 3 s
    counts, bin_s = time_bins(events, start_ns=1_000_000_000, window_s=2.0)
    assert len(counts) == 10 and bin_s == pytest.approx(0.2)
    assert sum(counts) == 2 * 21  # events at 0.0 .. 2.0 s inclusive, as output tok/s counts them
    sampler = BinnedRate(counts, bin_s)
    assert sampler.point() == pytest.approx(21.0)


def test_literal_baselines_have_no_interval_and_say_so() -> None:
    ours = run("ours", itl_ms=20.0)  # ~50 tok/s single-stream decode
    vllm = literal_run("baseline", {"single.decode_tok_s": 82.5, "peak.output_tok_s": 1536})
    c = compare_runs([vllm, ours])
    decode = row(c, "single.decode_tok_s")
    assert decode.figures[0].value == 82.5 and decode.figures[0].ci is None
    assert decode.ratios[1].verdict == "worse"
    assert decode.ratios[1].ratio == pytest.approx(ours.headline["single.decode_tok_s"].value / 82.5)
    # the interval is the candidate's own noise over a fixed number
    lo, hi = decode.ratios[1].ci
    own = decode.figures[1].ci
    assert lo == pytest.approx(own[0] / 82.5, rel=0.02) and hi == pytest.approx(own[1] / 82.5, rel=0.02)
    assert any("literal" in w and "no interval" in w for w in c.warnings)
    assert {r.key for r in c.rows} == {"single.decode_tok_s", "peak.output_tok_s"}
    assert ratio_interval(MedianOf([1.0, 2.0]), 2.0, "k") is not None


def test_no_common_metrics_is_said_in_one_line() -> None:
    only_goodput = literal_run("baseline", {"slo.goodput_req_s": 3.0})
    with pytest.raises(NoCommonMetrics, match="no common metrics"):
        compare_runs([only_goodput, run("ours")])


def test_workloads_that_differ_are_flagged() -> None:
    a = run("a")
    b = run("b")
    b.single.workload["max_tokens"] = 64
    b.single.workload["ignore_eos"] = False
    b.headline["single.decode_tok_s"] = b.headline["single.decode_tok_s"].model_copy(
        update={"counted_by": "chunk_count"})
    warnings = " ".join(compare_runs([a, b]).warnings)
    assert "workloads differ" in warnings and "max_tokens 32 vs 64" in warnings and "ignore_eos" in warnings
    assert "counted by server_per_chunk for a but by chunk_count for b" in warnings
    assert "workloads differ" not in " ".join(compare_runs([a, run("c")]).warnings)


def test_the_regression_gate_looks_beyond_noise() -> None:
    base = run("base", itl_ms=20.0, seed=1)
    slower = run("slower", itl_ms=30.0, seed=2)  # decode ~33 % slower
    c = compare_runs([base, slower])
    assert any("single-stream decode tok/s" in line for line in regressions(c, 10))
    assert not any("single-stream decode tok/s" in line for line in regressions(c, 50))
    same = compare_runs([base, run("same", itl_ms=20.0, seed=1)])
    assert regressions(same, 0) == []  # within noise is never a regression, whatever the threshold


# ---------------------------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------------------------

SERVELAB = [sys.executable, "-m", "servelab.cli"]


def write_run_dir(root: Path, name: str, **kw) -> Path:
    summary, records = synthetic_run(name, **kw)
    rundir = RunDir(root / name)
    for r in records:
        rundir.append_record(r)
    rundir.close()
    rundir.write_json("summary.json", summary)
    return rundir.path


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*SERVELAB, *args, "--out", str(cwd / "runs")], capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def test_compare_command_exit_codes(tmp_path: Path) -> None:
    base = write_run_dir(tmp_path, "base", itl_ms=20.0, seed=1)
    slower = write_run_dir(tmp_path, "slower", itl_ms=30.0, seed=2)
    assert load_run_dir(base).headline["single.decode_tok_s"].value > 0

    ok = cli("compare", str(base), str(slower), cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "worse" in ok.stdout and "comparison (baseline: base)" in ok.stdout

    gate = cli("compare", str(base), str(slower), "--fail-on-regression", "10", cwd=tmp_path)
    assert gate.returncode == 1 and "regression: slower: single-stream decode tok/s" in gate.stderr
    lenient = cli("compare", str(base), str(slower), "--fail-on-regression", "60", cwd=tmp_path)
    assert lenient.returncode == 0, lenient.stderr

    literal = cli("compare", str(base), "--baseline", "single.decode_tok_s=82.5", "--baseline",
                  "peak.output_tok_s=1536", cwd=tmp_path)
    assert literal.returncode == 0, literal.stderr
    assert "comparison (baseline: given figures)" in literal.stdout and "given figures (literal)" in literal.stdout
    assert "baseline: baseline" not in literal.stdout

    nothing = cli("compare", str(base), "--baseline", "slo.goodput_req_s=2", cwd=tmp_path)
    assert nothing.returncode == 2
    lines = [line for line in nothing.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no common metrics" in lines[0]

    unknown = cli("compare", str(base), "no-such-run", cwd=tmp_path)
    assert unknown.returncode == 2 and "no-such-run" in unknown.stderr


def test_headline_figures_unchanged_by_loading(tmp_path: Path) -> None:
    path = write_run_dir(tmp_path, "r", itl_ms=20.0)
    loaded = load_run_dir(path)
    summary, _ = synthetic_run("r", itl_ms=20.0)
    assert loaded.headline == summary.headline
    assert isinstance(loaded.headline["peak.output_tok_s"], Figure)


def test_a_report_path_that_cannot_be_written_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """`report -o` and `compare --report` to a path under a file, or to a directory: an internal error with a
    traceback hint before; now the path, the errno and what to do, exit 2, and no `.tmp` left."""
    base = write_run_dir(tmp_path, "base", seed=1)
    other = write_run_dir(tmp_path, "other", seed=2)
    (tmp_path / "a-file").write_text("not a directory\n")
    cases = [
        (("report", str(base), "-o", str(tmp_path / "a-file" / "r.html")), "a-file is a file, not a directory"),
        (("report", str(base), "-o", str(tmp_path)), "Is a directory (EISDIR)"),
        (("compare", str(base), str(other), "--report", str(tmp_path / "a-file" / "c.html")),
         "a-file is a file, not a directory"),
    ]
    for args, why in cases:
        proc = cli(*args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
        (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
        assert line.startswith("error: cannot write the report ") and why in line, line
    assert not list(tmp_path.rglob("*.tmp"))


def test_an_export_to_a_path_that_cannot_be_written_is_one_line_and_exit_2(tmp_path: Path) -> None:
    base = write_run_dir(tmp_path, "base", seed=1)
    (tmp_path / "a-file").write_text("not a directory\n")
    for fmt in ("csv", "vllm"):  # json writes as csv does (store/export.py)
        proc = cli("export", str(base), "--format", fmt, "--to", str(tmp_path / "a-file" / "out"), cwd=tmp_path)
        assert proc.returncode == 2, (fmt, proc.stderr)
        (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
        assert line.startswith("error: cannot create the export directory ") and "a-file" in line, line
    proc = cli("export", str(base), "--to", str(tmp_path / "x"), cwd=tmp_path)  # and where it can, it writes
    assert proc.returncode == 0 and (tmp_path / "x" / "records.csv").is_file(), proc.stderr


def test_a_tokenizer_that_recounted_nothing_is_no_workload_difference() -> None:
    # llama.cpp offers /tokenize and vLLM does not: their workloads name different tokenizers, but where every
    # token was counted by the server per chunk, neither tokenizer counted anything.
    def with_tokenizer(name: str, tokenizer: str | None):
        data = run(name)
        for bench in data.benches:
            bench.workload["tokenizer"] = tokenizer
        return data

    base, other = with_tokenizer("base", "server:llama.cpp /tokenize"), with_tokenizer("other", None)
    assert not any("workloads differ" in w for w in compare_runs([base, other]).warnings)
    other.records[0].count_method = "chunk_count"  # one request recounted: the tokenizer now matters
    assert any("workloads differ" in w and "tokenizer" in w for w in compare_runs([base, other]).warnings)


# ---- chat with images, group by group ----------------------------------------------------------------------------


def _vision(name: str, rows, seed: int):
    """A one-trial run whose single-stream level carried the image groups `rows` make (bench/image_figures.py)."""
    from servelab.bench.image_figures import image_figures

    data = run(name, trials=1, seed=seed)
    next(s for s in data.levels if s.tag == "single").images = image_figures(rows)[1]
    return data


def test_compare_sets_each_runs_image_groups_side_by_side_and_marks_a_group_a_run_did_not_send() -> None:
    from rich.console import Console

    from servelab.bench.image_figures import ImageRow
    from servelab.report.compare_terminal import render_comparison
    from servelab.report.html_sections import comparison_section

    wide = 1024 * 768
    base = _vision("base", [ImageRow(0, 0, 10.0, 30, ""), ImageRow(1, wide, 400.0, 1_300, "1024x768"),
                            ImageRow(1, wide, 420.0, 1_300, "1024x768")], seed=1)
    other = _vision("other", [ImageRow(0, 0, 12.0, 31, ""), ImageRow(1, wide, 90.0, 286, "1024x768"),
                              ImageRow(1, wide, None, None, "1024x768", ok=False),
                              ImageRow(2, 2 * wide, 150.0, 541, "1024x768,1024x768")], seed=2)
    plain = run("plain", trials=1, seed=3)
    c = compare_runs([base, other, plain])
    assert [(g.images, g.sizes) for g in c.image_groups] == [(0, ""), (1, "1024x768"), (2, "1024x768,1024x768")]
    one = c.image_groups[1]
    assert one.megapixels == pytest.approx(0.786432)
    assert [(x.requests, x.failed, x.ttft_ms_p50, x.prompt_tokens_mean) for x in one.runs[:2]] == [
        (2, 0, 410.0, 1_300.0), (1, 1, 90.0, 286.0)]
    assert one.runs[2] is None  # the text-only run sent no such group
    assert c.image_groups[2].runs[0] is None and c.image_groups[2].runs[1].requests == 1

    console = Console(record=True, width=200, color_system=None)
    render_comparison(console, c)
    text = console.export_text()
    table = text[text.index("by image count and size"):]
    line = next(x for x in table.splitlines() if "1024x768" in x and "×" not in x)
    # per run: TTFT p50, prompt tokens, ok/sent (sent only where some failed); the text-only run has none
    assert [cell.strip() for cell in line.split("│")[1:-1]] == [
        "1", "1024x768", "0.786", "410", "1,300", "2", "90", "286", "1/2", "–", "–", "–"]

    html = comparison_section(c)
    section = html[html.index("by image count and size"):]
    table = section[:section.index("</table>")]
    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", table) if "<td>1024x768</td>" in r)
    assert re.findall(r"<td[^>]*>(.*?)</td>", row) == [
        "1", "1024x768", "0.786", "410", "1,300", "2", "90", "286", "1/2", "–", "–", "–"]


def test_compare_has_no_image_groups_when_no_run_sent_images() -> None:
    from rich.console import Console

    from servelab.report.compare_terminal import render_comparison
    from servelab.report.html_sections import comparison_section

    c = compare_runs([run("a", trials=1, seed=1), run("b", trials=1, seed=2)])
    assert c.image_groups == []
    console = Console(record=True, width=200, color_system=None)
    render_comparison(console, c)
    assert "image count" not in console.export_text() and "image count" not in comparison_section(c)


def test_image_sizes_read_from_a_file_are_escaped_in_the_reports_comparison() -> None:
    from servelab.bench.image_figures import ImageRow
    from servelab.report.html_sections import comparison_section

    evil = "<script>alert(1)</script>"
    c = compare_runs([_vision("a", [ImageRow(1, 4, 5.0, 9, evil)], seed=1), run("b", trials=1, seed=2)])
    html = comparison_section(c)
    assert c.image_groups[0].sizes == evil and evil not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
