"""The report's tables, as HTML fragments. Every value passes through `e` (html.escape) on its way in."""

from __future__ import annotations

import html
from typing import Any

from servelab.compare.compare import Comparison, fmt_ratio
from servelab.compare.run_data import RunData
from servelab.report.compare_terminal import image_cells, number
from servelab.report.tables import human_bytes
from servelab.report.terminal import (COUNTED_BY_WORDS, figure_label, fmt, gpu_reason, image_group_cells, sent_cell,
                                      sig, sizes_cell)
from servelab.textsafe import visible

_VERDICT_CLASS = {"better": "better", "worse": "worse", "within noise": "noise", "no interval": "warn",
                  "inconsistent": "warn", "contended": "warn", "too few trials": "warn", "different levels": "warn",
                  "missing": "dim",
                  "definition differs": "warn", "baseline": "dim"}
HEADLINE_KEYS = ["single.decode_tok_s", "single.output_tok_s", "single.ttft_ms", "single.itl_ms", "single.tpot_ms",
                 "single.e2e_ms", "peak.output_tok_s", "peak.concurrency", "peak.request_s", "slo.max_rate",
                 "slo.max_concurrency", "slo.goodput_req_s", "single.items_s", "single.input_tok_s", "peak.items_s",
                 "peak.e2e_ms"]


def e(value: Any) -> str:
    """HTML-escaped, with control characters shown as escapes (textsafe.visible): no raw ESC reaches the file."""
    return html.escape(visible("" if value is None else str(value)), quote=True)


