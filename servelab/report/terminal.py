"""Rich renderings of servelab's records for the terminal. Reads records only; never measures anything."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from servelab.bench.failures import error_line
from servelab.records import BenchResult, CheckResult, Figure, LintFinding, RunSummary, Summary, VerifyResult
from servelab.textsafe import inert, inert_markup

_OUTCOME_STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "skip": "dim"}
_SEVERITY_STYLE = {"serious": "bold red", "warn": "yellow", "info": "dim"}


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def render_checks(console: Console, result: VerifyResult) -> None:
    table = Table(title=f"verify {result.url}" + (f" (model {result.model})" if result.model else ""),
                  title_justify="left")
    table.add_column("check")
    table.add_column("result")
    table.add_column("why", overflow="fold")
    for c in result.checks:
        table.add_row(c.id, Text(c.outcome.upper(), style=_OUTCOME_STYLE[c.outcome]), c.reason)
    console.print(table)
    counts = {k: sum(1 for c in result.checks if c.outcome == k) for k in ("pass", "fail", "warn", "skip")}
    console.print(" ".join(f"{n} {k}" for k, n in counts.items() if n))


def render_lint(console: Console, findings: list[LintFinding]) -> None:
    for f in findings:
        console.print(Text(f"  {f.severity.upper():8} {f.setting}: {f.why}", style=_SEVERITY_STYLE[f.severity]))
    if any(f.severity == "serious" for f in findings):
        console.print(Text("  NOT REPRESENTATIVE: numbers from this configuration do not show what the engine "
                           "can do", style="bold red reverse"))


def _dist_cells(fig: Figure | None) -> list[str]:
    if fig is None or fig.dist is None:
        return ["–", "–"]
    return [fmt(fig.dist.p50), fmt(fig.dist.p99)]


def sent_cell(s: Summary, label: str = "") -> str:
    """`ok/sent`, with the failed and the cancelled (in flight at Ctrl-C) named when there are any."""
    extra = ", ".join(f"{n} {what}" for n, what in ((s.failed, "failed"), (s.cancelled, "cancelled")) if n)
    return f"{s.ok}/{s.requests}{label}" + (f" ({extra})" if extra else "")


def render_levels(console: Console, result: BenchResult) -> None:
    table = Table(title=inert_markup(f"{result.mode} bench {result.url} (model {result.model})"),
                  title_justify="left")
    for col in ("level", "ok/sent", "output tok/s", "req/s", "decode tok/s p50", "TTFT ms p50", "TTFT p99",
                "ITL ms p50", "ITL p99", "E2E ms p50"):
        table.add_column(col, justify="right")
    for s in result.levels:
        f = s.figures
        table.add_row(level_cell(s), sent_cell(s), fmt(f["output_tok_s"].value), fmt(f["request_s"].value, 2),
                      fmt(f["decode_tok_s"].value), *_dist_cells(f.get("ttft_ms")), *_dist_cells(f.get("itl_ms")),
                      fmt(f["e2e_ms"].value, 0))
    console.print(table)
    render_reasoning(console, result.levels)
    if any(s.environment is not None and s.environment.contended for s in result.levels):
        console.print(Text(f"  {BUSY_MARK}: the machine was not quiet during the level (docs/metrics.md#contended);"
                           " why, in its warning below", style="yellow"))
    for s in result.levels:
        line = environment_line(s)
        if line:
            console.print(Text(f"  {line}", style="dim"))
    for s in result.levels:
        for w in s.warnings:
            console.print(Text(f"  {s.tag}: {w}", style="yellow"))
    for s in result.levels:  # the most common errors, with the first response's excerpt (docs/metrics.md#errors)
        for e in s.top_errors:
            console.print(Text(f"  {s.tag} error: {inert(error_line(e))}", style="red"))
    counted = {s.figures["output_tok_s"].counted_by for s in result.levels} - {None}
    if counted:
        console.print(Text(f"  tokens counted by: {', '.join(sorted(counted))}", style="dim"))
    if result.stop_reason:
        console.print(Text(f"  sweep stopped: {result.stop_reason}", style="dim"))
    if result.interrupted:
        console.print(Text("  interrupted: partial results", style="bold yellow"))


BUSY_MARK = "⚠busy"


def level_cell(s: Summary) -> str:
    """The level's tag, marked when the machine was contended during it (docs/metrics.md#contended)."""
    return f"{s.tag} {BUSY_MARK}" if s.environment is not None and s.environment.contended else s.tag


