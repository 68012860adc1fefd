"""Rich tables for comparisons, experiments and the run store. Reads records only; never measures anything."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from servelab.compare.compare import Comparison
from servelab.report.terminal import fmt
from servelab.store.runs import RunRow
from servelab.textsafe import inert, inert_markup

_VERDICT_STYLE = {"better": "bold green", "worse": "bold red", "within noise": "dim", "no interval": "yellow",
                  "inconsistent": "yellow", "contended": "yellow", "missing": "dim", "baseline": "dim"}
_STATUS_STYLE = {"complete": "green", "failed": "bold red", "interrupted": "yellow"}


def _digits(unit: str) -> int:
    return 2 if unit == "req/s" else 1


def render_comparison(console: Console, comparison: Comparison) -> None:
    table = Table(title=inert_markup(f"comparison (baseline: {comparison.baseline})"), title_justify="left")
    table.add_column("figure")
    for run in comparison.runs:
        label = run.name + (" (literal)" if run.literal else "") + ("" if run.representative else " ⚠")
        table.add_column(inert_markup(label), justify="right", overflow="fold")
    for row in comparison.rows:
        cells = [Text(row.label + ("" if row.neutral else " ↑" if row.higher_is_better else " ↓"))]
        for fig, ratio in zip(row.figures, row.ratios):
            if fig.value is None:
                cells.append(Text("–", style="dim"))
                continue
            text = Text(fmt(fig.value, _digits(row.unit)) + (f" @{fig.where}" if fig.where else ""))
            if fig.ci:
                text.append(f" [{fmt(fig.ci[0], _digits(row.unit))}–{fmt(fig.ci[1], _digits(row.unit))}]",
                            style="dim")
            if ratio.verdict != "baseline" and ratio.ratio is not None:
                text.append(f"\n×{ratio.ratio:.2f}")
                if ratio.ci:
                    text.append(f" [{ratio.ci[0]:.2f}–{ratio.ci[1]:.2f}]", style="dim")
                text.append(f" {ratio.verdict}", style=_VERDICT_STYLE[ratio.verdict])
            cells.append(text)
        table.add_row(*cells)
    console.print(table)
    console.print(Text(f"  ↑ higher is better, ↓ lower is better; [..] 95 % intervals; {comparison.method}",
                       style="dim"))
    for warning in comparison.warnings:
        console.print(Text(f"  warning: {inert(warning)}", style="yellow"))
    if comparison.verdicts:
        console.rule("verdict")
        for sentence in comparison.verdicts:
            style = "bold red" if "NOT REPRESENTATIVE" in sentence else "bold"
            console.print(Text(f"  {inert(sentence)}", style=style))


def render_experiment(console: Console, result) -> None:
    """The cells of an experiment and how each ended."""
    table = Table(title=inert_markup(f"experiment {result.name} ({result.experiment_id})"), title_justify="left")
    for col in ("cell", "status", "run", "single decode tok/s", "peak output tok/s", "reason"):
        table.add_column(col, overflow="fold")
    summaries = {s.run_id: s for s in result.runs}
    for cell in result.cells:
        summary = summaries.get(cell.run_id or "")
        head = summary.headline if summary else {}
        status = cell.status + (" (earlier)" if cell.skipped else "")
        decode = head.get("single.decode_tok_s")
        peak = head.get("peak.output_tok_s")
        table.add_row(Text(inert(cell.name)), Text(status, style=_STATUS_STYLE.get(cell.status, "")),
                      Text(inert(cell.run_id or "–")), fmt(decode.value if decode else None),
                      fmt(peak.value if peak else None),
                      Text(inert((cell.reason or "").splitlines()[0])) if cell.reason else "")
    console.print(table)


def render_runs(console: Console, rows: list[RunRow]) -> None:
    table = Table(title="runs (newest first)", title_justify="left")
    for col in ("run", "cell", "status", "engine", "model", "single decode tok/s", "peak output tok/s", "note"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(Text(inert(r.run_id)), Text(inert(r.cell_name or "")),
                      Text(r.status, style=_STATUS_STYLE.get(r.status, "")), Text(inert(r.engine or "")),
                      Text(inert(r.model or "")), fmt(r.decode_tok_s), fmt(r.peak_output_tok_s),
                      Text("not representative", style="red") if not r.representative else "")
    console.print(table)
    if not rows:
        console.print("no runs stored yet: `servelab run` stores every run it makes")


def render_show(console: Console, run) -> None:
    """`servelab show RUN`: one run, as `servelab run` printed it."""
    from servelab.report.terminal import render_checks, render_headline, render_levels, render_lint

    console.rule(inert_markup(f"run {run.ref}" + (f" (cell {run.name})" if run.name != run.ref else "")
                              + f": {run.status}"))
    if run.error:
        console.print(Text(f"failed: {inert(run.error, multiline=True)}", style="bold red"))
    if run.launch is not None:
        console.print(Text(inert(f"launch: {run.launch.engine} {run.launch.verdict.state} "
                                 f"({run.launch.verdict.reason})")))
        render_lint(console, run.launch.lint)
    if run.verify is not None:
        render_checks(console, run.verify)
    for bench in run.benches:
        render_levels(console, bench)
    render_headline(console, run.headline, title="headline", not_representative=bool(run.serious))
    prov = run.provenance
    if prov is not None:
        console.print(Text(inert(f"engine: {prov.engine_version or prov.engine}   "
                                 f"model: {prov.model_path or prov.model}")))
        if prov.command:
            console.print(Text(f"command: {inert(' '.join(prov.command))}", style="dim"))