def _table(head: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    """`rows` hold HTML that is already escaped (cells built with `e`)."""
    out = ["<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td class=\"num\">{c}</td>" if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def comparison_section(c: Comparison) -> str:
    parts = [f"<h2>Comparison (baseline: {e(c.baseline)})</h2>"]
    if c.verdicts:
        parts.append("<ul>" + "".join(
            f"<li class=\"{'serious' if 'NOT REPRESENTATIVE' in v else ''}\">{e(v)}</li>" for v in c.verdicts)
            + "</ul>")
    head = ["figure"] + [r.name + (" (literal)" if r.literal else "") + (
        f" ({r.peer['tool']} {r.peer.get('version') or ''})".replace(" )", ")") if r.peer else "") + ("" if r.representative else " ⚠ not "
                                                                          "representative") for r in c.runs]
    rows = []
    for row in c.rows:
        cells = [e(row.label + ("" if row.neutral else " ↑" if row.higher_is_better else " ↓"))]
        for fig, ratio in zip(row.figures, row.ratios):
            if fig.value is None:
                cells.append(f"<span class=\"dim\">{e(fig.note)}</span>" if fig.note else "–")
                continue
            text = e(number(fig.value, row.unit) + (f" @{fig.where}" if fig.where else ""))
            if fig.ci:
                text += (f" <span class=\"dim\">[{e(number(fig.ci[0], row.unit))}–"
                         f"{e(number(fig.ci[1], row.unit))}]</span>")
            if fig.definition_differs:  # another tool's figure, defined otherwise (compare/peers)
                text += (f" <span class=\"warn\" title=\"{e(fig.source or '')}: {e(fig.definition_differs)}\">"
                         f"≠ definition</span>")
            if ratio.verdict != "baseline" and ratio.ratio is not None:
                text += f"<br>×{fmt_ratio(ratio.ratio)}"
                if ratio.ci:
                    text += f" <span class=\"dim\">[{fmt_ratio(ratio.ci[0])}–{fmt_ratio(ratio.ci[1])}]</span>"
                words = ratio.reason.split(" (")[0] if ratio.verdict == "too few trials" and ratio.reason \
                    else ratio.verdict
                text += f" <span class=\"{_VERDICT_CLASS[ratio.verdict]}\">{e(words)}</span>"
                if ratio.trial_ratios:
                    text += (" <span class=\"dim\">trials "
                             + e(", ".join(f"×{fmt_ratio(r)}" for r in ratio.trial_ratios))
                             + "</span>")
            cells.append(text)
        rows.append(cells)
    parts.append(_table(head, rows, numeric=set(range(1, len(head)))))
    parts.append(f"<p class=\"dim\">↑ higher is better, ↓ lower is better; [..] 95 % intervals. {e(c.method)}</p>")
    parts.append(image_groups_table(c))
    if c.warnings:
        parts.append("<ul>" + "".join(f"<li class=\"warn\">{e(w)}</li>" for w in c.warnings) + "</ul>")
    return "\n".join(parts)


def image_groups_table(c: Comparison) -> str:
    """Each run's single-stream requests by image count and size, side by side (compare/image_groups.py), with
    the terminal's columns (report/compare_terminal.py render_image_groups); "" when no run's single-stream level
    sent images."""
    if not c.image_groups:
        return ""
    rows = [[e(row.images), e(sizes_cell(row.sizes)), e(fmt(row.megapixels, 3))]
            + [e(x) for cell in row.runs for x in (["–"] * 3 if cell is None else image_cells(cell))]
            for row in c.image_groups]
    head = ["images", "sizes", "MP per request"] + [f"{r.name} {what}" for r in c.runs
                                                    for what in ("TTFT ms p50", "prompt tokens", "ok/sent")]
    return ("<h3>Single-stream requests by image count and size</h3>"
            + _table(head, rows, numeric=set(range(len(head))) - {1})
            + "<p class=\"dim\">prompt tokens: the server's usage.prompt_tokens, images included; ok/sent where "
              "requests of the group failed. No interval and no verdict per group: the verdict on images is the "
              "TTFT row above (docs/metrics.md#images)</p>")


def run_section(run: RunData, answers: list[str]) -> str:
    parts = [f"<h2>Run {e(run.name)} <span class=\"dim\">({e(run.ref)}, {e(run.status)})</span></h2>"]
    if run.error:
        parts.append(f"<p class=\"fail\">failed: {e(run.error)}</p>")
    if run.serious:
        parts.append("<p class=\"banner\">NOT REPRESENTATIVE: a serious configuration finding applies to these "
                     "numbers</p>")
    head = []
    for k in HEADLINE_KEYS:
        fig = run.headline.get(k)
        if fig is None:
            continue
        counted = COUNTED_BY_WORDS.get(fig.counted_by or "", fig.counted_by)
        head.append([f"<span title=\"{e(k)}\">{e(figure_label(k))}</span>", e(fmt(fig.value, 2)), e(fig.unit),
                     e(", ".join(x for x in (counted, fig.note) if x))])
    if head:
        parts.append(_table(["figure", "value", "unit", "counted by / note"], head, numeric={1}))
    levels = []
    trials = run.trials or []
    unary = any("items_s" in s.figures for t in trials for step in t.steps for s in step.result.levels)
    for trial in trials:
        counted = "counts" if trial.index in run.counted else "left out (contended)" if trial.index in run.excluded \
            else trial.status
        for step, s in ((step, s) for step in trial.steps for s in step.result.levels):
            f = s.figures
            env = s.environment
            machine = ("<span class=\"warn\">contended: " + e("; ".join(env.reasons)) + "</span>"
                       if env is not None and env.contended else "quiet" if env is not None else "–")
            if unary:  # non-streamed requests (embeddings, rerank): no token figures (docs/metrics.md#non-streamed)
                levels.append([e(trial.index + 1), e(counted), e(step.name), e(s.tag), e(sent_cell(s)),
                               e(fmt(_v(f, "request_s"), 2)), e(fmt(_v(f, "items_s"))), e(fmt(_v(f, "input_tok_s"))),
                               e(fmt(_p(f, "e2e_ms", "p50"))), e(fmt(_p(f, "e2e_ms", "p90"))),
                               e(fmt(_p(f, "e2e_ms", "p99"))), e(fmt(s.window_s, 2)), machine])
                continue
            levels.append([e(trial.index + 1), e(counted), e(step.name), e(s.tag), e(sent_cell(s)),
                           e(fmt(_v(f, "output_tok_s"))),
                           e(fmt(_v(f, "decode_tok_s"))), e(fmt(_p(f, "ttft_ms", "p50"))),
                           e(fmt(_p(f, "ttft_ms", "p99"))), e(fmt(_p(f, "itl_ms", "p50"))),
                           e(fmt(_p(f, "itl_ms", "p99"))), e(fmt(s.window_s, 2)), machine])
    if levels and unary:
        parts.append("<h3>Levels, trial by trial</h3>" + _table(
            ["trial", "", "step", "level", "ok/sent", "req/s", "items/s", "input tok/s", "latency ms p50",
             "latency ms p90", "latency ms p99", "window s", "machine"], levels, numeric=set(range(4, 12))))
    elif levels:
        parts.append("<h3>Levels, trial by trial</h3>" + _table(
            ["trial", "", "step", "level", "ok/sent", "output tok/s", "decode tok/s p50", "TTFT ms p50", "TTFT p99",
             "ITL ms p50", "ITL p99", "window s", "machine"], levels, numeric=set(range(4, 12))))
    parts.append(reasoning_table(trials))
    parts.append(answers_table(trials))
    parts.append(images_tables(run))
    parts.append(gpu_table(trials))
    if run.launch is not None:
        phases = [[e(p.name), e(fmt(p.start_s, 2)), e(fmt(p.end_s, 2)), e(p.detail)] for p in run.launch.phases]
        parts.append(f"<h3>Start-up</h3><p>{e(run.launch.engine)}: {e(run.launch.verdict.state)} "
                     f"— {e(run.launch.verdict.reason)}</p>" + _table(["phase", "start s", "end s", "detail"], phases,
                                                                     numeric={1, 2}))
        lint = [[f"<span class=\"{'serious' if f.severity == 'serious' else f.severity}\">{e(f.severity)}</span>",
                 e(f.setting), e(f.why)] for f in run.launch.lint]
        parts.append("<h3>Lint</h3>" + (_table(["severity", "setting", "why"], lint) if lint
                                        else "<p class=\"dim\">no findings</p>"))
    if run.verify is not None:
        checks = [[e(c.id), f"<span class=\"{e(c.outcome)}\">{e(c.outcome.upper())}</span>", e(c.reason),
                   f"<pre>{e(c.response_excerpt)}</pre>" if c.response_excerpt else ""] for c in run.verify.checks]
        parts.append("<h3>Verify</h3>" + _table(["check", "result", "why", "response excerpt"], checks))
    if answers:
        parts.append("<h3>Sample answers (single-stream)</h3>" + "".join(
            f"<pre class=\"answer\">{e(a[:1000])}</pre>" for a in answers))
    if run.provenance is not None:
        p = run.provenance
        host = p.host
        size = human_bytes(p.model_size_bytes) if p.model_size_bytes else None
        rows = [["engine", e(p.engine_version or p.engine)], ["command", e(" ".join(p.command or []))],
                ["model", e(p.model_path or p.model)], ["model size", e(size)], ["started at", e(p.started_at)],
                ["servelab", e(f"{p.servelab_version} {p.servelab_git_revision or ''}")]]
        if host is not None:
            rows.append(["host", e(f"{host.cpu_model} ({host.cpu_cores_logical} CPUs), "
                                   f"{(host.ram_bytes or 0) / 2**30:.0f} GiB RAM, {len(host.gpus)} GPU(s)")])
        rows += [[e(f"env {k}"), e(v)] for k, v in sorted(p.env.items())]
        parts.append("<h3>Provenance</h3>" + _table(["", ""], rows))
    return "\n".join(parts)


def _v(figures: dict, name: str) -> float | None:
    fig = figures.get(name)
    return fig.value if fig else None


def _p(figures: dict, name: str, stat: str) -> float | None:
    fig = figures.get(name)
    return getattr(fig.dist, stat) if fig and fig.dist else None


def reasoning_table(trials: list) -> str:
    """Reasoning and answer tokens per level, trial by trial, when any reasoning was seen; "" otherwise
    (docs/metrics.md#reasoning)."""
    from servelab.bench.metrics import saw_reasoning

    levels = [(trial.index, s) for trial in trials for s in trial.levels]
    if not saw_reasoning([s for _, s in levels]):
        return ""
    rows = []
    for index, s in levels:
        f = s.figures
        share = _v(f, "reasoning_share")
        rows.append([e(index + 1), e(s.tag), e(fmt(_v(f, "reasoning_tokens"))),
                     e(fmt(_p(f, "reasoning_tokens", "p50"))), e(fmt(_v(f, "answer_tokens"))),
                     e(fmt(_p(f, "answer_tokens", "p50"))),
                     e("–" if share is None else f"{share * 100:.1f} %"), e(fmt(_v(f, "answer_tok_s"))),
                     e(fmt(_v(f, "output_tok_s"))), e(fmt(_p(f, "ttfo_ms", "p50")))])
    return "<h3>Reasoning and answer tokens</h3>" + _table(
        ["trial", "level", "reasoning tok/req (mean)", "p50", "answer tok/req (mean)", "p50", "reasoning share",
         "answer tok/s", "output tok/s", "TTFO ms p50"], rows, numeric=set(range(2, 10)))


ANSWER_KEYS = ("tool_first_ms", "tool_call_ms", "tool_call_share", "tool_parse_share", "tool_valid_share",
               "schema_valid_share")


def answers_table(trials: list) -> str:
    """Tool calls and structured output per level, trial by trial, where requests declared tools or asked for a
    format; "" otherwise (docs/metrics.md#tool-calls, #structured-output)."""
    levels = [(trial.index, s) for trial in trials for s in trial.levels
              if any(k in s.figures for k in ANSWER_KEYS)]
    if not levels:
        return ""

    def pct(x: float | None) -> str:
        return "–" if x is None else f"{x * 100:.1f} %"
    rows = [[e(index + 1), e(s.tag), e(fmt(_p(s.figures, "tool_first_ms", "p50"))),
             e(fmt(_p(s.figures, "tool_call_ms", "p50")))] + [e(pct(_v(s.figures, k))) for k in ANSWER_KEYS[2:]]
            for index, s in levels]
    return "<h3>Tool calls and structured output</h3>" + _table(
        ["trial", "level", "first tool-call token ms p50", "complete call ms p50", "called", "calls parse",
         "calls valid", "answers valid against the schema"], rows, numeric=set(range(2, 8)))


def images_tables(run: RunData) -> str:
    """Chat with images (docs/metrics.md#images): per level that sent any, its requests by image count and size,
    with the columns of the terminal's table (report/terminal.py render_images); "" when no level sent images.
    The levels are the run's, pooled over the trials that count: the groups are recomputed over every counted
    trial's requests, like TTFT, so a per-trial table would split what the definition pools."""
    parts = []
    for step in run.steps:
        for s in step.result.levels:
            if not s.images:
                continue
            rows = [[e(cell) for cell in image_group_cells(g)] for g in s.images]
            parts.append(f"<h4 class=\"images\">{e(s.tag)} <span class=\"dim\">({e(step.name)})</span>: by image "
                         f"count and size</h4>" + _table(
                             ["images", "sizes", "MP per request", "ok", "failed", "prompt tokens (mean)",
                              "TTFT ms p50", "TTFT ms p99"], rows, numeric={0, 2, 3, 4, 5, 6, 7}))
    if not parts:
        return ""
    pooled = len(run.counted) > 1
    return ("<h3>Chat with images</h3>" + "\n".join(parts)
            + "<p class=\"dim\">prompt tokens: the server's usage.prompt_tokens, images included; failed requests "
              "are in no other column" + (f"; over the {len(run.counted)} trials that count" if pooled else "")
            + "</p>")


def gpu_table(trials: list) -> str:
    """What the GPUs did per level, trial by trial (docs/metrics.md#gpu): energy per token, tokens per joule,
    power and SM activity over the engine's GPUs. One line saying why when no level was measured; "" for levels
    from before GPU telemetry."""
    levels = [(trial.index, step.name, s) for trial in trials for step in trial.steps for s in step.result.levels
              if s.gpu is not None]
    measured = [(i, name, s) for i, name, s in levels if s.gpu.measured]
    if not measured:
        if not levels:
            return ""
        reasons = dict.fromkeys(gpu_reason(s.gpu.reason) for _, _, s in levels)
        return f"<h3>GPUs</h3><p class=\"dim\" id=\"gpu-not-measured\">GPU: not measured: {e('; '.join(reasons))}</p>"
    rows = []
    for index, name, s in levels:
        g = s.gpu
        if not g.measured:
            rows.append([e(index + 1), e(name), e(s.tag), f"<span class=\"dim\">not measured: "
                                                          f"{e(gpu_reason(g.reason))}</span>"] + [""] * 8)
            continue
        state = ("<span class=\"warn\">contended: " + e("; ".join(g.reasons)) + "</span>" if g.contended
                 else e(g.source))
        rows.append([e(index + 1), e(name), e(s.tag), e(sig(g.j_per_output_token)), e(sig(g.j_per_answer_token)),
                     e(sig(g.output_tokens_per_j)), e(fmt(g.power_w_mean, 0)), e(fmt(g.power_w_max, 0)),
                     e(fmt(g.sm_active_pct_mean, 0)), e("–" if g.idle_share is None else f"{g.idle_share * 100:.0f} %"),
                     e(sum(1 for d in g.gpus if d.engine))])
        rows[-1].append(state)
    notes = dict.fromkeys(n for _, _, s in measured for n in s.gpu.notes)
    return ("<h3>GPUs</h3>" + _table(["trial", "step", "level", "J/token (output)", "J/token (answer)", "tok/J",
                                     "power W mean", "power W peak", "SM activity %", "idle", "GPUs", "source"],
                                    rows, numeric=set(range(3, 11)))
            + "".join(f"<p class=\"dim\">{e(n)}</p>" for n in notes))