def environment_line(s: Summary) -> str | None:
    """One short line of what the machine did during the level: CPU in cores by owner, load, steal, GPU."""
    env = s.environment
    if env is None or env.samples == 0:
        return None
    parts = [f"other CPU {fmt(env.other_cpu_cores_mean, 2)} cores", f"client {fmt(env.client_cpu_cores_mean, 2)}"]
    if env.engine_cpu_cores_mean is not None:
        parts.append(f"engine {fmt(env.engine_cpu_cores_mean, 2)}")
    if env.load1_mean is not None:
        parts.append(f"load {fmt(env.load1_mean)}" + (f"/{env.host_cpus} CPUs" if env.host_cpus else ""))
    if env.steal_pct is not None and env.steal_pct >= 1:
        parts.append(f"steal {fmt(env.steal_pct)} %")
    if env.gpu_util_pct_mean is not None:
        parts.append(f"GPU {fmt(env.gpu_util_pct_mean, 0)} %" + (f" at {fmt(env.gpu_clock_mhz_mean, 0)} MHz"
                                                                 if env.gpu_clock_mhz_mean is not None else ""))
    return f"{s.tag} environment: " + ", ".join(parts)


_HEADLINE_LABELS = {
    "single.decode_tok_s": "single-stream decode tok/s (p50)",
    "single.output_tok_s": "single-stream output tok/s",
    "single.ttft_ms": "single-stream TTFT ms (p50)",
    "single.itl_ms": "single-stream ITL ms (p50)",
    "peak.output_tok_s": "peak output tok/s",
    "peak.request_s": "requests/s at peak",
}


def render_headline(console: Console, headline: dict[str, Figure], title: str = "summary",
                    not_representative: bool = False) -> None:
    table = Table(title=title, title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("counted by / note")
    for key, label in _HEADLINE_LABELS.items():
        fig = headline.get(key)
        if fig is None:
            continue
        table.add_row(label, fmt(fig.value, 2 if fig.unit == "req/s" else 1),
                      ", ".join(x for x in (fig.counted_by, fig.note) if x))
    console.print(table)
    if not_representative:
        console.print(Text("NOT REPRESENTATIVE: a serious configuration finding applies to these numbers",
                           style="bold red reverse"))


def render_run(console: Console, summary: RunSummary, run_path: str) -> None:
    serious = bool(summary.launch and any(f.severity == "serious" for f in summary.launch.lint))
    render_headline(console, summary.headline, title=f"servelab run {summary.run_id} ({summary.status})",
                    not_representative=serious)
    prov = summary.provenance
    console.print(Text(inert(f"engine: {prov.engine_version or prov.engine}   "
                             f"model: {prov.model_path or prov.model}")))
    if prov.host:
        console.print(f"host: {prov.host.cpu_model} ({prov.host.cpu_cores_logical} CPUs), "
                      f"{(prov.host.ram_bytes or 0) / 2**30:.0f} GiB RAM"
                      + (f", {len(prov.host.gpus)} GPU(s)" if prov.host.gpus else ", no GPU"))
    load = prov.host_load
    if load is not None and load.samples:
        console.print(Text(f"host at start: load {fmt(load.load1_mean)}, other CPU {fmt(load.other_cpu_cores_mean, 2)}"
                           " cores" + (f" (busy: {'; '.join(load.reasons)})" if load.contended else ""),
                           style="yellow" if load.contended else ""))
    console.print(f"written to {run_path}")


def failed_checks(checks: list[CheckResult]) -> list[CheckResult]:
    return [c for c in checks if c.outcome == "fail"]


def level_line(s: Summary) -> str:
    rate = ("tok/s not measured (too short for a steady state)" if s.steady is not None and not s.steady.measured
            else f"{fmt(s.figures['output_tok_s'].value)} tok/s")
    return f"{s.tag}: {rate}, {sent_cell(s, ' ok')}, TTFT p50 {fmt(s.figures['ttft_ms'].value, 0)} ms"


def render_reasoning(console: Console, levels: list[Summary]) -> None:
    """Reasoning and answer apart, per level, when any reasoning was seen (docs/metrics.md#reasoning): mean
    tokens per request of each, the reasoning share of the output, and answer tok/s beside output tok/s."""
    from servelab.bench.metrics import saw_reasoning

    if not saw_reasoning(levels):
        return
    table = Table(title="reasoning and answer tokens", title_justify="left")
    for col in ("level", "reasoning tok/req", "answer tok/req", "reasoning %", "answer tok/s", "output tok/s",
                "TTFO ms p50"):
        table.add_column(col, justify="right")
    for s in levels:
        f = s.figures
        share = f["reasoning_share"].value if "reasoning_share" in f else None
        table.add_row(s.tag, fmt(_value(f, "reasoning_tokens")), fmt(_value(f, "answer_tokens")),
                      "–" if share is None else f"{share * 100:.0f} %", fmt(_value(f, "answer_tok_s")),
                      fmt(_value(f, "output_tok_s")), fmt(_value(f, "ttfo_ms"), 0))
    console.print(table)


def _value(figures: dict[str, Figure], key: str) -> float | None:
    fig = figures.get(key)
    return fig.value if fig is not None else None
