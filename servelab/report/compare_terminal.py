"""Rich tables for comparisons, experiments and the run store. Reads records only; never measures anything."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from servelab.compare.compare import Comparison, fmt_ratio
from servelab.report.tables import Col, key_col, print_table, text_col
from servelab.report.terminal import fmt, sig, sizes_cell
from servelab.store.runs import RunRow
from servelab.textsafe import inert, inert_markup

_VERDICT_STYLE = {"better": "bold green", "worse": "bold red", "within noise": "dim", "no interval": "yellow",
                  "inconsistent": "yellow", "contended": "yellow", "too few trials": "yellow", "different levels": "yellow",
                  "missing": "dim",
                  "definition differs": "yellow", "baseline": "dim"}
# How a verdict reads in a table cell (compare.py's Verdict values are the JSON's).
VERDICT_WORDS = {"inconsistent": "inconsistent across trials", "contended": "no verdict: contended",
                 "different levels": "no verdict: different levels",
                 "definition differs": "no verdict: definition differs"}
_STATUS_STYLE = {"complete": "green", "failed": "bold red", "interrupted": "yellow", "contended": "yellow"}


def verdict_words(ratio) -> str:
    """A ratio cell's verdict as a table shows it: "no verdict: 1 clean trial" rather than "too few trials"."""
    if ratio.verdict == "too few trials" and ratio.reason:
        return ratio.reason.split(" (")[0]
    return VERDICT_WORDS.get(ratio.verdict, ratio.verdict)


def _digits(unit: str) -> int:
    return 2 if unit == "req/s" else 1


# Figures whose size differs by orders of magnitude between machines (0.05 J/token on one GPU, 30 on another):
# shown with three significant digits rather than a fixed number of decimals.
SIGNIFICANT_UNITS = ("J/token", "tok/J")


def number(value: float | None, unit: str) -> str:
    return sig(value) if unit in SIGNIFICANT_UNITS else fmt(value, _digits(unit))


def render_comparison(console: Console, comparison: Comparison) -> None:
    cols = [text_col("figure")]
    for run in comparison.runs:
        label = run.name + (" (literal)" if run.literal else "") + ("" if run.representative else " ⚠") + (
            f" ({run.peer['tool']} {run.peer.get('version') or ''})".replace(" )", ")") if run.peer else "")
        cols.append(Col(inert(label)))
    rows = []
    for row in comparison.rows:
        cells: list = [Text(row.label + ("" if row.neutral else " ↑" if row.higher_is_better else " ↓"))]
        for fig, ratio in zip(row.figures, row.ratios):
            cells.append(_comparison_cell(row, fig, ratio))
        rows.append(cells)
    print_table(console, inert(f"comparison (baseline: {comparison.baseline})"), cols, rows)
    console.print(Text(f"  ↑ higher is better, ↓ lower is better; [..] 95 % intervals; {comparison.method}",
                       style="dim"))
    for line in not_measured_lines(comparison):
        console.print(Text(f"  {inert(line)}", style="dim"))
    render_image_groups(console, comparison)
    for warning in comparison.warnings:
        console.print(Text(f"  warning: {inert(warning)}", style="yellow"))
    if comparison.verdicts:
        console.rule("verdict")
        for sentence in comparison.verdicts:
            style = "bold red" if "NOT REPRESENTATIVE" in sentence else "bold"
            console.print(Text(f"  {inert(sentence)}", style=style))


def _comparison_cell(row, fig, ratio) -> Text:
    """The figure, its interval, then its ratio to the baseline with the ratio's interval and the verdict: one
    piece per line, so a column is as wide as its widest piece, never as all of them together."""
    if fig.value is None:  # why, under the table (not_measured_lines): a long reason would squeeze the figures
        return Text("not measured" if fig.note else "–", style="dim")
    text = Text(number(fig.value, row.unit) + (f" @{fig.where}" if fig.where else ""))
    if fig.ci:
        text.append(f"\n[{number(fig.ci[0], row.unit)}–{number(fig.ci[1], row.unit)}]", style="dim")
    if fig.definition_differs and ratio.verdict in ("baseline", "missing"):  # a peer's figure, defined otherwise
        text.append("\n≠ definition", style="yellow")
    if ratio.verdict != "baseline" and ratio.ratio is not None:
        text.append(f"\n×{fmt_ratio(ratio.ratio)}")
        if ratio.ci:
            text.append(f" [{fmt_ratio(ratio.ci[0])}–{fmt_ratio(ratio.ci[1])}]", style="dim")
        text.append(f"\n{verdict_words(ratio)}",
                    style=_VERDICT_STYLE.get(ratio.verdict, ""))
    elif ratio.verdict == "missing" and row.figures[0].value is not None:
        text.append("\nno ratio", style="dim")
    return text


