"""What the GPUs did, in the terminal (`bench`, `run`, `show`): per level J/token, tokens/J, power and SM activity
when measured, every number whole at 80 columns; when no level was measured, one line saying why."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from gpu_runs import expected_j_per_token, with_gpu, without_gpu
from servelab.compare.sources import from_summary
from servelab.report.compare_terminal import render_show
from servelab.report.tables import PIPE_WIDTH
from servelab.report.terminal import GPU_MARK, level_line, render_levels, sig
from synthetic_runs import synthetic_run


def render(width: int, draw) -> str:
    console = Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None)
    draw(console)
    return console.file.getvalue()


def _lines_with(text: str, token: str) -> list[str]:
    return [line for line in text.splitlines() if token in line]


@pytest.mark.parametrize("width", [80, PIPE_WIDTH], ids=["80-columns", "pipe"])
def test_measured_levels_show_their_gpu_figures_whole(width: int) -> None:
    summary, _ = synthetic_run("gpu", max_concurrency=16)
    bench = summary.trials[0].sweep
    for level in bench.levels:
        with_gpu(level, gpus=8, power_w=612.5, sm_pct=41.0)
    text = render(width, lambda c: render_levels(c, bench))
    assert "…" not in text
    if width == 80:
        assert max(len(line) for line in text.splitlines()) <= 80
    gpu_table = text.split("GPUs (the engine's")[1].split("per GPU")[0]
    for level in bench.levels:
        j = expected_j_per_token(level, gpus=8, power_w=612.5)
        row = [line for line in gpu_table.splitlines() if line.startswith(f"│ {level.tag} ") and sig(j) in line]
        assert row, f"{level.tag}: J/token {sig(j)} not on its row:\n{text}"
        assert sig(1 / j) in row[0] and "4,900" in row[0] and " 41 " in row[0]
    assert "GPUs (the engine's, summed; nvml every 0.25 s)" in text
    assert "per GPU (NVIDIA H200)" in text and len(_lines_with(text, " 612 ")) == 8  # each GPU's power
    assert "not measured" not in text.split("per GPU")[0]


def test_a_run_without_gpu_telemetry_says_so_in_one_line() -> None:
    summary, records = synthetic_run("no-gpu")
    for trial in summary.trials:
        for level in trial.levels:
            without_gpu(level)
    text = render(80, lambda c: render_show(c, from_summary(summary, records, "no-gpu", "no-gpu")))
    assert _lines_with(text, "GPU") == ["  GPU: not measured: no GPU telemetry source"]
    assert "J/token" not in text and "tok/J" not in text  # never a table of blanks
    one_bench = render(80, lambda c: render_levels(c, summary.trials[0].sweep))
    assert _lines_with(one_bench, "GPU") == ["  GPU: not measured: no GPU telemetry source"]


def test_a_level_without_gpu_among_measured_ones_says_why_and_a_contended_one_is_marked() -> None:
    summary, _ = synthetic_run("some-gpu")
    bench = summary.trials[0].sweep
    with_gpu(bench.levels[0])
    without_gpu(bench.levels[1], "no GPU reading inside the level's 0.2 s window (sampling every 0.25 s)")
    with_gpu(bench.levels[2])
    bench.levels[2].gpu.contended = True
    text = render(80, lambda c: render_levels(c, bench))
    assert f"  {bench.levels[1].tag} GPU: not measured: no GPU reading inside the level's 0.2 s window " \
           f"(sampling every 0.25 s)" in text.replace("\n", " ").replace("  ", "  ")
    assert any(line.startswith(f"│ {bench.levels[2].tag} {GPU_MARK}") for line in text.splitlines())


def test_a_level_from_before_gpu_telemetry_says_nothing_of_gpus() -> None:
    summary, _ = synthetic_run("old")
    text = render(80, lambda c: render_levels(c, summary.trials[0].sweep))
    assert "GPU" not in text


def test_sig_keeps_three_digits_and_never_an_exponent() -> None:
    assert [sig(v) for v in (1234.5, 45.61, 3.162, 0.05123, 0.000123, 0.0, None)] == \
        ["1,234", "45.6", "3.16", "0.0512", "0.000123", "0.00", "–"]


def test_a_trials_level_line_carries_its_energy_per_token() -> None:
    summary, _ = synthetic_run("line")
    level = with_gpu(summary.trials[0].sweep.levels[0])
    assert level_line(level).endswith(f", {sig(expected_j_per_token(level))} J/token at 600 W")
    assert "J/token" not in level_line(without_gpu(summary.trials[0].sweep.levels[1]))
