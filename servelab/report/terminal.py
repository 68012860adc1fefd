"""Rich renderings of servelab's records for the terminal. Reads records only; never measures anything."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from servelab.bench.failures import error_line
from servelab.bench.figures import LEVEL_FIGURES, TerminalColumn
from servelab.records import BenchResult, Figure, LintFinding, Summary, VerifyResult
from servelab.report.tables import Col, human_bytes, key_col, print_table, text_col
from servelab.textsafe import inert

_OUTCOME_STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "skip": "dim"}
_SEVERITY_STYLE = {"serious": "bold red", "warn": "yellow", "info": "dim"}


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def render_checks(console: Console, result: VerifyResult) -> None:
    """The checks that ran, one row each; the ones not selected (--only, --skip, an experiment's verify list) are
    counted in one line instead of a SKIP row each."""
    selected = [c for c in result.checks if not (c.outcome == "skip" and c.reason == NOT_SELECTED)]
    rows = [[c.id, Text(c.outcome.upper(), style=_OUTCOME_STYLE[c.outcome]), Text(inert(c.reason))]
            for c in selected]
    print_table(console, inert(f"verify {result.url}" + (f" (model {result.model})" if result.model else "")),
                [key_col("check"), key_col("result"), text_col("why")], rows, max_parts=1)
    counts = {k: sum(1 for c in selected if c.outcome == k) for k in ("pass", "fail", "warn", "skip")}
    line = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    if len(selected) < len(result.checks):
        line += f" ({len(selected)} of {len(result.checks)} checks selected)"
    console.print(line, highlight=False)


NOT_SELECTED = "not selected"  # verify/runner.py's reason for a check --only or --skip left out


def render_lint(console: Console, findings: list[LintFinding]) -> None:
    for f in findings:
        console.print(Text(f"  {f.severity.upper():8} {f.setting}: {f.why}", style=_SEVERITY_STYLE[f.severity]))
    if any(f.severity == "serious" for f in findings):
        console.print(Text("  NOT REPRESENTATIVE: numbers from this configuration do not show what the engine "
                           "can do", style="bold red reverse"))


def sent_cell(s: Summary, label: str = "") -> str:
    """`ok/sent`, with the failed and the cancelled (in flight at Ctrl-C) named when there are any."""
    extra = ", ".join(f"{n} {what}" for n, what in ((s.failed, "failed"), (s.cancelled, "cancelled")) if n)
    return f"{s.ok}/{s.requests}{label}" + (f" ({extra})" if extra else "")


# The figures' columns, as bench/figures.py declares them (`terminal`): two-line headers, the name, then the unit
# and statistic. Numbers never wrap (report/tables.py).
_FIGURE_COLUMNS = [(fig.key, column) for fig in LEVEL_FIGURES for column in fig.terminal]
LEVEL_COLUMNS = [key_col("level"), Col("ok/sent")] + [Col(column.header) for _, column in _FIGURE_COLUMNS]
# A run of non-streamed requests (embeddings, rerank) has no token figures: its table has these columns instead
# (docs/metrics.md#non-streamed).
_UNARY_COLUMNS = [(fig.key, column) for fig in LEVEL_FIGURES for column in fig.unary_terminal]
UNARY_LEVEL_COLUMNS = [key_col("level"), Col("ok/sent")] + [Col(column.header) for _, column in _UNARY_COLUMNS]


def is_unary(result: BenchResult) -> bool:
    return result.workload.get("stream") is False


def render_unmeasured(console: Console, levels: list[Summary], figure_columns: list[tuple[str, TerminalColumn]]
                      ) -> None:
    """Why a column of a measured level shows "–" (input tok/s without the server's usage), as its figure's note
    says: a level that was not measured at all says why on its own line."""
    from servelab.bench.steady import is_measured

    for s in levels:
        if not is_measured(s):
            continue
        for key, column in figure_columns:
            fig = s.figures.get(key)
            if fig is not None and fig.value is None and fig.note:
                note = fig.note.removeprefix("not measured: ")
                header = " ".join(column.header.split())
                console.print(Text(f"  {s.tag} {header}: not measured: {inert(note)}", style="dim"))


def figure_cell(fig: Figure | None, column: TerminalColumn) -> str:
    """A figure's value, or one statistic of its distribution, as its column shows it ("–" when it has none)."""
    if fig is None:
        return "–"
    if column.stat == "value":
        return fmt(fig.value, column.digits)
    return fmt(getattr(fig.dist, column.stat), column.digits) if fig.dist is not None else "–"


def render_levels(console: Console, result: BenchResult, gpu: bool = True) -> None:
    """The levels' table, then what else the levels say (warnings, the server's gauges, reasoning, cache, the GPUs:
    `gpu=False` leaves them to the caller, who shows them once for several benches)."""
    rows = []
    figure_columns, columns = (_UNARY_COLUMNS, UNARY_LEVEL_COLUMNS) if is_unary(result) else \
        (_FIGURE_COLUMNS, LEVEL_COLUMNS)
    for s in result.levels:
        rows.append([level_cell(s), sent_cell(s)]
                    + [figure_cell(s.figures.get(key), column) for key, column in figure_columns])
    print_table(console, inert(f"{result.mode} bench {result.url} (model {result.model})"), columns, rows)
    if is_unary(result):
        render_unmeasured(console, result.levels, figure_columns)
    for warning in result.warnings:
        console.print(Text(f"  warning: {inert(warning)}", style="yellow"))
    render_spec_decode(console, result.levels)
    render_server_gauges(console, result.levels)
    render_reasoning(console, result.levels)
    render_cache(console, result.levels)
    render_answers(console, result.levels)
    render_images(console, result.levels)
    if gpu:
        render_gpu(console, result.levels)
    if any(s.environment is not None and s.environment.contended for s in result.levels):
        console.print(Text(f"  {BUSY_MARK}: the machine was not quiet during the level (docs/metrics.md#contended);"
                           " why, in its warning below", style="yellow"))
    for s in result.levels:
        line = environment_line(s)
        if line:
            console.print(Text(f"  {line}", style="dim"))
    for s in result.levels:
        for w in s.warnings:  # an XID error is a driver or hardware fault: said loudly (docs/metrics.md#gpu-xid)
            console.print(Text(f"  {s.tag}: {w}", style="bold red" if w.startswith("XID ERROR") else "yellow"))
    for s in result.levels:  # the most common errors, with the first response's excerpt (docs/metrics.md#errors)
        for e in s.top_errors:
            console.print(Text(f"  {s.tag} error: {inert(error_line(e))}", style="red"))
    counted = {s.figures["output_tok_s"].counted_by for s in result.levels if "output_tok_s" in s.figures} - {None}
    if counted:
        console.print(Text(f"  tokens counted by: {', '.join(sorted(counted))}", style="dim"))
    if result.stop_reason:
        console.print(Text(f"  sweep stopped: {result.stop_reason}", style="dim"))
    if result.interrupted:
        console.print(Text("  interrupted: partial results", style="bold yellow"))


def spec_decode_words(s: Summary) -> str | None:
    """Speculative-decoding acceptance over the level, from the server's counters (docs/metrics.md#spec-decode)."""
    sd = s.server.spec_decode if s.server is not None else None
    if sd is None:
        return None
    parts = []
    if sd.acceptance_rate is not None:
        parts.append(f"acceptance {sd.acceptance_rate * 100:.1f} %")
    if sd.accepted_tokens is not None and sd.drafted_tokens is not None:
        parts.append(f"{sd.accepted_tokens:,.0f} of {sd.drafted_tokens:,.0f} drafted tokens accepted")
    if sd.mean_accepted_length is not None:
        parts.append(f"{sd.mean_accepted_length:.2f} tokens per verification step")
    return "speculative decoding: " + (", ".join(parts) if parts else "no drafts counted")


def render_spec_decode(console: Console, levels: list[Summary]) -> None:
    for s in levels:
        words = spec_decode_words(s)
        if words:
            console.print(Text(f"  {s.tag} {words}", style="dim"))


def render_server_gauges(console: Console, levels: list[Summary]) -> None:
    """The server's KV-cache usage over each level, per series (one per rank or DP engine), never their sum
    (docs/metrics.md#server-gauges)."""
    from servelab.bench.server_metrics import gauge_words

    for s in levels:
        kv = s.server.gauges.get("kv_usage") if s.server is not None else None
        if kv and "mean" in kv and "max" in kv:
            console.print(Text(f"  {s.tag} server KV-cache usage {gauge_words(kv)}", style="dim"))


BUSY_MARK = "⚠busy"
GPU_MARK = "⚠gpu"  # another process on the engine's GPUs, throttling or an XID error (docs/metrics.md#gpu-contended)


def level_cell(s: Summary) -> str:
    """The level's tag, marked when the machine was contended during it (docs/metrics.md#contended) or its GPUs
    were (docs/metrics.md#gpu-contended)."""
    marks = [mark for mark, on in ((BUSY_MARK, s.environment is not None and s.environment.contended),
                                   (GPU_MARK, s.gpu is not None and s.gpu.contended)) if on]
    return " ".join([s.tag, *marks])


def sig(value: float | None) -> str:
    """A figure whose size is not known in advance (J/token is 0.05 on one GPU, 30 on another) with about three
    significant digits, never in exponent notation: 1,234 / 45.6 / 3.16 / 0.0512."""
    if value is None:
        return "–"
    size = abs(value)
    if size >= 100:
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 1 or value == 0:
        return f"{value:.2f}"
    return f"{value:#.3g}"


def gpu_reason(reason: str | None) -> str:
    """A GPU summary's reason as shown after "not measured: "."""
    return (reason or "unknown").removeprefix("not measured: ")


def render_gpu(console: Console, levels: list[Summary]) -> None:
    """What the GPUs did per level (docs/metrics.md#gpu): energy per token, tokens per joule, power and SM
    activity summed over the engine's GPUs, then each GPU at the level of highest throughput. When no level was
    measured, one line says why instead of a table of blanks; levels from before GPU telemetry say nothing."""
    with_gpu = [s for s in levels if s.gpu is not None]
    measured = [s for s in with_gpu if s.gpu.measured]
    if not measured:
        if with_gpu:
            reasons = dict.fromkeys(gpu_reason(s.gpu.reason) for s in with_gpu)
            console.print(Text(f"  GPU: not measured: {'; '.join(reasons)}", style="dim"))
        return
    answers = any(s.gpu.j_per_answer_token is not None and s.gpu.answer_tokens != s.gpu.output_tokens
                  for s in measured)
    rows = []
    for s in measured:
        g = s.gpu
        rows.append([level_cell(s), sig(g.j_per_output_token)] + ([sig(g.j_per_answer_token)] if answers else [])
                    + [sig(g.output_tokens_per_j), fmt(g.power_w_mean, 0), fmt(g.power_w_max, 0),
                       fmt(g.sm_active_pct_mean, 0), _pct(g.idle_share), str(sum(1 for d in g.gpus if d.engine))])
    cols = ([key_col("level"), Col("J/token\noutput")] + ([Col("J/token\nanswer")] if answers else [])
            + [Col("tok/J"), Col("power W\nmean"), Col("power W\npeak"), Col("SM\nact. %"), Col("idle\n%"),
               Col("GPUs")])
    sources = dict.fromkeys(f"{s.gpu.source} every {s.gpu.interval_s:g} s" if s.gpu.interval_s else
                            str(s.gpu.source) for s in measured)
    print_table(console, inert(f"GPUs (the engine's, summed; {', '.join(sources)})"), cols, rows)
    for s in with_gpu:
        if not s.gpu.measured:
            console.print(Text(f"  {s.tag} GPU: not measured: {inert(gpu_reason(s.gpu.reason))}", style="dim"))
    top = max(measured, key=lambda s: _value(s.figures, "output_tok_s") or 0.0)
    if len(top.gpu.gpus) > 1 or len(measured) == 1:
        render_gpu_devices(console, top)
    notes: dict[str, list[str]] = {}  # each note once, with the levels it holds for
    for s in measured:
        for note in s.gpu.notes:
            notes.setdefault(note, []).append(s.tag)
    for note, tags in notes.items():
        where = "every level" if len(tags) == len(measured) > 1 else ", ".join(tags)
        console.print(Text(f"  GPU note ({inert(where)}): {inert(note)}", style="dim"))


def render_gpu_devices(console: Console, s: Summary) -> None:
    """Each GPU of one level: power, SM activity, memory, throttling, temperature, other processes on it."""
    rows = []
    for d in s.gpu.gpus:
        rows.append([str(d.gpu) + ("" if d.engine else " (not the engine's)"), fmt(d.power_w_mean, 0),
                     fmt(d.power_w_max, 0), fmt(d.sm_active_pct_mean, 0), _pct(d.idle_share),
                     human_bytes(d.mem_used_bytes_max), fmt(d.throttle_s, 1), fmt(d.temp_c_max, 0),
                     ", ".join(str(p) for p in d.other_pids) or "–"])
    print_table(console, inert(f"{s.tag}: per GPU" + (f" ({s.gpu.gpus[0].name})" if s.gpu.gpus[0].name else "")),
                [key_col("GPU"), Col("power W\nmean"), Col("power W\npeak"), Col("SM\nact. %"), Col("idle\n%"),
                 Col("memory\nmax"), Col("throttle\ns"), Col("temp\n°C max"), Col("other\npids")], rows)


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


# Headline keys as a person reads them (the keys stay in JSON, CSV and --baseline; docs/metrics.md).
FIGURE_LABELS = {
    "single.decode_tok_s": "single-stream decode tok/s (p50)",
    "single.output_tok_s": "single-stream output tok/s",
    "single.ttft_ms": "single-stream TTFT ms (p50)",
    "single.itl_ms": "single-stream ITL ms (p50)",
    "single.tpot_ms": "single-stream TPOT ms",
    "single.e2e_ms": "single-stream end-to-end latency ms",
    "single.ttfo_ms": "single-stream time to first answer token ms",
    "single.answer_tok_s": "single-stream answer tok/s",
    "single.reasoning_tokens": "single-stream reasoning tokens per request",
    "single.answer_tokens": "single-stream answer tokens per request",
    "single.reasoning_share": "single-stream reasoning share of output tokens",
    "peak.output_tok_s": "peak output tok/s",
    "peak.concurrency": "concurrency at peak",
    "peak.rate": "request rate at peak",
    "peak.request_s": "requests/s at peak",
    "peak.answer_tok_s": "answer tok/s at peak",
    "slo.goodput_req_s": "goodput req/s (SLO search)",
    "single.items_s": "single-stream items/s",
    "single.input_tok_s": "single-stream input tok/s",
    "peak.items_s": "peak items/s",
    "peak.e2e_ms": "request latency ms (p50) at peak items/s",
}
# How tokens were counted, in words (records.CountMethod).
COUNTED_BY_WORDS = {"server_per_chunk": "the server's count on every chunk",
                    "client_tokenizer": "the client's tokenizer", "chunk_count": "one per chunk (approximate)",
                    "mixed": "mixed methods"}
_HEADLINE_LABELS = {k: FIGURE_LABELS[k] for k in ("single.decode_tok_s", "single.output_tok_s", "single.ttft_ms",
                                                  "single.itl_ms", "peak.output_tok_s", "peak.request_s",
                                                  "single.items_s", "peak.items_s", "peak.e2e_ms")}


def figure_label(key: str) -> str:
    """A headline key in words: "single.decode_tok_s" -> "single-stream decode tok/s (p50)"."""
    if key in FIGURE_LABELS:
        return FIGURE_LABELS[key]
    scope, _, name = key.partition(".")
    words = name.replace("_tok_s", " tok/s").replace("_req_s", " req/s").replace("_ms", " ms").replace("_", " ")
    return {"single": "single-stream ", "peak": "peak ", "slo": ""}.get(scope, f"{scope} ") + words


def render_headline(console: Console, headline: dict[str, Figure], title: str = "summary",
                    not_representative: bool = False) -> None:
    rows = []
    for key, label in _HEADLINE_LABELS.items():
        fig = headline.get(key)
        if fig is None:
            continue
        rows.append([label, fmt(fig.value, 2 if fig.unit == "req/s" else 1),
                     ", ".join(x for x in (fig.counted_by, fig.note) if x)])
    if rows:  # a trace replay has no headline figures: no empty table
        print_table(console, inert(title), [text_col("figure"), Col("value"), text_col("counted by / note")],
                    rows)
    if not_representative:
        console.print(Text("NOT REPRESENTATIVE: a serious configuration finding applies to these numbers",
                           style="bold red reverse"))


def level_line(s: Summary) -> str:
    rate = ("tok/s not measured (too short for a steady state)" if s.steady is not None and not s.steady.measured
            else f"{fmt(s.figures['output_tok_s'].value)} tok/s")
    line = f"{s.tag}: {rate}, {sent_cell(s, ' ok')}, TTFT p50 {fmt(s.figures['ttft_ms'].value, 0)} ms"
    sd = s.server.spec_decode if s.server is not None else None
    if sd is not None and sd.acceptance_rate is not None:
        line += f", spec-decode acceptance {sd.acceptance_rate * 100:.0f} %"
    gpu = s.gpu
    if gpu is not None and gpu.measured and gpu.j_per_output_token is not None:  # docs/metrics.md#gpu
        line += f", {sig(gpu.j_per_output_token)} J/token at {fmt(gpu.power_w_mean, 0)} W"
    return line


def render_reasoning(console: Console, levels: list[Summary]) -> None:
    """Reasoning and answer apart, per level, when any reasoning was seen (docs/metrics.md#reasoning): mean
    tokens per request of each, the reasoning share of the output, and answer tok/s beside output tok/s."""
    from servelab.bench.metrics import saw_reasoning

    if not saw_reasoning(levels):
        return
    rows = []
    for s in levels:
        f = s.figures
        share = f["reasoning_share"].value if "reasoning_share" in f else None
        rows.append([s.tag, fmt(_value(f, "reasoning_tokens")), fmt(_value(f, "answer_tokens")),
                     "–" if share is None else f"{share * 100:.0f} %", fmt(_value(f, "answer_tok_s")),
                     fmt(_value(f, "output_tok_s")), fmt(_value(f, "ttfo_ms"), 0)])
    print_table(console, "reasoning and answer tokens",
                [key_col("level"), Col("reasoning\ntok/req"), Col("answer\ntok/req"), Col("reasoning\n%"),
                 Col("answer\ntok/s"), Col("output\ntok/s"), Col("TTFO\nms p50")], rows)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:.0f} %"


def render_cache(console: Console, levels: list[Summary]) -> None:
    """The engine's prefix cache per level when it reported cached prompt tokens (docs/metrics.md#cache), and per
    turn for multi-turn levels: how much of each prompt it served from cache, and what that did to TTFT."""
    cached = [s for s in levels if "cache_hit_ratio" in s.figures]
    if cached:
        rows = []
        for s in cached:
            f, implied = s.figures, s.load.get("implied_cache_hit_ratio") if s.load else None
            rows.append([s.tag, _pct(f["cache_hit_ratio"].value), _pct(implied), fmt(_value(f, "cached_tokens")),
                         fmt(_value(f, "ttft_cached_ms"), 0), fmt(_value(f, "ttft_uncached_ms"), 0)])
        print_table(console, "prefix cache (as the engine reported it)",
                    [key_col("level"), Col("hit\nratio"), Col("trace\nimplies"), Col("cached\ntok/req"),
                     Col("TTFT ms p50\ncached"), Col("TTFT ms p50\nuncached")], rows)
    for s in levels:
        if not s.turns:
            continue
        rows = [[str(t.turn), str(t.requests), fmt(t.prompt_tokens_mean, 0), fmt(t.cached_tokens_mean, 0),
                 _pct(t.cached_share), fmt(t.ttft_ms.p50 if t.ttft_ms else None, 0),
                 fmt(t.ttft_ms.p99 if t.ttft_ms else None, 0)] for t in s.turns]
        print_table(console, f"{s.tag}: by turn", [key_col("turn"), Col("ok"), Col("prompt\ntokens"),
                                                   Col("cached\ntokens"), Col("cached\n%"), Col("TTFT\nms p50"),
                                                   Col("TTFT\nms p99")], rows)


def render_answers(console: Console, levels: list[Summary]) -> None:
    """Tool calls and structured output per level, where requests declared tools or asked for a format
    (docs/metrics.md#tool-calls, #structured-output): how soon calls came, and how many a client could use."""
    keys = ("tool_first_ms", "tool_call_ms", "tool_call_share", "tool_parse_share", "tool_valid_share",
            "schema_valid_share")
    shown = [s for s in levels if any(k in s.figures for k in keys)]
    if not shown:
        return
    rows = [[s.tag, fmt(_value(s.figures, "tool_first_ms"), 0), fmt(_value(s.figures, "tool_call_ms"), 0)]
            + [_pct(_value(s.figures, k)) for k in keys[2:]] for s in shown]
    print_table(console, "tool calls and structured output",
                [key_col("level"), Col("first tool\nms p50"), Col("call done\nms p50"), Col("called\n%"),
                 Col("parse\n%"), Col("valid\n%"), Col("schema\nvalid %")], rows)


def render_images(console: Console, levels: list[Summary]) -> None:
    """Chat with images, per level that sent any (docs/metrics.md#images): by image count and size, the requests'
    TTFT and the prompt the server counted, so what an image costs in prefill reads off the rows."""
    for s in levels:
        if not s.images:
            continue
        rows = []
        for g in s.images:
            row: list = image_group_cells(g)
            row[1] = inert(row[1])  # the sizes column, printed inert as before
            rows.append(row)
        print_table(console, f"{s.tag}: by image count and size",
                    [key_col("images"), Col("sizes"), Col("MP per\nrequest"), Col("ok"), Col("failed"),
                     Col("prompt\ntokens"), Col("TTFT\nms p50"), Col("TTFT\nms p99")], rows)


def image_group_cells(g) -> list[str]:
    """One image group as the terminal and the HTML report show it: images, sizes, MP per request, ok, failed,
    prompt tokens (mean), TTFT ms p50 and p99."""
    return [str(g.images), sizes_cell(g.sizes), fmt(g.megapixels, 3), str(g.requests), str(g.failed),
            fmt(g.prompt_tokens_mean, 0), fmt(g.ttft_ms.p50 if g.ttft_ms else None, 0),
            fmt(g.ttft_ms.p99 if g.ttft_ms else None, 0)]


def sizes_cell(sizes: str | None) -> str:
    """ "1024x768,1024x768" as "2 × 1024x768"; "–" without images or for groups by count alone."""
    if not sizes:
        return "–"
    each = sizes.split(",")
    return f"{len(each)} × {each[0]}" if len(set(each)) == 1 and len(each) > 1 else ", ".join(each)


def _value(figures: dict[str, Figure], key: str) -> float | None:
    fig = figures.get(key)
    return fig.value if fig is not None else None