def render_image_groups(console: Console, comparison: Comparison) -> None:
    """Each run's single-stream requests by image count and size, side by side (compare/image_groups.py): per run
    TTFT p50, the prompt the server counted and ok/sent; nothing when no run sent images. A column per figure,
    each cell one word, so a narrow console splits the table rather than cutting a number."""
    if not comparison.image_groups:
        return
    rows = []
    for row in comparison.image_groups:
        cells: list = [str(row.images), inert(sizes_cell(row.sizes)), fmt(row.megapixels, 3)]
        for cell in row.runs:
            cells += ["–"] * 3 if cell is None else image_cells(cell)
        rows.append(cells)
    cols = [key_col("images"), key_col("sizes"), Col("MP per\nrequest")]
    for run in comparison.runs:
        name = inert(run.name)
        cols += [Col(f"{name}\nTTFT ms p50"), Col(f"{name}\nprompt tok"), Col(f"{name}\nok/sent")]
    print_table(console, "single-stream requests by image count and size", cols, rows, keys=2)


def image_cells(cell) -> list[str]:
    """One run's group as the terminal and the HTML report show it: TTFT p50, prompt tokens, ok/sent."""
    sent = str(cell.requests) if not cell.failed else f"{cell.requests}/{cell.requests + cell.failed}"
    return [fmt(cell.ttft_ms_p50, 0), fmt(cell.prompt_tokens_mean, 0), sent]


def not_measured_lines(comparison: Comparison) -> list[str]:
    """Why a run has no value for a figure the others have, once per run and reason ("cpu: not measured: no GPU
    telemetry source (energy per output token at peak, …)")."""
    found: dict[tuple[str, str], list[str]] = {}
    for row in comparison.rows:
        for run, fig in zip(comparison.runs, row.figures):
            if fig.value is None and fig.note:
                found.setdefault((run.name, fig.note), []).append(row.label)
    return [f"{name}: {note} ({', '.join(labels)})" for (name, note), labels in found.items()]


def render_experiment(console: Console, result) -> None:
    """The cells of an experiment and how each ended."""
    rows = []
    summaries = {s.run_id: s for s in result.runs}
    for cell in result.cells:
        summary = summaries.get(cell.run_id or "")
        head = summary.headline if summary else {}
        status = cell.status + (" (earlier)" if cell.skipped else "")
        decode = head.get("single.decode_tok_s")
        peak = head.get("peak.output_tok_s")
        rows.append([Text(inert(cell.name)), Text(status, style=_STATUS_STYLE.get(cell.status, "")),
                     Text(inert(cell.run_id or "–")), fmt(decode.value if decode else None),
                     fmt(peak.value if peak else None),
                     Text(inert((cell.reason or "").splitlines()[0])) if cell.reason else ""])
    print_table(console, inert(f"experiment {result.name} ({result.experiment_id})"),
                [key_col("cell"), key_col("status"), key_col("run"), Col(DECODE_HEADER), Col(PEAK_HEADER),
                 text_col("reason")], rows)


DECODE_HEADER = "single-stream\ndecode tok/s"
PEAK_HEADER = "peak output\ntok/s"


def render_runs(console: Console, rows: list[RunRow]) -> None:
    table_rows = [[Text(inert(r.run_id)), Text(inert(r.cell_name or "")),
                   Text(r.status, style=_STATUS_STYLE.get(r.status, "")), Text(inert(r.engine or "")),
                   Text(inert(r.model or "")), fmt(r.decode_tok_s), fmt(r.peak_output_tok_s),
                   Text("not representative", style="red") if not r.representative else ""] for r in rows]
    if not rows:
        console.print("no runs stored yet: `servelab run` and `servelab bench --out DIR` store every run they make")
        return
    # A run id is what `show`, `compare` and `export` take: never wrapped. Too narrow for one row per run: a block
    # per run (report/tables.py).
    print_table(console, "runs (newest first)",
                [key_col("run"), key_col("cell"), key_col("status"), key_col("engine"), key_col("model"),
                 Col(DECODE_HEADER), Col(PEAK_HEADER), text_col("note")], table_rows, max_parts=1)


def render_show(console: Console, run) -> None:
    """`servelab show RUN`: one run, as `servelab run` printed it."""
    from servelab.report.terminal import render_checks, render_gpu, render_headline, render_levels, render_lint

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
        render_levels(console, bench, gpu=False)
    render_gpu(console, [s for bench in run.benches for s in bench.levels])  # once: one line when not measured
    render_headline(console, run.headline, title="headline", not_representative=bool(run.serious))
    if run.peer is not None:  # another tool's result file (compare/peers)
        peer = run.peer
        console.print(Text(inert(f"from {peer.tool}" + (f" {peer.version}" if peer.version else "")
                                 + (f": {'; '.join(peer.notes)}" if peer.notes else ""))))
        for d in peer.definitions:
            console.print(Text(inert(f"  {'same' if d.matches else 'DIFFERS'}  {d.key} <- {d.theirs}: {d.why}"),
                               style="" if d.matches else "yellow"))
    prov = run.provenance
    if prov is not None:
        console.print(Text(inert(f"engine: {prov.engine_version or prov.engine}   "
                                 f"model: {prov.model_path or prov.model}")))
        if prov.command:
            console.print(Text(f"command: {inert(' '.join(prov.command))}", style="dim"))
        if prov.ran_on:  # run there by `--on` or an experiment cell's `on:`, and copied back
            where = f" ({prov.host.hostname})" if prov.host is not None else ""
            console.print(Text(inert(f"ran on: {prov.ran_on}{where}")))
